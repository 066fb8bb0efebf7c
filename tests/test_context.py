"""TowerContext: every tower's model is told its mode, index and share, explicitly."""
import pytest
import tensorflow as tf

from towers.context import EVAL, TRAIN, TowerContext, is_training_flag
from towers.deviceplan import DevicePlan
from towers.slicing import split_batch
from towers.tower import build_towers, build_towers_from_slices

tf1 = tf.compat.v1


def test_a_context_is_truthy_exactly_in_training():
    train = TowerContext(TRAIN, 1, 3, count=None, weight=None, sync_bn=True)
    evaluation = TowerContext(EVAL, 0, 3, count=None, weight=None, sync_bn=True)
    assert bool(train) and train.training and train.sync_bn
    assert not evaluation and not evaluation.sync_bn  # batch statistics only pool in training
    assert repr(train) == 'TowerContext(train, tower 1 of 3, sync_bn)'
    assert [train.next_collective_keys() for _ in range(3)] == [(2, 3), (4, 5), (6, 7)]
    assert is_training_flag(True) and is_training_flag(evaluation)
    assert not is_training_flag(tf.constant(True)) and not is_training_flag(1)
    with pytest.raises(ValueError, match="not 'predict'"):
        TowerContext('predict', 0, 1, None, None)


def test_each_tower_gets_its_own_context_with_its_index_and_share():
    seen = []

    def loss_fn(images, labels, count, context):
        seen.append(context)
        return tf.reduce_sum(images), {}

    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [None, 2, 2, 1])
        labels = tf1.placeholder(tf.int64, [None])
        slices = split_batch(images, labels, 3)
        plan = DevicePlan(['/cpu:0'] * 3)
        towers = build_towers_from_slices(loss_fn, slices, plan, sync_bn=True)
        build_towers_from_slices(loss_fn, slices, plan, training=False, reuse=True)
        with tf1.Session() as sess:
            weights = sess.run([c.weight for c in seen[:3]],
                               {images: [[[[0.0]] * 2] * 2] * 10, labels: [0] * 10})
    assert [(c.mode, c.index, c.num_towers, c.sync_bn) for c in seen] == [
        (TRAIN, 0, 3, True), (TRAIN, 1, 3, True), (TRAIN, 2, 3, True),
        (EVAL, 0, 3, False), (EVAL, 1, 3, False), (EVAL, 2, 3, False)]
    assert weights == pytest.approx([0.4, 0.3, 0.3])  # 10 over 3 towers is 4/3/3
    assert [t.weight for t in towers] == [c.weight for c in seen[:3]]


def test_a_model_fn_is_handed_the_context_as_training():
    modes = []

    def model_fn(images, training):
        modes.append(training)
        return tf.zeros([tf.shape(images)[0], 10]) + tf1.get_variable('w', [])

    with tf.Graph().as_default():
        images = tf1.placeholder(tf.float32, [None, 2, 2, 1])
        labels = tf1.placeholder(tf.int64, [None])
        build_towers(model_fn, images, labels, ['/cpu:0', '/cpu:0'])
    assert [type(m) for m in modes] == [TowerContext, TowerContext]
    assert [(m.index, bool(m)) for m in modes] == [(0, True), (1, True)]
