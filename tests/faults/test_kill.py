"""kill -9 across checkpoint writes, evaluation and the staging input's start-up.

Each case kills a real training process and checks what it left: the logdir
free for the next run, every checkpoint the state file lists whole, and what
is half written exactly what the next run says it removed. Then the run is
resumed to its end, and its final variables equal an uninterrupted run's bit
for bit: the trainer is deterministic with the feed and staging inputs (the
data order is saved in every checkpoint). The moments a kill from outside
lands at are drawn from a seeded generator, so a failure reproduces; the
moments between two writes that such a kill is unlikely to hit are set
exactly (killpoint.py). The processes killed are forks of one that started
TensorFlow once (the `forks` fixture, runs.Forks): eleven starts of it would
cost more than all the rest.
"""
import json
import os
import random
import re
import signal
import time

import pytest

from tests.faults.runs import (
    TINY,
    assert_same_variables,
    assert_whole,
    leftovers,
    listed,
    to_be_removed,
    towers,
    variables,
    wait_until,
)
from towers import checkpoints
from towers.logdir import in_use_by

SEED = 1702
# A write in progress: TensorFlow's temporary names for a checkpoint's data
# and index (.tempstateDIGITS) and for its graph and state file (.tmpHEX).
IN_PROGRESS = re.compile(r'\.tempstate\d+$|\.tmp[0-9a-f]{32}$')
REMOVED = 'removed what an interrupted run left unfinished: '


def _after_kill(logdir):
    """What a killed run must leave: a free logdir, whole checkpoints; (listed, unfinished)."""
    assert in_use_by(logdir) is None  # the kernel dropped the lock with the process
    return assert_whole(logdir), to_be_removed(logdir)


def _removed(out):
    return [line[len(REMOVED):].split(', ') for line in out if line.startswith(REMOVED)]


def _resume(capsys, logdir, flags, *unfinished):
    """Resume in this process to the end; its output.

    Asserts it said it removed exactly `unfinished`: a list of names for the
    logdir, then one for best/ (when the run keeps a best checkpoint).
    """
    status, out, err = towers(capsys, 'train', *flags, '--logdir', logdir)
    assert (status, err) == (0, [])
    assert _removed(out) == [names for names in unfinished if names]
    assert leftovers(logdir) == []
    return out


def test_kill_9_at_random_moments_of_checkpoint_writes(tmp_path, capsys, uninterrupted, forks):
    # A checkpoint every step (and the oldest of five deleted); each run is
    # killed a moment after the k-th temporary file of its checkpoint writes
    # appears (at most the 4th: within its first two checkpoints), and the
    # next run resumes from what it left. 20 steps: the last run deletes some.
    rng = random.Random(SEED)
    logdir, flags = str(tmp_path / 'run'), TINY + ('--steps', '20')
    every_step = ('--checkpoint-every', '1', '--log-every', '1')
    unfinished, resumed = [], []
    for _ in range(3):
        files, delay = rng.randint(1, 4), rng.uniform(0, 0.004)
        with forks.training(['train', *flags, *every_step, '--logdir', logdir], tmp_path) as run:
            run.wait_for_line('training ')
            before, begun = set(os.listdir(logdir)), set()

            def kth_file_begun():
                begun.update(n for n in os.listdir(logdir) if IN_PROGRESS.search(n)
                             and n not in before)
                return len(begun) >= files
            wait_until(kth_file_begun, what='temporary file %d' % files)
            time.sleep(delay)
            assert run.kill() == -signal.SIGKILL
        # What the run before this one left half written, this one removed first;
        # it went on from the newest checkpoint that run left whole.
        assert _removed(run.out) == ([unfinished] if unfinished else [])
        assert [line for line in run.out if line.startswith('resumed from ')] == resumed
        names, unfinished = _after_kill(logdir)
        resumed = ['resumed from %s' % os.path.join(logdir, names[-1])] if names else []
    out = _resume(capsys, logdir, flags + every_step, unfinished)
    assert [line for line in out if line.startswith('resumed from ')] == resumed
    assert_same_variables(uninterrupted(*flags),
                          variables(checkpoints.newest_complete(logdir)))
    assert listed(logdir) == ['model.ckpt-%d' % step for step in range(16, 21)]


# moment: (its call that kills, what is left half written, what the state file lists)
MOMENTS = {
    'graph': (3, ['model.ckpt-15.meta'], ['model.ckpt-5', 'model.ckpt-10']),
    'listing': (3, ['model.ckpt-15.data-00000-of-00001', 'model.ckpt-15.index',
                    'model.ckpt-15.meta'], ['model.ckpt-5', 'model.ckpt-10']),
    'renaming': (3, ['checkpoint.tmp*', 'model.ckpt-15.data-00000-of-00001',
                     'model.ckpt-15.index', 'model.ckpt-15.meta'],
                 ['model.ckpt-5', 'model.ckpt-10']),
    # Saving 15 deletes 5 (two kept): its graph goes first.
    'deleting': (1, ['model.ckpt-5.data-00000-of-00001', 'model.ckpt-5.index'],
                 ['model.ckpt-10', 'model.ckpt-15']),
}


