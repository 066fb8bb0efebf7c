"""A records shard deleted while a run reads it: one line naming the shard, then a resume.

`--dataset records:DIR` streams the shards through tf.data, which opens them
again every epoch; a shard removed after the run checked it is found missing
when the second epoch begins (step 20 here: 1000 records, batches of 50).
"""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from data.records import RecordSet, write_records
from tests.faults.runs import TINY, assert_same_variables, assert_whole, towers, variables
from towers import checkpoints, data, session
from towers.devices import session_config
from towers.errors import TowersError
from towers.inputs import make_input
from towers.logdir import in_use_by


@pytest.fixture(scope='module')
def records(tmp_path_factory):
    """mnist_sample's first 1000 training and 200 test images as a records folder of four
    shards per split (as `towers data convert` writes them): a first epoch of 20 steps
    proves what all 4000 (80 steps) would, at a quarter of the training."""
    folder = str(tmp_path_factory.mktemp('records') / 'mnist_sample')
    sample = data.load_dataset('mnist_sample', validation_size=0)
    # DataSet holds images as float32 x/255; rint recovers the bytes exactly.
    write_records({name: (np.rint(split.images[:count] * 255).astype(np.uint8),
                          split.labels[:count])
                   for name, split, count in (('train', sample.train, 1000),
                                              ('test', sample.test, 200))},
                  folder, 4, 'mnist_sample', 10)
    return folder


def test_a_records_shard_deleted_mid_run(tmp_path, records, monkeypatch, capsys):
    folder = str(tmp_path / 'records')
    shutil.copytree(records, folder)
    shard = os.path.join(folder, 'train-00002-of-00004.tfrecord')
    logdir, other = str(tmp_path / 'run'), str(tmp_path / 'uninterrupted')
    # A checkpoint every 5 steps: four before the second epoch; 10 steps of it read the shard
    # put back (the shards are interleaved record by record).
    flags = TINY + ('--dataset', 'records:' + folder, '--steps', '30',
                    '--checkpoint-every', '5')
    run_step = session.run_step

    def delete_at_step_5(sess, source, step, *args, **kwargs):
        if step == 5:
            os.remove(shard)
        return run_step(sess, source, step, *args, **kwargs)
    monkeypatch.setattr(session, 'run_step', delete_at_step_5)
    status, out, err = towers(capsys, 'train', *flags, '--logdir', logdir)
    assert status == 1
    assert err == ['towers: error: cannot read the input data at step 20: %s; No such file or '
                   'directory; put it back and run again to resume' % shard]
    # What was saved before it (step 20 ended the first epoch) is whole; the lock is free.
    assert assert_whole(logdir) == ['model.ckpt-%d' % s for s in (5, 10, 15, 20)]
    assert in_use_by(logdir) is None
    # With the shard back, the run resumes there and ends as one never interrupted.
    monkeypatch.undo()
    shutil.copy(os.path.join(records, os.path.basename(shard)), shard)
    status, out, _ = towers(capsys, 'train', *flags, '--logdir', logdir)
    assert status == 0 and 'resumed from %s' % os.path.join(logdir, 'model.ckpt-20') in out
    assert towers(capsys, 'train', *flags, '--logdir', other)[0] == 0
    assert_same_variables(variables(checkpoints.newest_complete(other)),
                          variables(checkpoints.newest_complete(logdir)))


@pytest.mark.parametrize('staged', [False, True])
def test_the_step_named_is_the_one_whose_batch_is_gone(tmp_path, records, staged):
    """Staged (as on GPU towers), step 19's run puts step 20's batch: the batch that fails to
    read is still step 20's, and the error says so, as the unstaged run's does."""
    folder = str(tmp_path / 'records')
    shutil.copytree(records, folder)
    shard = os.path.join(folder, 'train-00002-of-00004.tfrecord')
    source = make_input('dataset', RecordSet(folder, 'train'), None, 50, 10)
    source.staged = staged  # (on CPU towers the source stages only when told to)
    devices = ['/cpu:0', '/cpu:1']
    with tf.Graph().as_default() as graph:
        slices = source.build((28, 28, 1), devices)
        init = tf.compat.v1.local_variables_initializer()
    with tf.compat.v1.Session(graph=graph, config=session_config(devices)) as sess:
        sess.run(init)
        with session.run_steps(sess, source, {'rows': [s.count for s in slices]}, 0,
                               30) as loop:
            for _ in range(5):  # every shard opened: the first epoch reads on
                loop.run_one()
            os.remove(shard)  # opened again when the second epoch begins, at step 20
            with pytest.raises(TowersError) as raised:
                for _ in loop:
                    pass
    assert str(raised.value) == ('cannot read the input data at step 20: %s; No such file or '
                                 'directory; put it back and run again to resume' % shard)
    # Staged, the run that read it was step 19's, which therefore did not finish.
    assert loop.step == (19 if staged else 20)
