"""Where the suite's CPU goes: each test's CPU seconds, its own and its child processes'.

`--durations` gives each test's wall time, which on two busy cores says little: a test that
waits on a process it started shows the wait, not the process's CPU, and the other worker's
load stretches everything. The suite is CPU-bound on 2 cores (issue 39: 1,493 CPU-s in 823 s
of wall), so what to make smaller is what costs CPU. As a pytest plugin this module records,
around each test, getrusage of the worker itself and of the children it has waited for (a
`towers launch` counts its tasks, which it waits for), and the runs the worker's fork server
forked for it (tests/faults/runs.py); as a command it sums the records.
tests/conftest.py loads the hook, so any run of the suite is metered when asked:

    TOWERS_CPU_METER=/tmp/meter python -m pytest -n 2 tests   # or: ... bash .ci/run
    python -m tests.cpu_meter /tmp/meter          # by file, then the 30 costliest tests

Each worker appends to a file of its own (cpu.PID.jsonl), one JSON line per test.
"""
import collections
import glob
import json
import os
import resource
import sys
import time

import pytest


def _cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = os.environ.get('TOWERS_CPU_METER')
    if not folder:
        yield
        return
    start = (time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN),
             _forked())
    yield
    forked = _forked()
    record = {'test': item.nodeid, 'wall': time.monotonic() - start[0],
              'self': _cpu(resource.RUSAGE_SELF) - start[1],
              'children': (_cpu(resource.RUSAGE_CHILDREN) - start[2]
                           + (forked[0] - start[3][0]) - (forked[1] - start[3][1]))}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'cpu.%d.jsonl' % os.getpid()), 'a') as f:
        f.write(json.dumps(record) + '\n')


def _forked():
    """(CPU-s of the runs the fork server forked and that ended, of those its end has
    reaped): a run's CPU is its test's, not the CPU of the test that ends the server."""
    runs = sys.modules.get('tests.faults.runs')
    return (runs.FORKED_CPU['ended'], runs.FORKED_CPU['reaped']) if runs else (0.0, 0.0)


def read(folder):
    """Every record under folder, from every worker."""
    records = []
    for path in sorted(glob.glob(os.path.join(folder, 'cpu.*.jsonl'))):
        with open(path) as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def by_file(records):
    """[(file, tests, wall, self, children)], the costliest in CPU first."""
    sums = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for record in records:
        row = sums[record['test'].split('::')[0]]
        row[0] += 1
        row[1] += record['wall']
        row[2] += record['self']
        row[3] += record['children']
    return sorted(((name,) + tuple(row) for name, row in sums.items()),
                  key=lambda row: (-(row[3] + row[4]), row[0]))


def report(records, top=30):
    """The lines `python -m tests.cpu_meter` prints."""
    own, children = (sum(r[k] for r in records) for k in ('self', 'children'))
    lines = ['%d tests: %.0f CPU-s in the workers, %.0f in their child processes'
             % (len(records), own, children),
             '%8s %8s %8s %5s  %s' % ('CPU-s', 'own', 'children', 'tests', 'file')]
    lines += ['%8.1f %8.1f %8.1f %5d  %s' % (own + kids, own, kids, count, name)
              for name, count, _, own, kids in by_file(records)]
    costliest = sorted(records, key=lambda r: (-(r['self'] + r['children']), r['test']))
    lines += ['', '%8s %8s %8s  %s' % ('CPU-s', 'own', 'children', 'test')]
    lines += ['%8.1f %8.1f %8.1f  %s' % (r['self'] + r['children'], r['self'], r['children'],
                                         r['test']) for r in costliest[:top]]
    return lines


if __name__ == '__main__':
    print('\n'.join(report(read(sys.argv[1]))))