@pytest.mark.parametrize('moment', sorted(MOMENTS))
def test_kill_9_between_the_writes_of_a_checkpoint(tmp_path, capsys, uninterrupted, forks,
                                                   moment):
    call, half_written, kept = MOMENTS[moment]
    logdir, flags = str(tmp_path / 'run'), TINY + ('--steps', '20')
    saves = ('--checkpoint-every', '5', '--keep-checkpoints', '2')
    with forks.training([moment, str(call), 'train', *flags, *saves, '--logdir', logdir],
                        tmp_path, module='tests.faults.killpoint') as run:
        assert run.finish() == -signal.SIGKILL, run.err
    names, unfinished = _after_kill(logdir)
    assert names == kept
    assert [re.sub('[0-9a-f]{32}$', '*', name) for name in unfinished] == half_written
    out = _resume(capsys, logdir, flags + saves, unfinished)
    assert 'resumed from %s' % os.path.join(logdir, kept[-1]) in out
    assert_same_variables(uninterrupted(*flags),
                          variables(checkpoints.newest_complete(logdir)))
    assert listed(logdir) == ['model.ckpt-15', 'model.ckpt-20']


# Held-out validation: 60 steps an epoch, evaluated at 60, 120 and the end (130),
# the best checkpoint kept in best/ (at 60, then 120: it improves).
EVALUATED = ('--model', 'small_convnet', '--batch-size', '50', '--quiet', '--validation-size',
             '1000', '--steps', '130', '--log-every', '60', '--devices', 'cpu')


def _assert_best_is_described(logdir):
    """best/ holds one whole checkpoint, and best.json names it; best.json's contents."""
    best = os.path.join(logdir, 'best')
    assert leftovers(best) == ['best.json']
    with open(os.path.join(best, 'best.json')) as f:
        record = json.load(f)
    assert [record['checkpoint']] == assert_whole(best)
    assert record['checkpoint'] == 'model.ckpt-%d' % record['step']
    return record


def _assert_stats_lines_whole(logdir):
    with open(os.path.join(logdir, 'stats.jsonl')) as f:
        steps = [json.loads(line)['step'] for line in f]
    # An epoch whose line a kill cut off is not written again (StatsFile says so).
    assert steps == sorted(set(steps)) and {120, 130} <= set(steps) <= {60, 120, 130}


def test_kill_9_at_random_moments_of_an_evaluation(tmp_path, capsys, uninterrupted, forks):
    # Within 130 ms of the end of epoch 1: its checkpoint, the evaluation of
    # 1000 validation images, the save of the best checkpoint (here ~100 ms).
    rng = random.Random(SEED)
    for attempt in range(2):
        logdir = str(tmp_path / ('run%d' % attempt))
        with forks.training(['train', *EVALUATED, '--logdir', logdir], tmp_path) as run:
            run.wait_for_line('step 60/130 ')
            time.sleep(rng.uniform(0, 0.13))
            assert run.kill() == -signal.SIGKILL
        _, unfinished = _after_kill(logdir)
        best = os.path.join(logdir, 'best')
        if os.path.isdir(best):
            assert_whole(best)
        unfinished_best = (['best/' + name for name in to_be_removed(best) if name != 'best.json']
                           if os.path.isdir(best) else [])
        _resume(capsys, logdir, EVALUATED, unfinished, unfinished_best)
        assert_same_variables(uninterrupted(*EVALUATED),
                              variables(checkpoints.newest_complete(logdir)))
        _assert_best_is_described(logdir)
        _assert_stats_lines_whole(logdir)


def test_kill_9_between_a_best_checkpoint_and_its_record(tmp_path, capsys, uninterrupted,
                                                         forks):
    # The second best (120) is saved, best.json still names the first (60).
    logdir = str(tmp_path / 'run')
    with forks.training(['recording', '2', 'train', *EVALUATED, '--logdir', logdir], tmp_path,
                        module='tests.faults.killpoint') as run:
        assert run.finish() == -signal.SIGKILL, run.err
    best = os.path.join(logdir, 'best')
    assert assert_whole(best) == ['model.ckpt-120']
    with open(os.path.join(best, 'best.json')) as f:
        assert json.load(f)['checkpoint'] == 'model.ckpt-60'
    out = _resume(capsys, logdir, EVALUATED, [])
    # The record is another checkpoint's: not read as the best's, replaced by the next.
    assert ('%s does not describe %s; the next evaluation keeps its checkpoint as the best'
            % (os.path.join(best, 'best.json'), os.path.join(best, 'model.ckpt-120'))) in out
    assert _assert_best_is_described(logdir)['step'] == 130
    assert_same_variables(uninterrupted(*EVALUATED),
                          variables(checkpoints.newest_complete(logdir)))


def test_kill_9_while_the_staging_input_starts(tmp_path, capsys, uninterrupted, forks):
    # A resume at step 10: the loader thread starts, every tower's StagingArea
    # is primed from step 10's batch; the kill lands in the first 20 ms of it,
    # long before the 5 steps left to step 15 could end.
    logdir = str(tmp_path / 'run')
    flags = TINY + ('--input', 'staging', '--checkpoint-every', '5')
    assert towers(capsys, 'train', *flags, '--steps', '10', '--logdir', logdir)[0] == 0
    with forks.training(['train', *flags, '--steps', '15', '--logdir', logdir], tmp_path) as run:
        run.wait_for_line('training ')
        time.sleep(random.Random(SEED).uniform(0, 0.02))
        assert run.kill() == -signal.SIGKILL
    names, unfinished = _after_kill(logdir)
    assert names[:2] == ['model.ckpt-5', 'model.ckpt-10']
    _resume(capsys, logdir, flags + ('--steps', '15'), unfinished)
    assert_same_variables(uninterrupted(*TINY, '--input', 'staging', '--steps', '15'),
                          variables(checkpoints.newest_complete(logdir)))
