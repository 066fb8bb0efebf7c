"""Collective mode's all-reduce in buckets: cut from the sizes alone, last layer first."""
import pytest
import tensorflow as tf

from towers import models
from towers.cluster import collective, modes
from towers.cluster.spec import Cluster
from towers.errors import SettingError
from towers.graph import build_training_graph
from towers.inputs import SyntheticInput
from towers.model import ClassifierModel

tf1 = tf.compat.v1


def test_a_bucket_is_auto_a_size_or_none():
    assert collective.bucket_bytes('auto', [1000, 600]) == 200  # an eighth of the gradients
    assert collective.bucket_bytes('256kB', [1000]) == 256000
    assert collective.bucket_bytes('0', [1000]) == 0
    with pytest.raises(SettingError, match="is auto, a positive size such as 256kB or 4MB, "
                                           "or 0, not 'big'"):
        collective.bucket_bytes('big', [1000])


def _reduces(bucket):
    """([(instance key, element counts of the tensors it sums)] of a worker's gradient
    all-reduces, [element count of each trainable variable] in build order)."""
    cluster = Cluster({'worker': ('a:1', 'b:1')}, 'worker', 1)
    run = modes.Collective(cluster, towers_per_task=1, bucket=bucket)
    model = ClassifierModel(models.build_model('small_convnet', (28, 28, 1), 10), (28, 28, 1),
                            10, optimizer='sgd')
    built = build_training_graph(model, run.plan, source=SyntheticInput(16, 10),
                                 strategy=run.strategy)
    reduces = []
    for op in built.graph.get_operations():
        if op.type.startswith('CollectiveReduce') and op.name.startswith('all_reduce/'):
            packed = op.inputs[0].op  # the concat of the bucket's flattened tensors
            reduces.append((op.get_attr('instance_key'),
                            [t.shape.num_elements() for t in packed.inputs[:-1]]))
    return sorted(reduces), [v.shape.num_elements() for v in built.graph.get_collection(
        tf1.GraphKeys.TRAINABLE_VARIABLES)]


def test_buckets_go_last_layer_first_and_each_is_one_all_reduce():
    [(_, after)], variables = _reduces('0')
    assert after == variables + [1]  # one buffer after the backward pass, the batch size last
    buckets, _ = _reduces('2kB')
    keys = [key for key, _ in buckets]
    assert keys == list(range(keys[0], keys[0] + len(keys)))  # handed out in build order
    # The batch size, then the last layer's gradients first, down to the first layer's,
    # each bucket closed once it holds 2 kB.
    assert [n for _, sizes in buckets for n in sizes] == [1] + variables[::-1]
    for _, sizes in buckets[:-1]:
        assert 4 * sum(sizes[:-1]) < 2000 <= 4 * sum(sizes)
