"""SIGTERM during the first step and during the last: that step ends, is saved, status 0.

The signal is a real one, sent to this process from another thread while the
step's sess.run is under way (as a scheduler's arrives); the run is
`towers train` in this process, with StopOnSignal's handler in place.
"""
import os
import signal
import threading

import pytest
import tensorflow as tf

from tests.faults.runs import TINY, assert_same_variables, listed, towers, variables
from towers import checkpoints, session
from towers.logdir import in_use_by

FLAGS = TINY + ('--steps', '20')


def _sigterm_during(monkeypatch, step):
    """SIGTERM this process 20 ms into the step run after `step` steps (or as it ends)."""
    run_step = session.run_step

    def run_step_under_sigterm(sess, source, at, *args, **kwargs):
        if at != step:
            return run_step(sess, source, at, *args, **kwargs)
        # StopOnSignal's handler, not the default one, which would end pytest.
        assert callable(signal.getsignal(signal.SIGTERM))
        sender = threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGTERM))
        sender.start()
        try:
            return run_step(sess, source, at, *args, **kwargs)
        finally:
            sender.join()
    monkeypatch.setattr(session, 'run_step', run_step_under_sigterm)


@pytest.mark.parametrize('step', [1, 20], ids=['first', 'last'])
def test_sigterm_during_a_step_saves_it_and_exits_0(tmp_path, monkeypatch, capsys,
                                                    uninterrupted, step):
    logdir = str(tmp_path / 'run')
    _sigterm_during(monkeypatch, step - 1)
    status, out, err = towers(capsys, 'train', *FLAGS, '--logdir', logdir)
    assert (status, err) == (0, [])
    checkpoint = os.path.join(logdir, 'model.ckpt-%d' % step)
    stop = out.index('SIGTERM: stopping after step %d' % step)
    assert out[stop + 1] == 'checkpoint: %s' % checkpoint
    assert not any(line.startswith('test:') for line in out)  # a stop skips the test
    assert listed(logdir) == ['model.ckpt-%d' % step]  # the step stopped after, nothing later
    assert tf.train.load_variable(checkpoint, 'global_step') == step
    assert_same_variables(uninterrupted(*TINY, '--steps', str(step)), variables(checkpoint))
    assert in_use_by(logdir) is None
    assert not os.path.exists(os.path.join(logdir, 'stats.jsonl'))  # a stop writes no part-epoch
    # The same command again finishes what the stop skipped: the steps left, the test.
    monkeypatch.undo()
    status, out, err = towers(capsys, 'train', *FLAGS, '--logdir', logdir)
    assert (status, err) == (0, [])
    assert out[1:3] == ['resumed from %s' % checkpoint,
                        'training 20 steps on 1 tower(s) /cpu:0, global batch 50, feed input']
    assert sum(line.startswith('step ') for line in out) == (step < 20)
    assert out[-1].startswith('test: loss ') and out[-1].endswith(' (1000 images)')
    assert_same_variables(uninterrupted(*FLAGS), variables(checkpoints.newest_complete(logdir)))
