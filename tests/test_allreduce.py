"""The towers' all-reduce (--variable-update replicated): packed, weighted, alike on each."""
import numpy as np
import pytest
import tensorflow as tf

from towers import models
from towers.allreduce import TowerAllReduce, packs
from towers.deviceplan import make_plan
from towers.graph import build_training_graph
from towers.model import ClassifierModel

tf1 = tf.compat.v1

THREE = ['/cpu:0', '/cpu:1', '/cpu:2']


def test_packs_are_runs_of_one_dtype_up_to_the_buffer_size():
    with tf.Graph().as_default():
        tensors = [tf.zeros([n], dtype) for n, dtype in [
            (10, tf.float32), (10, tf.float32), (300, tf.float32), (4, tf.float32),
            (4, tf.float64), (4, tf.float32)]]
        assert packs(tensors) == [[0, 1, 2, 3], [4], [5]]
        # 80 bytes at most: a pack closes once it holds that many.
        assert packs(tensors, max_bytes=80) == [[0, 1], [2], [3], [4], [5]]


def _reduced(implementation, devices):
    """(per tower [(sum, var)], the graph) for weighted gradients of three variables."""
    rng = np.random.RandomState(0)
    values = [[rng.rand(*shape).astype(np.float32) for shape in ([3, 2], [5], [4])]
              for _ in devices]
    weights = [0.5, 0.3, 0.2][:len(devices)]
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)  # under op determinism every random op needs a seed
        per_tower = []
        for k, device in enumerate(devices):
            with tf.device(device):
                variables = [tf1.get_variable('v%d_%d' % (k, j), v.shape)
                             for j, v in enumerate(values[k])]
                grads = [tf.constant(v) for v in values[k]]
                grads[1] = None  # a variable the model does not use
                per_tower.append(list(zip(grads, variables)))
        summed = TowerAllReduce(devices, implementation)(per_tower, weights)
    expected = [sum(w * v[j] for w, v in zip(weights, values)) for j in (0, 2)]
    return summed, graph, expected


@pytest.mark.parametrize('implementation,reduce_ops', [
    # One pack (the two float32 gradients): one collective per tower, on its device.
    ('ring', {'CollectiveReduce': ['/device:CPU:%d' % i for i in range(3)]}),
    # One sum per gradient, spread by bytes: the 6 floats on CPU:0, the 4 on CPU:1.
    ('host', {'AddN': ['/device:CPU:0', '/device:CPU:1']})])
@pytest.mark.exact
def test_every_cpu_tower_gets_the_same_weighted_sum(implementation, reduce_ops):
    summed, graph, expected = _reduced(implementation, THREE)
    assert [[g is None for g, _ in tower] for tower in summed] == [[False, True, False]] * 3
    config = tf1.ConfigProto(device_count={'CPU': 3})
    with tf1.Session(graph=graph, config=config) as sess:
        got = sess.run([[g for g, _ in tower if g is not None] for tower in summed])
    for tower in got:
        for value, want in zip(tower, expected):
            np.testing.assert_allclose(value, want, rtol=1e-6)
    for tower in got[1:]:  # bit-identical on every tower, not merely close
        for value, first in zip(tower, got[0]):
            np.testing.assert_array_equal(value, first)
    for kind, devices in reduce_ops.items():
        assert sorted(op.device for op in graph.get_operations() if op.type == kind) == devices


def test_on_gpus_the_towers_meet_in_nccl():
    # Built only: no GPU here. One NcclAllReduce per tower for the one pack.
    summed, graph, _ = _reduced('nccl', ['/gpu:0', '/gpu:1'])
    ncclsums = [op for op in graph.get_operations() if op.type == 'NcclAllReduce']
    assert sorted(op.device for op in ncclsums) == ['/device:GPU:0', '/device:GPU:1']
    assert all(g.device == '/device:GPU:%d' % k for k, tower in enumerate(summed)
               for g, _ in tower if g is not None)


def test_a_replicated_graph_all_reduces_with_nccl_on_gpus_and_a_ring_when_asked():
    model = ClassifierModel(models.build_model('small_convnet', (28, 28, 1), 10), (28, 28, 1),
                            10, optimizer='sgd')
    for devices, all_reduce, kind in ((['/gpu:0', '/gpu:1'], None, 'NcclAllReduce'),
                                      (THREE, 'ring', 'CollectiveReduce')):
        graph = build_training_graph(model, make_plan(devices, '/cpu:0', 'replicated',
                                                      all_reduce=all_reduce))
        ops = [op for op in graph.graph.get_operations() if op.type == kind]
        assert len(ops) == len(devices), kind  # small_convnet's four gradients: one pack
        assert all(op.name.startswith('all_reduce/') for op in ops)


def test_an_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="all-reduce 'gloo': use one of"):
        TowerAllReduce(THREE, 'gloo')


def test_one_tower_needs_no_all_reduce():
    summed, graph, expected = _reduced('ring', ['/cpu:0'])
    with tf1.Session(graph=graph) as sess:
        got = sess.run([g for g, _ in summed[0] if g is not None])
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)  # its own share of it
    assert not [op for op in graph.get_operations() if op.type.startswith('Collective')]
