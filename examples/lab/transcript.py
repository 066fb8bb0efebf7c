"""The lab sheet's outputs, run again: every ```console block of examples/lab/README.md starts with
`$ COMMAND` and shows what the command printed. This runs each command and compares, or
(--write) writes what it printed into the sheet.

    python examples/lab/transcript.py           # compare: one line per block, exit 1 if any differs
    python examples/lab/transcript.py --write   # the sheet's outputs from this machine's runs

What may differ between two runs, or two machines, is masked before comparing: times and rates
(s, ms, images/sec, x, a timed row's every figure), the machine's name, explain's step peak
(the order the ops ran in moves it), and rounding-sized
figures (below 1e-4 in e-notation, what float32 rounding leaves in check's differences). Every
other number must agree to 2% or 0.002 (a loss or an accuracy on another CPU's kernels), every word
exactly. Commands run in this process, from the repository's root: `towers ...` through
towers.cli.main, `python FILE ...` as a script.
"""
import contextlib
import io
import os
import re
import runpy
import shlex
import sys
import time

from towers.cli.main import use_onednn

# As `towers` starts, before anything here imports TensorFlow (a `python FILE` block first):
# oneDNN's kernels, whose fusions check's lines name, and TensorFlow's C++ logging quiet.
use_onednn()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHEET = os.path.join(ROOT, 'examples', 'lab', 'README.md')
BLOCK = re.compile(r'^```console\n\$ (?P<command>.+)\n(?P<output>(?:(?!```).*\n)*?)```$', re.M)
# A time or a rate: masked whole.
TIMING = re.compile(r'\d+(?:\.\d+)?(?:e-?\d+)?(?: ?± ?\d+(?:\.\d+)?)?'
                    r'(?= ?(?:s\b|ms\b|µs\b|images/sec|img/s|x\b|%))')
ROUNDING = re.compile(r'\d(?:\.\d+)?e-(?:0[5-9]|[1-9]\d)')
NUMBER = re.compile(r'-?\d+\.\d+')
# Which machine ran it: bench's "on AMD EPYC, 2 cores".
MACHINE = re.compile(r' on [^,;]+, \d+ cores')
# explain's step peak: the order the executor's threads ran the ops in moves it.
PEAK = re.compile(r'(?<=step peak )\d+(?:\.\d+)? [kMG]?B')


def blocks(text):
    """[(command, [output lines], (start, end) of the output in text)] of the sheet."""
    return [(m.group('command'), m.group('output').splitlines(), m.span('output'))
            for m in BLOCK.finditer(text)]


def run(command):
    """(exit status, [lines printed, stdout and stderr in order]) of one command, run here."""
    out = io.StringIO()
    argv = shlex.split(command)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            status = _run(argv)
    finally:
        os.chdir(cwd)
    return status, out.getvalue().splitlines()


def _run(argv):
    if argv[0] == 'towers':
        from towers.cli import main
        return main(argv[1:])
    if argv[0] == 'python' and argv[1].endswith('.py'):
        saved = sys.argv
        sys.argv = argv[1:]
        try:
            runpy.run_path(argv[1], run_name='__main__')
            return 0
        except SystemExit as e:
            return e.code or 0
        finally:
            sys.argv = saved
    raise ValueError('the lab runs `towers ...` and `python FILE.py ...`, not %r' % argv[0])


def masked(line):
    """The line with its times, rates, rounding-sized figures and machine as '#' (a timed row,
    a rate ± its error, with every figure as '#', its ratios too), its spaces as one (a table's
    columns widen with its figures)."""
    line = PEAK.sub('#', MACHINE.sub(' on #', line))
    line = NUMBER.sub('#', line) if '±' in line else ROUNDING.sub('#', TIMING.sub('#', line))
    return ' '.join(line.split())


def differs(expected, actual):
    """None where the outputs agree (masks applied, other numbers to 2%), else the first pair
    of lines that does not."""
    if len(expected) != len(actual):
        return 'printed %d lines, the sheet shows %d' % (len(actual), len(expected))
    for want, got in zip(expected, actual):
        want, got = masked(want), masked(got)
        if NUMBER.sub('#', want) != NUMBER.sub('#', got):
            return 'the sheet: %r\n    printed: %r' % (want, got)
        for a, b in zip(NUMBER.findall(want), NUMBER.findall(got)):
            if abs(float(a) - float(b)) > max(0.02 * max(abs(float(a)), abs(float(b))), 0.002):
                return 'the sheet: %r\n    printed: %r' % (want, got)
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    write = '--write' in argv
    with open(SHEET, encoding='utf-8') as f:
        text = f.read()
    failed, pieces, last = 0, [], 0
    for command, expected, (start, end) in blocks(text):
        began = time.time()
        _, actual = run(command)
        took = time.time() - began
        problem = differs(expected, actual)
        failed += problem is not None
        print('%-5s %5.1f s  %s%s' % ('same' if problem is None else 'DIFF', took, command,
                                      '' if problem is None else '\n    ' + problem))
        pieces += [text[last:start], ''.join(line + '\n' for line in actual)]
        last = end
    if write:
        with open(SHEET, 'w', encoding='utf-8') as f:
            f.write(''.join(pieces) + text[last:])
        return 0
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
