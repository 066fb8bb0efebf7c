"""What the fault tests share: tiny runs, and what a logdir holds after a fault.

A run that a fault is done to from outside (kill -9, SIGSTOP, a signal) runs in
a process of its own, its output read as it comes so that the fault lands in
the phase under test. Where no process has to die, the command runs in this one
through towers.cli.main (`towers`): TensorFlow is imported once, not once per
run, and the whole suite stays fast. A process of its own is started by `Forks`
(each pytest worker has one: the `forks` fixture of tests/conftest.py) as a
fork of one process that has imported TensorFlow already: a process of its own
all the same (its pid, its files and lock, its kill -9, its exit status),
without the ~5 s of CPU each start of TensorFlow costs.
"""
import ctypes
import gc
import json
import os
import queue
import re
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
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


class _Read:
    """A run's output read line by line as it comes (out, err); wait_for_line.

    A context manager: on leaving, a process still running is killed and
    reaped, whatever happened in the block.
    """

    def _read_from(self, stdout, stderr):
        self.out, self.err, self._lines = [], [], queue.Queue()
        self._readers = [threading.Thread(target=self._read, args=args, daemon=True)
                         for args in ((stdout, self.out, True), (stderr, self.err, False))]
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
        if self._running():
            self._kill()
        self.finish()
        return False

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
                status = self.finish()
                raise AssertionError('the run ended (status %s) before printing %r; err: %s'
                                     % (status, prefix, self.err[-5:]))
            if line.startswith(prefix):
                return line

    def kill(self):
        """kill -9, and wait for the process to be gone; its status (-9)."""
        self._kill()
        return self.finish()

    def send_signal(self, signum):
        """signum to the process (it may be gone already)."""
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def finish(self, timeout=120):
        """Wait for the process to end (at most timeout seconds); its exit status."""
        status = self._wait(timeout)
        for reader in self._readers:
            reader.join(timeout=timeout)
        return status


# CPU seconds of the forked runs that ended so far, and of those among them now counted as
# this process's children's too (their server reaped): tests/cpu_meter.py counts each run's
# CPU in the test that started it, not in the one that ended the server.
FORKED_CPU = {'ended': 0.0, 'reaped': 0.0}

# The fork server: `python -c` this, with one end of a socket pair as its argument.
_SERVE = ("import importlib, sys; importlib.import_module('towers.cli.main')._import_tensorflow(); "
          "from tests.faults import runs; runs._serve(int(sys.argv[1]))")


class Forks:
    """Starts `python -m MODULE ARGV` runs, one at a time, each a fork of one process (the
    server) that imported TensorFlow as `towers` does, before any graph or session.

    Each run is a process of its own: its pid, its folder, its output, its
    lock on the logdir, its own kill -9 and exit status; what it did not do
    itself is start TensorFlow, ~5 s of CPU a process on this suite's 2-core
    machines. A context manager: on leaving, the server ends and is reaped,
    and with it the CPU of every run it forked is counted as this process's
    children's (FORKED_CPU has each run's as it ends, for tests/cpu_meter.py).
    """

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Its own stderr, read only when it failed (no run writes there: each has its pipes).
        self._stderr = tempfile.TemporaryFile()
        with theirs:
            self._server = subprocess.Popen(
                [sys.executable, '-c', _SERVE, str(theirs.fileno())], env=ENV, cwd=ROOT,
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self._stderr)
        self._socket, self._runs, self._ended = ours, [], {}

    def training(self, argv, cwd, module='towers', env=None):
        """A Forked run of `python -m MODULE ARGV` in cwd, with env's variables set over the
        server's environment (a value of None unsets one).

        argv: the command's arguments, e.g. ['train', '--logdir', ...]; module: towers, or
        tests.faults.killpoint (which kills itself at a set moment), or a test module run as
        a script."""
        self._runs.append(Forked(self, list(argv), str(cwd), module, env or {}))
        return self._runs[-1]

    def run(self, argv, cwd, module='towers', env=None, timeout=120):
        """`python -m MODULE ARGV` forked, to its end: (status, stdout lines, stderr lines)."""
        with self.training(argv, cwd, module, env) as run:
            status = run.finish(timeout)
        return status, run.out, run.err

    def _request(self, message, fds=()):
        socket.send_fds(self._socket, [json.dumps(message).encode()], list(fds))

    def _started(self):
        """The pid of the run just asked for (statuses of others that end meanwhile kept)."""
        return self._answer_for('started', timeout=300)  # the server's start, the first time

    def _status(self, pid, timeout):
        """pid's exit status, once it ends (at most timeout seconds from now)."""
        return self._answer_for(pid, timeout)

    def _answer_for(self, pid, timeout):
        deadline = time.monotonic() + timeout
        while pid not in self._ended:
            ended, status, *cpu = self._answer(max(0.0, deadline - time.monotonic()))
            self._ended[ended] = status
            FORKED_CPU['ended'] += sum(cpu)
        return self._ended.pop(pid)

    def _answer(self, timeout):
        self._socket.settimeout(timeout)
        try:
            message = self._socket.recv(4096)
        except socket.timeout:
            raise AssertionError('the fork server did not answer within %ds' % timeout) from None
        if not message:
            self._server.wait(timeout=timeout)
            self._stderr.seek(0)
            raise AssertionError('the fork server ended (status %s): %s' % (
                self._server.returncode, self._stderr.read().decode(errors='replace')[-2000:]))
        return json.loads(message)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for run in self._runs:
            if run.status is None:
                run.kill()
        self._socket.close()  # the server's end reads as ended: it returns
        self._server.wait(timeout=120)
        FORKED_CPU['reaped'] = FORKED_CPU['ended']  # now this process's children's too
        self._stderr.close()
        return False


