"""--optimizer lars: the trust ratio as You et al. and MLPerf's reference take it, the decay
its own, the variables it leaves out, N towers as one device; the poly schedule it runs with."""
import numpy as np
import pytest
import tensorflow as tf

from tests.harness import fed, run_graph
from towers.deviceplan import local_plan
from towers.graph import build_training_graph
from towers.lars import EPSILON, ETA, LARSOptimizer
from towers.model import ClassifierModel
from towers.models import layers
from towers.schedules import LearningRate

tf1 = tf.compat.v1

SHAPE = (6, 6, 2)


def _step(w, g, rate, decay, scaled=r'.', steps=2, momentum=0.9):
    """Values of w after `steps` LARS applies of the same gradient g."""
    with tf.Graph().as_default(), tf1.Session() as sess:
        var = tf1.get_variable('kernel', initializer=np.asarray(w, np.float32),
                               use_resource=True)
        opt = LARSOptimizer(rate, momentum, decay, scaled)
        train = opt.apply_gradients([(tf.constant(g, tf.float32), var)])
        sess.run(tf1.global_variables_initializer())
        for _ in range(steps):
            sess.run(train)
        return sess.run(var)


def _expected(w, g, rate, decay, steps=2, momentum=0.9, scaled=True):
    w, g, v = np.asarray(w, np.float64), np.asarray(g, np.float64), 0.0
    for _ in range(steps):
        if scaled:
            trust = ETA * np.linalg.norm(w) / (np.linalg.norm(g) + decay * np.linalg.norm(w)
                                               + EPSILON)
            step = trust * (g + decay * w)
        else:
            step = g
        v = momentum * v + rate * step
        w = w - v
    return w


def test_each_step_is_momentum_on_the_trust_scaled_decayed_gradient():
    w, g = [[3.0, -4.0], [1.0, 2.0]], [[0.5, 0.25], [-1.0, 0.0]]
    np.testing.assert_allclose(_step(w, g, 10.0, 2e-4), _expected(w, g, 10.0, 2e-4), rtol=1e-6)
    # A variable the pattern leaves out (batch norm, biases) steps as plain momentum: no
    # ratio, no decay.
    np.testing.assert_allclose(_step(w, g, 0.1, 2e-4, scaled=r'weights$'),
                               _expected(w, g, 0.1, 2e-4, scaled=False), rtol=1e-6)


def test_a_zero_weight_or_gradient_takes_the_rate_itself():
    zero = [[0.0, 0.0]]
    # ||w|| = 0 (a fresh bias-like kernel): trust 1, the decayed gradient at the plain rate.
    np.testing.assert_allclose(_step(zero, [[1.0, -2.0]], 0.1, 0.0, steps=1), [[-0.1, 0.2]],
                               rtol=1e-6)
    np.testing.assert_array_equal(_step([[1.0, 2.0]], zero, 0.1, 0.0, steps=1), [[1.0, 2.0]])


def _net(images, training):
    x = layers.conv2d(images, 4, 3, activation=None, use_bias=False, name='conv')
    x = tf.nn.relu(layers.batch_norm(x, training, decay=0.5, name='bn'))
    return layers.dense(x, 3, name='logits')


def _trained(devices):
    rng = np.random.RandomState(0)
    batches = [(rng.rand(9, *SHAPE).astype(np.float32), rng.randint(0, 3, 9)) for _ in range(3)]
    model = ClassifierModel(_net, SHAPE, 3, optimizer='lars', weight_decay=2e-4)
    graph = build_training_graph(model, local_plan(devices), seed=1, source=fed(batches),
                                 learning_rate=5.0, sync_bn=len(devices) > 1)
    return run_graph(graph, len(batches))[0]


@pytest.mark.exact
def test_three_towers_take_one_devices_lars_steps():
    one, three = _trained(['/cpu:0']), _trained(['/cpu:0', '/cpu:1', '/cpu:2'])  # 3/3/3
    for name in one:
        np.testing.assert_allclose(three[name], one[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_poly_decays_from_the_rate_to_its_end_after_the_warm_up():
    schedule = LearningRate.parse(10.0, 'poly:2,0.0001', warmup_epochs=1)
    assert schedule.describe() == ('polynomial (power 2) from 10 to 0.0001 over the run, linear '
                                   'warm-up over 1 epochs')
    with tf.Graph().as_default(), tf1.Session() as sess:
        step = tf1.placeholder(tf.int64, [])
        rate = schedule.build(step, steps_per_epoch=4, total_steps=12)
        rates = [sess.run(rate, {step: s}) for s in (0, 3, 4, 8, 12)]
    # A warm-up of 4 steps, then (1 - t/8)^2 over the 8 after it, down to 0.0001.
    expected = [10 * 1 / 4, 10.0, 10.0, (10 - 1e-4) * 0.25 + 1e-4, 1e-4]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)


def test_a_bad_poly_is_one_line():
    with pytest.raises(Exception, match=r'POWER must be positive and END lie in \[0, the '
                                        r'rate\)'):
        LearningRate.parse(0.1, 'poly:2,0.5')
