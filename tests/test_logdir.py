"""One run per logdir: LogdirLock in this process, and runs beside a real holder process refused.

A second `towers train` on a logdir in use is refused with one line naming
the process that holds it, and changes nothing there; the lock dies with its
holder, kill -9 included, so a crash never leaves a stale lock in the way of
the resume; `eval` and `export` read the newest complete checkpoint of a
logdir in use, and say so.
"""
import fcntl
import json
import os
import signal
import socket
import time

import pytest
import tensorflow as tf

from tests.faults.runs import (
    TINY,
    holder_line,
    towers,
    wait_until,
)
from tests.harness import snapshot
from towers import checkpoints
from towers import logdir as logdir_module
from towers.cli.config import flag
from towers.errors import TowersError
from towers.logdir import _UNNAMED_WAIT_S, LogdirLock, in_use_by

REFUSAL = '--logdir %s is in use by %s: wait for that run to end, or choose another folder'


def _since(seconds):
    return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(seconds))


def test_the_lock_names_its_holder_and_is_emptied_when_released(tmp_path):
    logdir, before = str(tmp_path), time.time()
    with LogdirLock(logdir) as lock:
        with open(lock.path) as f:
            holder = json.load(f)
        assert sorted(holder) == ['command', 'host', 'pid', 'since']
        assert (holder['pid'], holder['host']) == (os.getpid(), socket.gethostname())
        assert before <= holder['since'] <= time.time()
        assert in_use_by(logdir) == 'process %d (%s) on %s since %s' % (
            os.getpid(), holder['command'], socket.gethostname(), _since(holder['since']))
    assert lock.path == os.path.join(logdir, '.towers.lock')
    # Emptied, not removed: a run about to lock that very file must not lose it.
    assert os.path.getsize(lock.path) == 0
    assert in_use_by(logdir) is None


def test_a_second_lock_is_refused_naming_the_first(tmp_path):
    logdir = str(tmp_path)
    with LogdirLock(logdir):
        holder = in_use_by(logdir)
        # Another open file of the lock: flock refuses it as it would another process's.
        with pytest.raises(TowersError) as refused:
            with LogdirLock(logdir):
                pass
        assert in_use_by(logdir) == holder  # the first still holds it
    assert refused.value.named(flag) == REFUSAL % (logdir, holder)


class _Clock:
    """towers.logdir's time, on a clock of its own: a sleep moves it on at once.

    Each reading and each sleep is recorded, and then(k, act) runs act at the k-th sleep
    (1: the first), so that what the lock sees while it asks again happens between two
    exact tries, whatever else the machine is doing.
    """

    def __init__(self):
        self.now, self.readings, self.sleeps, self._acts = 1000.0, [], [], {}

    def monotonic(self):
        self.readings.append(self.now)
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds
        self._acts.pop(len(self.sleeps), lambda: None)()

    def then(self, k, act):
        self._acts[k] = act

    def __getattr__(self, name):  # time.time, strftime, localtime: the real ones
        return getattr(time, name)


def test_a_lock_held_by_no_one_named_is_asked_again_then_refused(tmp_path, monkeypatch):
    logdir = str(tmp_path)
    clock = _Clock()
    monkeypatch.setattr(logdir_module, 'time', clock)
    with open(os.path.join(logdir, '.towers.lock'), 'a+') as other:
        # in_use_by looking: a shared lock for a moment (three tries), and no name written.
        fcntl.flock(other, fcntl.LOCK_SH)
        clock.then(3, lambda: fcntl.flock(other, fcntl.LOCK_UN))
        with LogdirLock(logdir):
            assert clock.sleeps == [0.01] * 3  # refused three times, taken at the fourth try
        # A holder that never names itself is refused once the wait is over, not before.
        fcntl.flock(other, fcntl.LOCK_EX)
        del clock.readings[:], clock.sleeps[:]
        with pytest.raises(TowersError) as refused:
            LogdirLock(logdir).__enter__()
        # Its first reading set the deadline; it asked again until a reading was past it.
        start, *looks = clock.readings
        assert len(looks) == len(clock.sleeps) + 1 and set(clock.sleeps) == {0.01}
        assert looks[-2] <= start + _UNNAMED_WAIT_S < looks[-1]
    assert refused.value.named(flag) == REFUSAL % (logdir, 'another process')


