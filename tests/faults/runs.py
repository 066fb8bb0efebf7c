"""What the fault tests share: tiny runs, and what a logdir holds after a fault.

A run that a fault is done to from outside (kill -9, SIGSTOP) runs in a
process of its own (`Training`), its output read as it comes so that the
fault lands in the phase under test. Where no process has to die, the command
runs in this one through towers.cli.main (`towers`): TensorFlow is imported
once, not once per run, and the whole suite stays fast.
"""
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import tensorflow as tf

from towers import checkpoints
from towers.cli import main

tf1 = tf.compat.v1

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# PYTHONPATH: a run started with `-m tests.faults.killpoint` imports this repository's tests.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', PYTHONPATH=ROOT)
# A run of a few seconds: 54k parameters, 80 steps an epoch, no evaluation; on the CPU, GPU
# machines too, whose resumes are bit-exact only with --deterministic (tests/gpu has that).
TINY = ('--model', 'small_convnet', '--batch-size', '50', '--eval-every', '0', '--quiet',
        '--devices', 'cpu')
# What a logdir holds besides checkpoints, whatever happened to it.
KEPT = re.compile(r'^(\.towers\.lock|checkpoint|run\.json|stats\.jsonl|best|'
                  r'events\.out\.tfevents\..*)$')


class Training:
    """`python -m MODULE ARGV` in a process of its own, its output read line by line.

    A context manager: on leaving, a process still running is killed and
    reaped, whatever happened in the block.

    Args:
      argv: the command's arguments, e.g. ['train', '--logdir', ...].
      cwd: the folder it runs in.
      module: towers, or tests.faults.killpoint (which kills itself at a set moment).
      preexec_fn: passed to Popen (e.g. to drop capabilities).
    """

    def __init__(self, argv, cwd, module='towers', preexec_fn=None):
        self.process = subprocess.Popen(
            [sys.executable, '-m', module] + list(argv), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd, preexec_fn=preexec_fn)
        self.out, self.err, self._lines = [], [], queue.Queue()
        self._readers = [threading.Thread(target=self._read, args=args, daemon=True)
                         for args in ((self.process.stdout, self.out, True),
                                      (self.process.stderr, self.err, False))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines, announce):
        for line in stream:
            lines.append(line.rstrip('\n'))
            if announce:
                self._lines.put(lines[-1])
        if announce:
            self._lines.put(None)  # the output ended

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.kill()
        self.finish()
        return False

    @property
    def pid(self):
        return self.process.pid

    def wait_for_line(self, prefix, timeout=120):
        """The first line from now on that starts with prefix; AssertionError if none comes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError('no line %r within %ds; out: %s; err: %s'
                                     % (prefix, timeout, self.out[-5:], self.err[-5:])) from None
            if line is None:
                self.finish()
                raise AssertionError('the run ended (status %s) before printing %r; err: %s'
                                     % (self.process.returncode, prefix, self.err[-5:]))
            if line.startswith(prefix):
                return line

    def kill(self):
        """kill -9, and wait for the process to be gone; its status (-9)."""
        self.process.kill()
        return self.finish()

    def finish(self, timeout=120):
        """Wait for the process to end (at most timeout seconds); its exit status."""
        self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=timeout)
        return self.process.returncode


def towers(capsys, *argv):
    """Run `towers ARGV` in this process: (exit status, stdout lines, stderr lines)."""
    capsys.readouterr()
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.splitlines()


def wait_until(condition, timeout=120, what='the condition'):
    """Poll condition() every half millisecond until it is true; its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.0005)
    raise AssertionError('%s did not happen within %ds' % (what, timeout))


def listed(folder):
    """The checkpoints folder's state file lists, oldest first (names, not paths)."""
    state = tf1.train.get_checkpoint_state(folder)
    return [os.path.basename(p) for p in state.all_model_checkpoint_paths] if state else []


def variables(checkpoint):
    """{name: numpy value} of every variable in the checkpoint (each read back whole)."""
    reader = tf1.train.NewCheckpointReader(checkpoint)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def assert_whole(folder):
    """Every checkpoint the state file lists has its three files and reads back; their names."""
    names = listed(folder)
    for name in names:
        for suffix in ('.index', '.meta', '.data-00000-of-00001'):
            assert os.path.isfile(os.path.join(folder, name + suffix)), (name, suffix)
        variables(os.path.join(folder, name))
    return names


def leftovers(folder):
    """What is in folder that neither a listed checkpoint nor a run's own file is (sorted)."""
    whole = {name + suffix for name in listed(folder)
             for suffix in ('.index', '.meta', '.data-00000-of-00001')}
    return sorted(name for name in os.listdir(folder) if name not in whole and not KEPT.match(name))


def to_be_removed(folder):
    """What the next run removes from folder (logdir.remove_unfinished): its leftovers,
    but a whole checkpoint that is not newer than the newest listed one (any whole
    one, when none is listed: a first save killed before its listing) stays."""
    steps = [int(name.rsplit('-', 1)[1]) for name in listed(folder)]
    kept = []
    for name in leftovers(folder):
        stem = re.match(r'(model\.ckpt-(\d+))\.(index|meta|data-00000-of-00001)$', name)
        prefix = stem and os.path.join(folder, stem.group(1))
        if stem and (not steps or int(stem.group(2)) < max(steps)) \
                and os.path.isfile(prefix + '.meta') and checkpoints.reads_back(prefix):
            continue
        kept.append(name)
    return kept


def assert_same_variables(expected, actual):
    """Bit for bit: the same variable names, each np.array_equal."""
    assert sorted(actual) == sorted(expected)
    differ = [name for name in expected if not np.array_equal(expected[name], actual[name])]
    assert differ == [], 'these variables differ from the uninterrupted run: %s' % differ


def holder_line(logdir, pid, command):
    """A regular expression for LogdirLock's refusal naming process pid running command."""
    return re.compile(r'^towers: error: --logdir %s is in use by process %d \(%s\) on %s since '
                      r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d: wait for that run to end, or choose '
                      r'another folder$' % (re.escape(logdir), pid, re.escape(command),
                                            re.escape(socket.gethostname())))
