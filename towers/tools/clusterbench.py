"""`towers bench --cluster-mode M --workers 1,2`: a cluster of local processes against one.

For each worker count n, `towers launch --workers n` trains on this machine
with T towers per task, and one process trains with n*T towers: the same
towers, the same global batch, the same steps. Every configuration runs in
turns, round after round, so the ratios compare runs made side by side on a
shared machine. Each run's figure is the chief's images/sec after its warm-up
steps; a row is the mean ± standard error over the rounds.

On one machine this measures what the runtime costs (gRPC, serialising
tensors, the processes' start), not a speed-up: the tasks share the same
cores. The bytes each step sends between tasks are the model's: in-graph, as
`towers explain --workers n` counts them from the real partitions (the
variables read and the gradients sent back by every task but the one holding
them, and the fed slices); collective, the ring all-reduce's 2(n-1)/n * S per
worker for S bytes of gradients; parameter-server, each worker's S of
gradients pushed and S of variables read (once, whatever its towers).

Every run trains in the one --precision (and --loss-scale) of the bench: the
train flags pass them on. The variables and so the gradients stay float32 in
every precision, so S does not change with it.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import tensorflow as tf

from towers.errors import TowersError
from towers.names import CLUSTER_MODES
from towers.tools.bench import mean_stderr
from towers.tools.explain import bytes_text
from towers.tools.plan import bytes_between_tasks, model_sizes

tf1 = tf.compat.v1

_RATE = re.compile(r'trained to step \d+: ([\d.]+) images/sec after warm-up')


def gradient_bytes(model_fn, input_shape):
    """S: the bytes of the model's trainable variables (and so of one gradient)."""
    return sum(model_sizes(model_fn, input_shape))


def between_tasks(mode, workers, size, explained=None, towers=1, ps=0):
    """Bytes sent between tasks per step, and how they are known."""
    facts = CLUSTER_MODES[mode]
    if workers == 1 and facts.copy_per_worker:
        return 0, 'one task'
    if facts.one_graph:
        return explained, 'counted by explain'
    how = 'ring: 2(n-1)/n*S per worker' if facts.copy_per_worker else \
        'per worker: S read, S pushed'
    return bytes_between_tasks(mode, workers, [size], towers, ps), how


def run_cluster_bench(mode, worker_counts, train_flags, towers=1, ps=0, rounds=3,
                      log=print, timeout=600):
    """Time every configuration in turns; print and return the table's rows.

    Args:
      mode: the --cluster-mode.
      worker_counts: e.g. [1, 2].
      train_flags: the train flags every run shares (model, batch, input, steps...).
      towers: towers per task; one process has workers*towers.
      ps: ps tasks of each cluster (parameter-server mode needs one or more).
    Returns:
      list of dicts: config, workers, mean, stderr, vs_one_process.
    """
    if CLUSTER_MODES[mode].needs_ps and ps < 1:
        raise TowersError('{cluster_mode} %s needs {ps} of at least 1' % mode)
    if rounds < 2:
        raise TowersError('{rounds} must be at least 2 for a standard error')
    configs = []
    for n in worker_counts:
        configs.append(('one process, %d tower(s)' % (n * towers), n,
                        ['train', '--towers', str(n * towers)] + list(train_flags)))
        configs.append(('%d worker(s) x %d tower(s)' % (n, towers) + (', %d ps' % ps if ps
                                                                         else ''), n,
                        ['launch', '--workers', str(n), '--ps', str(ps), '--grace', '5', '--',
                         'train', '--cluster-mode', mode, '--towers', str(towers)]
                        + list(train_flags)))
    rates = [[] for _ in configs]
    for round_index in range(rounds):
        for i, (name, _, command) in enumerate(configs):
            rates[i].append(_rate(command, timeout))
            log('round %d/%d: %s: %.1f images/sec' % (round_index + 1, rounds, name,
                                                       rates[i][-1]))
    rows = []
    for (name, n, command), values in zip(configs, rates):
        mean, stderr = mean_stderr(values)
        rows.append({'config': name, 'workers': n, 'cluster': command[0] == 'launch',
                     'mean': mean, 'stderr': stderr})
    for row in rows:
        reference = next(r for r in rows if r['workers'] == row['workers'] and not r['cluster'])
        row['vs_one_process'] = row['mean'] / reference['mean']
    return rows


def table_lines(rows, mode, size, explained, towers=1, ps=0):
    """The table: images/sec, the ratio to one process, the bytes between tasks."""
    lines = ['%-32s %-18s %-15s %s' % ('configuration', 'images/sec', 'vs one process',
                                       'between tasks per step')]
    for row in rows:
        moved = '-'
        if row['cluster']:
            size_moved, how = between_tasks(mode, row['workers'], size,
                                            explained.get(row['workers']), towers, ps)
            moved = '%s (%s)' % (bytes_text(size_moved), how)
        lines.append('%-32s %-18s %-15s %s' % (
            row['config'], '%.1f ± %.1f' % (row['mean'], row['stderr']),
            '%.3f' % row['vs_one_process'], moved))
    return lines


def explained_bytes(workers, ps, towers, explain_flags, timeout=300):
    """{n: bytes between tasks per step} of in-graph over n workers, by `towers explain`."""
    out = {}
    for n in workers:
        if n > 1 or ps:
            report = json.loads(run_towers(['explain', '--workers', str(n), '--ps', str(ps),
                                         '--towers', str(towers), '--json'] + explain_flags,
                                        timeout))
            out[n] = report['bytes_between_tasks']
    return out


def _rate(command, timeout):
    """The chief's (or the one process's) images/sec after warm-up, from its run."""
    return rate_in(run_towers(command, timeout), command)


def rate_in(output, command):
    """The chief's (or the one process's) images/sec after warm-up, from the output of
    `towers COMMAND`."""
    for line in reversed(output.splitlines()):
        match = _RATE.search(line)
        if match and (line.startswith('[worker 0] ') or not line.startswith('[')):
            return float(match.group(1))
    raise TowersError('no images/sec from `towers %s`: give more {window} steps'
                      % ' '.join(command[:2]))


def run_towers(command, timeout):
    """Run `python -m towers COMMAND` to its end; its output, or TowersError naming the failure.

    A `towers launch` keeps its tasks' logs in a folder of the bench's: removed once the run
    has finished (its output holds what the bench reads), kept where it failed and named in
    the error, for the user to read why.
    """
    shown, argv, logs = ' '.join(command[:3]), list(command), None
    if command[0] == 'launch' and '--logs' not in command:
        logs = tempfile.mkdtemp(prefix='towers-bench-')
        argv[1:1] = ['--logs', logs]
    try:
        process = subprocess.run([sys.executable, '-m', 'towers'] + argv,
                                 capture_output=True, text=True, timeout=timeout,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    except subprocess.TimeoutExpired:
        raise TowersError('`towers %s` did not finish within %d s%s'
                          % (shown, timeout, _kept(logs))) from None
    if process.returncode:
        last = (process.stderr.strip() or process.stdout.strip()).splitlines()[-1:]
        raise TowersError('`towers %s` failed (status %d): %s%s'
                          % (shown, process.returncode, ' '.join(last), _kept(logs)))
    if logs is not None:
        shutil.rmtree(logs, ignore_errors=True)
    return process.stdout


def _kept(logs):
    return '' if logs is None else ' (task logs in %s)' % logs