def test_a_dead_holders_name_is_no_lock(tmp_path):
    logdir = str(tmp_path)
    assert in_use_by(logdir) is None  # never locked: no lock file
    # What a holder killed with -9 leaves: its name, and no lock (the kernel dropped it).
    with open(os.path.join(logdir, '.towers.lock'), 'w') as f:
        json.dump({'pid': 999999, 'host': 'elsewhere', 'command': 'towers train',
                   'since': 0}, f)
    assert in_use_by(logdir) is None
    with LogdirLock(logdir) as lock:
        with open(lock.path) as f:
            assert json.load(f)['pid'] == os.getpid()


@pytest.mark.parametrize('written', [[], ['run.json']], ids=['nothing', 'run.json'])
def test_eval_of_a_logdir_in_use_before_its_first_checkpoint(tmp_path, capsys, written):
    logdir = str(tmp_path)
    for name in written:
        (tmp_path / name).write_text('{}')
    with LogdirLock(logdir):
        assert towers(capsys, 'eval', '--logdir', logdir)[::2] == (1, [
            'towers: error: %s is in use by %s, which has not saved a checkpoint yet: wait for '
            'its first one' % (logdir, in_use_by(logdir))])


HOLDER = TINY + ('--steps', '100000', '--checkpoint-every', '5', '--log-every', '5')


def _holder_command(logdir):
    """The command line the holder's lock records (LogdirLock's _command: 200 characters
    at most, which a long temporary folder reaches)."""
    return ('towers train %s --logdir %s' % (' '.join(HOLDER), logdir))[:200]


def test_a_logdir_in_use_refuses_a_second_run_and_is_read_by_eval_and_export(tmp_path,
                                                                             capsys, forks):
    logdir = str(tmp_path / 'run')
    with forks.training(['train', *HOLDER, '--logdir', logdir], tmp_path) as holder:
        wait_until(lambda: checkpoints.newest_complete(logdir), what='the first checkpoint')
        # Stopped (SIGSTOP) while the others run: its files stand still.
        holder.send_signal(signal.SIGSTOP)
        try:
            newest, before = checkpoints.newest_complete(logdir), snapshot(logdir)
            # The second run in this process: the lock is the holder's, another process's,
            # as it would be for a second `towers train` (and no 5 s start of TensorFlow).
            status, out, refusal = towers(capsys, 'train', *TINY, '--steps', '10',
                                          '--logdir', logdir)
            assert status == 1
            assert len(refusal) == 1, refusal
            assert holder_line(logdir, holder.pid, _holder_command(logdir)).match(refusal[0])
            assert out == [
                'dataset mnist_sample: 4000 train, 0 validation, 1000 test; model small_convnet']
            in_use = '%s is in use by %s: reading its newest complete checkpoint, %s' % (
                logdir, in_use_by(logdir), newest)
            status, out, err = towers(capsys, 'eval', '--devices', 'cpu', '--logdir', logdir)
            assert (status, err, out[:2]) == (0, [], [in_use, 'checkpoint: %s' % newest])
            assert out[2].startswith('test: loss ') and out[2].endswith(' (1000 images)')
            exported = str(tmp_path / 'exported')
            status, out, err = towers(capsys, 'export', '--logdir', logdir, '--out', exported)
            assert (status, err, out[0]) == (0, [], in_use)
            assert out[1].startswith('exported %s as a SavedModel' % newest)
            assert os.path.isfile(os.path.join(exported, 'saved_model.pb'))
            assert snapshot(logdir) == before  # none of the three wrote there
        finally:
            holder.send_signal(signal.SIGCONT)
        holder.send_signal(signal.SIGTERM)
        assert holder.finish() == 0, holder.err
    assert any(line.startswith('SIGTERM: stopping after step ') for line in holder.out)


def test_kill_9_of_the_holder_frees_the_logdir_for_the_resume(tmp_path, capsys, forks):
    logdir = str(tmp_path / 'run')
    with forks.training(['train', *HOLDER, '--logdir', logdir], tmp_path) as holder:
        holder.wait_for_line('step 10/')
        assert holder.kill() == -signal.SIGKILL
    assert in_use_by(logdir) is None
    with open(os.path.join(logdir, '.towers.lock')) as f:
        assert json.load(f)['pid'] == holder.pid  # its name is left; its lock is not
    newest = checkpoints.newest_complete(logdir)
    step = tf.train.load_variable(newest, 'global_step')
    assert step >= 5
    status, out, err = towers(capsys, 'train', *TINY, '--steps', step + 5, '--logdir', logdir)
    assert (status, err) == (0, [])
    assert 'resumed from %s' % newest in out
    assert tf.train.load_variable(logdir, 'global_step') == step + 5
    assert os.path.getsize(os.path.join(logdir, '.towers.lock')) == 0
