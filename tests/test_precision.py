"""Mixed precision: float32 master weights, towers in bf16 or fp16, a loss scale that skips."""
import numpy as np
import pytest
import tensorflow as tf

from tests import easy_digits, harness
from towers import data, models
from towers.config import TrainConfig
from towers.deviceplan import DevicePlan, local_plan
from towers.devices import session_config
from towers.errors import SettingError
from towers.graph import build_training_graph
from towers.model import ClassifierModel
from towers.precision import Precision, all_finite
from towers.session import run_steps
from towers.tools.export import export_saved_model
from towers.trainer import train

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)


def _batches(count, size=20, seed=0):
    rng = np.random.RandomState(seed)
    return [easy_digits.images_and_labels(size, rng) for _ in range(count)]


def _graph(precision, batches, towers=1, variable_update='parameter_server', model_fn=None,
           sync_bn=False, optimizer='adam'):
    model_fn = model_fn or models.build_model('small_convnet', SHAPE, 10)
    model = ClassifierModel(model_fn, SHAPE, 10, optimizer=optimizer)
    devices = ['/cpu:%d' % i for i in range(towers)]
    graph = build_training_graph(model, local_plan(devices, variable_update=variable_update),
                                 seed=0, source=harness.fed(batches), learning_rate=0.01,
                                 precision=precision, sync_bn=sync_bn)
    return graph, devices


def _types(graph, op_type, scope):
    return {op.get_attr('T') for op in graph.graph.get_operations()
            if op.type == op_type and op.name.startswith(scope)}


def test_variables_stay_float32_and_every_tower_computes_in_bf16():
    graph, _ = _graph('bf16', _batches(1), towers=2)
    with graph.graph.as_default():
        assert {v.dtype.base_dtype for v in tf1.global_variables()
                if v.dtype.base_dtype.is_floating} == {tf.float32}
    for scope in ('tower_0/', 'tower_1/', 'eval/'):
        assert _types(graph, 'Conv2D', scope) == {tf.bfloat16}, scope
        assert _types(graph, 'MatMul', scope) == {tf.bfloat16}, scope
    # The softmax, the loss and the averaged gradients are float32.
    assert _types(graph, 'SparseSoftmaxCrossEntropyWithLogits', 'tower_') == {tf.float32}
    assert graph.loss.dtype == tf.float32
    assert {g.dtype for t in graph.towers for g, _ in t.grads_and_vars} == {tf.float32}


def test_bf16_starts_from_the_fp32_weights_and_trains_near_them():
    batches = _batches(4)
    runs = {}
    for precision in ('fp32', 'bf16'):
        # SGD: an update in proportion to the gradient (Adam's sign-like one turns a
        # rounding near 0 into a full step).
        graph, devices = _graph(precision, batches, towers=2, optimizer='sgd')
        with harness.open_graph(graph) as sess:
            initial = sess.run(harness.saved_variables(graph))
        runs[precision] = initial, harness.run_graph(graph, len(batches))[0]
    for name, value in runs['fp32'][0].items():  # the same float32 initial weights
        np.testing.assert_array_equal(runs['bf16'][0][name], value, err_msg=name)
    after32, after16 = runs['fp32'][1], runs['bf16'][1]
    largest = max(float(np.max(np.abs(after32[n] - after16[n]))) for n in after32)
    assert 0 < largest < 0.01  # bf16 rounding shows, and stays small


def _step_by_step(graph, devices, steps):
    """Every global variable {name: value} before the first step and after each one."""
    with harness.open_graph(graph) as sess:
        with graph.graph.as_default():
            everything = {v.op.name: v for v in tf1.global_variables()}
        states = [sess.run(everything)]
        with run_steps(sess, graph.source, {'train_op': graph.train_op}, 0, steps) as loop:
            for _ in loop:
                states.append(sess.run(everything))
    return states


def _model_state(state):
    return {n: v for n, v in state.items() if not n.startswith(('loss_scale/', 'global_step'))}


