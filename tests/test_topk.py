"""Top-5 accuracy: a count over the batch whatever the towers, for models of more than 5
classes, in every evaluation line."""
import numpy as np
import pytest
import tensorflow as tf

from towers import evaluation
from towers.graph import weighted_metrics
from towers.tower import build_towers

tf1 = tf.compat.v1


def _logits(images, training):
    """The images are the logits: [m, classes, 1, 1] -> [m, classes]."""
    return tf.reshape(images, [tf.shape(images)[0], images.shape[1]])


def _examples(ranks, classes):
    """Logits 0, 1, ..., classes-1 in a shuffled order, each label at the given rank (0: the
    highest logit)."""
    rng = np.random.RandomState(0)
    images, labels = [], []
    for rank in ranks:
        order = rng.permutation(classes)  # class order[i] gets the i-th highest logit
        logits = np.empty(classes, np.float32)
        logits[order] = np.arange(classes, 0, -1)
        images.append(logits.reshape(classes, 1, 1))
        labels.append(order[rank])
    return np.array(images), np.array(labels, np.int64)


@pytest.mark.parametrize('num_towers', [1, 3])
def test_top5_counts_the_labels_among_the_five_highest_logits_across_towers(num_towers):
    ranks = [0, 4, 5, 9, 1, 6, 3]  # 4 of 7 within the top five, 1 at the top
    images, labels = _examples(ranks, 10)
    with tf.Graph().as_default():
        x = tf1.placeholder(tf.float32, [None, 10, 1, 1])
        y = tf1.placeholder(tf.int64, [None])
        towers = build_towers(_logits, x, y, ['/cpu:%d' % i for i in range(num_towers)])
        metrics = weighted_metrics(towers)  # 7 over 3 towers: 3/2/2
        config = tf1.ConfigProto(device_count={'CPU': num_towers})
        with tf1.Session(config=config) as sess:
            values = sess.run(metrics, {x: images, y: labels})
    assert values == {'accuracy': 1 / 7, 'top5': 4 / 7}


def test_a_model_of_five_classes_or_fewer_has_no_top5():
    images, labels = _examples([0, 4], 5)
    with tf.Graph().as_default():
        towers = build_towers(_logits, tf.constant(images), tf.constant(labels), ['/cpu:0'])
    assert set(towers[0].metrics) == {'accuracy'}


def test_an_evaluation_line_says_top5_beside_accuracy():
    assert (evaluation.format_metrics({'loss': 0.25, 'accuracy': 0.75, 'top5': 0.96875})
            == 'loss 0.2500 accuracy 0.7500 top5 0.9688')