class Forked(_Read):
    """A run Forks started, its output read line by line (see Forks)."""

    def __init__(self, forks, argv, cwd, module, env):
        self._forks, self.status = forks, None
        out, err = os.pipe(), os.pipe()
        forks._request([argv, cwd, module, env], (out[1], err[1]))
        os.close(out[1])
        os.close(err[1])
        self._streams = open(out[0]), open(err[0])
        self._read_from(*self._streams)
        self.pid = forks._started()

    def _running(self):
        return self.status is None

    def _kill(self):
        if self.pid in self._forks._ended:
            return  # it ended: its status is said, not read yet
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it ended and the server reaped it: its status is on its way

    def _wait(self, timeout):
        if self.status is None:
            self.status = self._forks._status(self.pid, timeout)
        return self.status

    def finish(self, timeout=120):
        status = super().finish(timeout)
        for stream in self._streams:
            stream.close()
        return status


def _serve(fd):
    """The fork server's loop: fork each run asked for and say its pid ('started'), and say
    each run's exit status and CPU seconds as it ends ([pid, status, cpu]); runs overlap as
    their tests ask.

    Ends when the socket does (the tests' end of it closed). In the fork,
    `python -m MODULE ARGV` goes on from here, its stdout and stderr the
    pipes it was sent, and ends as any Python process does (atexit, its
    threads joined), with its status.
    """
    _die_with_parent()
    requests = socket.socket(fileno=fd)
    # A run's end wakes the loop: SIGCHLD writes a byte to `woken` (signal.set_wakeup_fd).
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    running = []
    while True:
        ready = select.select([requests, woken], [], [])[0]
        if woken in ready:
            os.read(woken, 4096)
        for pid in list(running):
            ended, status, usage = os.wait4(pid, os.WNOHANG)
            if ended:
                running.remove(pid)
                requests.send(json.dumps([pid, os.waitstatus_to_exitcode(status),
                                          usage.ru_utime + usage.ru_stime]).encode())
        if requests not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(requests, 1 << 16, 2)
        if not message:
            return
        argv, cwd, module, env = json.loads(message)
        # The run's collector leaves what it inherited alone (gc.freeze, Python's advice for a
        # fork without exec): its passes, and the interpreter's at exit, walked all of
        # TensorFlow's objects, writing to each page the run shares with the server (a
        # `towers train --model nope` run: 1.2 to 1.4 CPU-s, 0.3 to 0.5 frozen).
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for own in (requests.detach(), woken, wake):
                os.close(own)
            for stream, pipe in zip((1, 2), fds):
                os.dup2(pipe, stream)
                os.close(pipe)
            os.chdir(cwd)
            for name, value in env.items():  # None: unset
                os.environ.pop(name, None) if value is None else os.environ.update({name: value})
            sys.argv = [module] + argv  # runpy writes the module's file into sys.argv[0]
            runpy.run_module(module, run_name='__main__', alter_sys=True)
            sys.exit(0)
        running.append(pid)
        for pipe in fds:
            os.close(pipe)
        requests.send(json.dumps(['started', pid]).encode())


def _die_with_parent():
    """SIGKILL this process when its parent ends (PR_SET_PDEATHSIG): a pytest worker killed
    leaves no server behind, nor a run the server was waiting for."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


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