def test_dynamic_loss_scale_skips_what_overflows_and_follows_its_rule():
    # From 2**40 every float16 gradient overflows until the scale has halved enough;
    # then it doubles after 3 finite steps, overflows again, and so on.
    steps = 36
    precision = Precision('fp16', initial_scale=2.0 ** 40, growth_steps=3)
    graph, devices = _graph(precision, _batches(steps))
    states = _step_by_step(graph, devices, steps)
    scale, streak, skipped, applied_steps = 2.0 ** 40, 0, 0, 0
    for step, (before, after) in enumerate(zip(states, states[1:]), start=1):
        assert after['global_step'] == step  # a skipped step is still a step
        model_before, model_after = _model_state(before), _model_state(after)
        applied = any(not np.array_equal(model_before[n], model_after[n]) for n in model_before)
        if applied:
            streak += 1
            applied_steps += 1
            if streak == 3:
                scale, streak = scale * 2, 0
        else:  # nothing moved: no variable, no Adam slot, no beta power
            for name in model_before:
                np.testing.assert_array_equal(model_after[name], model_before[name], name)
            scale, streak, skipped = scale / 2, 0, skipped + 1
        assert (after['loss_scale/scale'], after['loss_scale/good_steps'],
                after['loss_scale/skipped_steps']) == (scale, streak, skipped), step
    assert skipped >= 15 and applied_steps >= 6  # both kinds of step really happened
    assert scale < 2.0 ** 20


@pytest.mark.exact
def test_replicated_copies_skip_together_and_stay_equal():
    steps = 16
    precision = Precision('fp16', initial_scale=2.0 ** 24)
    graph, devices = _graph(precision, _batches(steps), towers=2, variable_update='replicated')
    _, everything, _ = harness.run_graph(graph, steps)
    assert 0 < everything['loss_scale/skipped_steps'] < steps
    replicas = [n for n in everything if n.startswith('replica_1/')]
    assert replicas
    for name in replicas:
        np.testing.assert_array_equal(everything[name], everything[name[len('replica_1/'):]],
                                      err_msg=name)


def _bn_net(images, training):
    net = models.layers.conv2d(images, 8, 3, activation=None, use_bias=False, name='conv')
    net = tf.nn.relu(models.layers.batch_norm(net, training, name='bn'))
    return models.layers.dense(net, 10, name='logits')


def test_batch_norm_keeps_float32_statistics_under_bf16_and_sync_bn():
    graph, devices = _graph('bf16', _batches(2), towers=2, model_fn=_bn_net, sync_bn=True)
    assert _types(graph, 'Conv2D', 'tower_') == {tf.bfloat16}
    with graph.graph.as_default():
        moving = {v.op.name: v.dtype.base_dtype for v in tf1.global_variables()
                  if 'moving' in v.op.name}
    assert moving == {'bn/moving_mean': tf.float32, 'bn/moving_variance': tf.float32}
    # The moments are pooled over the towers in float32.
    assert _types(graph, 'CollectiveReduce', 'tower_') == {tf.float32}
    _, everything, _ = harness.run_graph(graph, 2)
    assert np.all(np.isfinite(everything['bn/moving_variance']))
    assert not np.array_equal(everything['bn/moving_mean'], np.zeros(8, np.float32))


def _lrn_net(images, training):
    net = models.layers.conv2d(images, 8, 3, name='conv')
    return models.layers.dense(tf.nn.local_response_normalization(net), 10, name='logits')


def test_an_op_without_a_kernel_for_the_precision_is_one_line():
    with pytest.raises(SettingError) as error:
        _graph('bf16', _batches(1), model_fn=_lrn_net)
    assert str(error.value) == (
        'precision bf16: LRN (tower_0/LRN) has no CPU kernel for bfloat16 on this TensorFlow; '
        'train this model in another precision')


@pytest.mark.skipif(tf.test.is_built_with_cuda(), reason='this TensorFlow has GPU kernels')
def test_fp16_on_a_device_without_fp16_kernels_is_one_line():
    model = ClassifierModel(models.build_model('small_convnet', SHAPE, 10), SHAPE, 10)
    with pytest.raises(SettingError, match=r'^precision fp16: \w+ \(tower_0/.*\) has no GPU '
                                           r'kernel for float16 on this TensorFlow'):
        # Built only, on a plan naming a GPU this machine need not have.
        build_training_graph(model, DevicePlan(['/gpu:0']), source=harness.fed(_batches(1)),
                             precision='fp16')


def _datasets():
    rng = np.random.RandomState(0)
    return data.Datasets(data.DataSet(*easy_digits.images_and_labels(200, rng), seed=0),
                         data.DataSet(np.zeros([0, 28, 28, 1], np.float32),
                                      np.zeros([0], np.int64)),
                         data.DataSet(*easy_digits.images_and_labels(40, rng), seed=0))


def _train(logdir, steps, towers=1, **settings):
    """towers.train on `towers` CPU towers; (its result, the lines it logged)."""
    lines = []
    config = TrainConfig(towers=tuple('/cpu:%d' % i for i in range(towers)), batch_size=20,
                         steps=steps, logdir=logdir, log_every=1000, warmup_steps=0,
                         eval_every=0, checkpoint_every=0, **settings)
    result = train(config, models.build_model('small_convnet', SHAPE, 10), _datasets(), SHAPE,
                   log=lines.append)
    return result, lines


