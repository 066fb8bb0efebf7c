"""Batch norm across towers: tower 0's moving averages by default, --sync-bn pools the moments."""
import numpy as np
import pytest
import tensorflow as tf

from tests.harness import fed, run_graph
from towers.deviceplan import local_plan
from towers.graph import build_training_graph
from towers.model import ClassifierModel
from towers.models import layers

tf1 = tf.compat.v1

# Equality tests: TF32 off, op determinism on (tests/conftest.py).
pytestmark = pytest.mark.exact

SHAPE = (6, 6, 2)


def _net(images, training):
    x = layers.conv2d(images, 4, 3, activation=None, use_bias=False, name='conv')
    x = tf.nn.relu(layers.batch_norm(x, training, decay=0.5, name='bn'))
    return layers.dense(x, 3, name='logits')


@pytest.fixture(scope='module')
def graphs():
    """{(devices, sync_bn, variable_update): (TrainGraph, the list its feed reads step k's
    batch from)}, each graph built once and trained again, in a Session of its own, from each
    test's batches: building a three-tower graph costs more CPU than opening and training it."""
    return {}


def _train(graphs, devices, batches, initial=None, sync_bn=False,
           variable_update='parameter_server'):
    key = (tuple(devices), sync_bn, variable_update)
    if key not in graphs:
        fed_batches = []
        model = ClassifierModel(_net, SHAPE, 3, optimizer='sgd')
        graphs[key] = (build_training_graph(
            model, local_plan(devices, variable_update=variable_update), seed=1,
            source=fed(fed_batches), learning_rate=0.5, sync_bn=sync_bn), fed_batches)
    graph, fed_batches = graphs[key]
    fed_batches[:] = batches
    saved, _, steps = run_graph(graph, len(batches), initial, {'loss': graph.loss})
    return saved, [step['loss'] for step in steps]


def _batches(sizes, seed=0):
    rng = np.random.RandomState(seed)
    # Per-example offsets make each slice's moments differ from the batch's.
    return [((rng.rand(n, *SHAPE) + rng.rand(n, 1, 1, 1) * 3).astype(np.float32),
             rng.randint(0, 3, n)) for n in sizes]


@pytest.fixture(scope='module')
def initial(graphs):
    return _train(graphs, ['/cpu:0'], [])[0]


@pytest.mark.parametrize('devices,sizes,variable_update', [
    (['/cpu:0', '/cpu:1'], [8, 8, 8], 'parameter_server'),
    (['/cpu:0', '/cpu:1', '/cpu:2'], [7, 5, 8], 'parameter_server'),   # 3/2/2, 2/2/1, ...
    (['/cpu:0', '/cpu:1', '/cpu:2'], [2, 7], 'parameter_server'),      # 1/1/0: an empty tower
    (['/cpu:0', '/cpu:1', '/cpu:2'], [7, 5], 'replicated')])
def test_sync_bn_on_n_towers_equals_one_device_on_the_whole_batch(graphs, initial, devices,
                                                                    sizes, variable_update):
    batches = _batches(sizes)
    expected, expected_losses = _train(graphs, ['/cpu:0'], batches, initial)
    got, losses = _train(graphs, devices, batches, initial, sync_bn=True,
                         variable_update=variable_update)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=2e-4, atol=1e-5,
                                   err_msg=name)


def test_without_sync_bn_each_tower_normalises_its_own_slice(graphs, initial):
    batches = _batches([8, 8])
    expected, expected_losses = _train(graphs, ['/cpu:0'], batches, initial)
    got, losses = _train(graphs, ['/cpu:0', '/cpu:1'], batches, initial)
    # Same first loss would need the same moments: per-slice moments differ.
    assert not np.allclose(losses[0], expected_losses[0], rtol=1e-4)
    # The moving averages come from tower 0's slice only (the first half of the batch).
    images = batches[0][0][:4]
    conv = tf.nn.conv2d(images, initial['conv/weights'], 1, 'SAME').numpy()
    mean = conv.mean(axis=(0, 1, 2))
    after_one, _ = _train(graphs, ['/cpu:0', '/cpu:1'], batches[:1], initial)
    np.testing.assert_allclose(after_one['bn/moving_mean'], 0.5 * mean, rtol=1e-4, atol=1e-6)
