"""What a logdir holds, read and written in one place: checkpoints, run.json, the cleanup."""
import os

import numpy as np
import pytest
import tensorflow as tf

from towers import checkpoints
from towers.dataorder import DataOrder
from towers.errors import TowersError
from towers.logdir import remove_unfinished

tf1 = tf.compat.v1


def _save(folder, steps, keep=5, values=(1.0, 2.0)):
    """Checkpoints of one variable `w` at the given steps; their prefixes."""
    with tf.Graph().as_default() as graph:
        w = tf1.get_variable('w', initializer=tf.constant(list(values)))
        saver = checkpoints.make_saver({'w': w}, keep)
        with tf1.Session(graph=graph) as sess:
            sess.run(w.initializer)
            return [checkpoints.save(saver, sess, folder, step) for step in steps]


def test_save_writes_whole_checkpoints_and_newest_complete_passes_over_a_cut_one(tmp_path):
    folder = str(tmp_path)
    first, second = _save(folder, [3, 7])
    assert checkpoints.newest_complete(folder) == second
    assert np.array_equal(tf.train.load_variable(second, 'w'), [1.0, 2.0])
    data = second + '.data-00000-of-00001'
    with open(data, 'r+b') as f:
        f.truncate(os.path.getsize(data) - 1)  # a copy that stopped short
    assert checkpoints.newest_complete(folder) == first
    assert checkpoints.to_restore(folder) == (first, second)


def test_find_checkpoint_the_one_given_the_best_or_the_newest(tmp_path):
    folder = str(tmp_path)
    [newest] = _save(folder, [5])
    assert checkpoints.find_checkpoint(folder) == newest
    assert checkpoints.find_checkpoint(folder, newest) == newest
    with pytest.raises(TowersError, match='^give best or checkpoint, not both$'):
        checkpoints.find_checkpoint(folder, newest, best=True)
    with pytest.raises(TowersError, match='has no best checkpoint'):
        checkpoints.find_checkpoint(folder, best=True)
    with pytest.raises(TowersError, match='^no checkpoint at .*/nope$'):
        checkpoints.find_checkpoint(folder, os.path.join(folder, 'nope'))
    empty = str(tmp_path / 'empty')
    os.makedirs(empty)
    with pytest.raises(TowersError) as error:
        checkpoints.find_checkpoint(empty)
    assert error.value.named(lambda s: '--' + s) == (
        'no checkpoint in %s; train with --logdir %s first' % (empty, empty))


def test_check_checkpoint_names_what_is_missing_and_what_has_another_shape(tmp_path):
    [prefix] = _save(str(tmp_path), [1])
    with tf.Graph().as_default():
        wide = tf1.get_variable('w', [3])
        extra = tf1.get_variable('b', [2])
        with pytest.raises(TowersError) as error:
            checkpoints.check_checkpoint(prefix, [wide, extra])
    assert str(error.value) == (
        'checkpoint %s does not match this model (missing: b | other shapes: w [3] here, [2] '
        'there); use another logdir or the flags it was trained with' % prefix)


def test_run_json_round_trips_and_a_missing_one_says_where_to_point(tmp_path):
    checkpoints.write_run(str(tmp_path), model='small_convnet', input_shape=[28, 28, 1])
    assert checkpoints.read_run(str(tmp_path)) == {'model': 'small_convnet',
                                                   'input_shape': [28, 28, 1]}
    with pytest.raises(TowersError, match='has no run.json: point logdir at a folder'):
        checkpoints.read_run(str(tmp_path / 'elsewhere'))
    (tmp_path / 'run.json').write_text('{not json')
    with pytest.raises(TowersError, match='^cannot read .*run.json: '):
        checkpoints.read_run(str(tmp_path))


def test_a_damaged_state_file_stops_instead_of_starting_over(tmp_path):
    _save(str(tmp_path), [2])
    (tmp_path / 'checkpoint').write_text('this is not a checkpoint state')
    with pytest.raises(TowersError, match='is damaged: it does not list checkpoints'):
        checkpoints.checkpoint_state(str(tmp_path))


def test_remove_unfinished_takes_what_a_kill_left_and_nothing_else(tmp_path):
    folder = str(tmp_path)
    _save(folder, [4, 6, 8, 10], keep=3)  # lists 6, 8, 10
    (tmp_path / 'model.ckpt-12.meta').write_bytes(b'a save cut short')
    (tmp_path / 'model.ckpt-12.data-00000-of-00001.tempstate123').write_bytes(b'half')
    (tmp_path / 'model.ckpt-4.index').write_bytes(b'a deletion cut short')
    (tmp_path / '.run.json.abc123').write_bytes(b'{')
    _save(str(tmp_path / 'by_hand'), [1, 7])
    for name in os.listdir(tmp_path / 'by_hand'):
        if name.startswith('model.ckpt-'):  # whole checkpoints put here, not listed
            os.replace(os.path.join(tmp_path, 'by_hand', name), os.path.join(folder, name))
    assert remove_unfinished(folder) == [
        '.run.json.abc123', 'model.ckpt-12.data-00000-of-00001.tempstate123',
        'model.ckpt-12.meta', 'model.ckpt-4.index']
    for step in (1, 7):  # older than every listed one, or between them: whole, so they stay
        assert sorted(n for n in os.listdir(folder) if n.startswith('model.ckpt-%d.' % step)) \
            == ['model.ckpt-%d.%s' % (step, end) for end in ('data-00000-of-00001', 'index',
                                                              'meta')]
    assert checkpoints.newest_complete(folder).endswith('model.ckpt-10')
    # Without a state file, only what does not read back whole goes.
    lone = tmp_path / 'lone'
    _save(str(lone), [3])
    os.remove(lone / 'checkpoint')
    (lone / 'model.ckpt-9.meta').write_bytes(b'cut short')
    assert remove_unfinished(str(lone)) == ['model.ckpt-9.meta']
    assert sorted(os.listdir(lone)) == ['model.ckpt-3.data-00000-of-00001', 'model.ckpt-3.index',
                                        'model.ckpt-3.meta']


def test_the_data_order_refuses_a_resume_that_would_see_other_batches(tmp_path):
    with tf.Graph().as_default() as graph:
        order = DataOrder({'seed': 0, 'batch_size': 10})
        order.build('/cpu:0')
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            order.check(sess, 'D')  # the same order passes
            order.settings['seed'] = 1
            with pytest.raises(TowersError) as error:
                order.check(sess, 'D')
    assert str(error.value) == (
        'the checkpoint in D was trained with data order batch_size 10, seed 0, this run asks '
        'for batch_size 10, seed 1: resuming would train on other batches; use the same seed, '
        'batch_size, dataset and input, or a new logdir')