def _checkpoint(logdir):
    return {name: tf.train.load_variable(logdir, name)
            for name, _ in tf1.train.list_variables(logdir)}


@pytest.mark.exact
def test_fp16_resumes_exactly_with_its_loss_scale(tmp_path):
    straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
    _train(straight, 8, precision='fp16')
    _train(resumed, 4, precision='fp16')
    _, lines = _train(resumed, 8, precision='fp16')
    assert any(line.startswith('resumed from') for line in lines)
    expected, actual = _checkpoint(straight), _checkpoint(resumed)
    assert expected.keys() == actual.keys()
    assert expected['loss_scale/good_steps'] + expected['loss_scale/skipped_steps'] > 4
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-6, atol=1e-7,
                                   err_msg=name)


def test_a_checkpoint_moves_between_precisions(tmp_path):
    logdir = str(tmp_path / 'run')
    _train(logdir, 2, precision='bf16')
    held = _checkpoint(logdir)
    assert {v.dtype for v in held.values() if v.dtype.kind == 'f'} == {np.dtype(np.float32)}
    result, lines = _train(logdir, 4, precision='fp16')  # no loss scale there yet
    assert any('holds no dynamic loss scale (trained in another precision, or with a fixed '
               'scale): the scale starts at 32768' in line for line in lines), lines
    assert result['steps'] == 4 and 'loss_scale/scale' in _checkpoint(logdir)
    result, lines = _train(logdir, 6)  # and back to fp32, the loss scale left behind
    assert result['steps'] == 6 and any(line.startswith('resumed from') for line in lines)


def test_export_of_a_bf16_run_is_float32(tmp_path):
    logdir = str(tmp_path / 'run')
    _train(logdir, 2, precision='bf16')
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    out = export_saved_model(model_fn, SHAPE, tf.train.latest_checkpoint(logdir),
                             str(tmp_path / 'export'))
    images = easy_digits.images_and_labels(5, np.random.RandomState(1))[0]
    serve = tf.saved_model.load(out).signatures['serving_default']
    assert serve.structured_input_signature[1]['images'].dtype == tf.float32
    # Both on the CPU: on a GPU each would compute in TF32, and exact() cannot turn that
    # off here (its op determinism refuses the export graph's unseeded initializers).
    with tf.device('/cpu:0'):
        probabilities = serve(images=tf.constant(images))['probabilities'].numpy()
    with tf.Graph().as_default() as graph, tf.device('/cpu:0'):
        logits = model_fn(tf.constant(images), False)
        with tf1.Session(graph=graph) as sess:
            tf1.train.Saver().restore(sess, tf.train.latest_checkpoint(logdir))
            expected = sess.run(tf.nn.softmax(logits))
    np.testing.assert_allclose(probabilities, expected, rtol=1e-5, atol=1e-6)


_SUMS = ('/biases', '/beta', '/gamma')


def _gradients(precision, model_fn, images, labels):
    """{name: gradient} of the variables whose gradient sums the batch (_SUMS): only those,
    so the Session skips the weight gradients (most of a bfloat16 step's CPU here)."""
    graph, devices = _graph(precision, [(images, labels)], model_fn=model_fn, optimizer='sgd')
    grads = {v.op.name: g for g, v in graph.towers[0].grads_and_vars
             if v.op.name.endswith(_SUMS)}
    with harness.open_graph(graph) as sess:
        return sess.run(grads, graph.source.step(0)[1])


@pytest.mark.exact
def test_bf16_gradients_sum_over_the_batch_in_float32():
    # A bias's gradient sums every example and position: in bfloat16 (TensorFlow's
    # BiasAddGrad) conv1's lost a third of itself; batch norm's beta and gamma likewise.
    images, labels = easy_digits.images_and_labels(100, np.random.RandomState(0))
    for model_fn in (models.build_model('mnist_convnet', SHAPE, 10, dropout_rate=0.0), _bn_net):
        wide = _gradients('fp32', model_fn, images, labels)
        low = _gradients('bf16', model_fn, images, labels)
        sums = [n for n in wide if n.endswith(_SUMS)]
        assert len(sums) >= 3
        for name in sums:  # summed in bfloat16, conv1/biases was off by 13% here
            error = np.max(np.abs(wide[name] - low[name])) / np.max(np.abs(wide[name]))
            assert error < 0.03, (name, error)


def test_dropout_drops_the_same_units_in_every_precision():
    masks = []
    for dtype in (tf.float32, tf.bfloat16, tf.float16):
        with tf.Graph().as_default() as graph:
            tf1.set_random_seed(3)
            tf1.train.get_or_create_global_step()
            kept = models.layers.dropout(tf.ones([64, 32], dtype), 0.5, True)
            with tf1.Session(graph=graph) as sess:
                sess.run(tf1.global_variables_initializer())
                masks.append(sess.run(tf.cast(kept, tf.float32)))
    assert 0.3 < np.mean(masks[0] == 0) < 0.7
    for mask in masks[1:]:
        np.testing.assert_array_equal(mask, masks[0])


@pytest.mark.parametrize('input_mode,variable_update', [
    ('staging', 'independent'), ('dataset', 'replicated'), ('synthetic', 'parameter_server')])
def test_bf16_trains_with_every_input_and_strategy(input_mode, variable_update):
    result, _ = _train(None, 3, precision='bf16', input=input_mode,
                       variable_update=variable_update, towers=2)
    assert result['steps'] == 3 and np.isfinite(result['test_loss'])


def _overflowing_net(images, training):
    """small logits whose float16 gradient is Inf at any loss scale: a NaN no scale halves away."""
    logits = models.layers.dense(images, 10, name='logits')

    @tf.custom_gradient
    def blow_up(x):
        return x, lambda upstream: upstream * tf.constant(1e30, tf.float32)
    return tf.cast(blow_up(tf.cast(logits, tf.float32)), logits.dtype)


@pytest.mark.parametrize('initial_scale,finite', [(2.0, True), (1.0, False)])
def test_an_overflow_stops_the_run_only_at_scale_1(initial_scale, finite):
    precision = Precision('fp16', initial_scale=initial_scale)
    graph, devices = _graph(precision, _batches(1), model_fn=_overflowing_net)
    _, everything, steps = harness.run_graph(graph, 1, fetches={'finite': graph.finite})
    assert everything['loss_scale/skipped_steps'] == 1 and everything['loss_scale/scale'] == 1.0
    assert bool(steps[0]['finite']) is finite


def test_a_skipped_step_does_not_move_the_moving_average_of_the_weights():
    model = ClassifierModel(models.build_model('small_convnet', SHAPE, 10), SHAPE, 10)
    overflowing = Precision('fp16', initial_scale=2.0 ** 40)
    graph = build_training_graph(model, local_plan(['/cpu:0']), seed=0,
                                 source=harness.fed(_batches(1)), ema_decay=0.5,
                                 precision=overflowing)
    with harness.open_graph(graph) as sess:
        with graph.graph.as_default():
            shadows = {v.op.name: v for v in tf1.global_variables()
                       if v.op.name.endswith('ExponentialMovingAverage')}
        before = sess.run(shadows)
        with run_steps(sess, graph.source, {'train_op': graph.train_op}, 0, 1) as loop:
            list(loop)
        after = sess.run(shadows)
        assert sess.run(graph.loss_scale.skipped_steps) == 1
    assert shadows
    for name in shadows:
        np.testing.assert_array_equal(after[name], before[name], name)


def test_the_finite_guard_brings_one_scalar_per_device_to_the_host():
    """Each device's gradients checked and reduced where they are (on a GPU one copy to the
    host a step, not one a gradient), and still false for one NaN anywhere."""
    with tf.Graph().as_default() as graph:
        tensors, feeds = [], {}
        for device, count in (('/cpu:1', 3), ('/cpu:2', 2)):
            with tf.device(device):
                for i in range(count):
                    tensors.append(tf1.placeholder(tf.float32, [4]))
        with tf.device('/cpu:0'):
            finite = all_finite(tensors)
        reads = {t.device for op in graph.get_operations() if op.device.endswith('CPU:0')
                 for t in op.inputs if t.device != op.device}
        assert reads == {'/device:CPU:1', '/device:CPU:2'}
        crossing = [t for op in graph.get_operations() if op.device.endswith('CPU:0')
                    for t in op.inputs if t.device != op.device]
        assert len(crossing) == 2 and all(t.dtype == tf.bool and t.shape.rank == 0
                                          for t in crossing)
        with tf1.Session(graph=graph, config=session_config(['/cpu:0', '/cpu:1', '/cpu:2'])) \
                as sess:
            feeds = {t: np.ones(4, np.float32) for t in tensors}
            assert sess.run(finite, feeds)
            for bad in (np.nan, np.inf):
                for t in tensors:
                    values = np.ones(4, np.float32)
                    values[2] = bad
                    assert not sess.run(finite, {**feeds, t: values})
