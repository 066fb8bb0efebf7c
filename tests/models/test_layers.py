"""Tests for models/layers.py: numerics against numpy, variables, reuse, batch norm."""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from towers.models import layers, layout
from towers.models.bias_gradient import fused_bias_gradient_sums_wide
from towers.precision import Precision

tf1 = tf.compat.v1

# The numerics against numpy to 1e-5 are marked exact: TF32 off and op determinism on
# (tests/conftest.py), as on a GPU float32 convolutions and matmuls would otherwise run as TF32.
def _np_conv2d(x, w, b, stride, padding):
    """Reference NHWC convolution with TF's SAME/VALID padding rules."""
    _, height, width, _ = x.shape
    kh, kw, _, filters = w.shape
    if padding == 'SAME':
        out_h, out_w = -(-height // stride), -(-width // stride)
        pad_h = max((out_h - 1) * stride + kh - height, 0)
        pad_w = max((out_w - 1) * stride + kw - width, 0)
        # TF puts the odd padding pixel after, not before.
        x = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                       (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    else:
        out_h, out_w = (height - kh) // stride + 1, (width - kw) // stride + 1
    out = np.zeros((x.shape[0], out_h, out_w, filters))
    for i in range(out_h):
        for j in range(out_w):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            out[:, i, j, :] = np.tensordot(patch, w, axes=([1, 2, 3], [0, 1, 2]))
    return out + b


@pytest.mark.exact
@pytest.mark.parametrize('stride,padding', [(1, 'SAME'), (2, 'SAME'), (1, 'VALID'),
                                            (2, 'VALID')])
@pytest.mark.parametrize('activation', [None, tf.nn.relu])
def test_conv2d_matches_numpy(stride, padding, activation):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 6, 3)).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 4)).astype(np.float32)
    b = rng.normal(size=4).astype(np.float32)
    with tf.Graph().as_default():
        y = layers.conv2d(tf.constant(x), 4, 3, strides=stride, padding=padding,
                          activation=activation,
                          kernel_initializer=tf1.constant_initializer(w),
                          bias_initializer=tf1.constant_initializer(b), name='conv')
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            got = sess.run(y)
    expected = _np_conv2d(x.astype(np.float64), w, b, stride, padding)
    if activation is not None:
        expected = np.maximum(expected, 0)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_conv2d_variables_and_default_initializers():
    with tf.Graph().as_default():
        layers.conv2d(tf.zeros([1, 8, 8, 3]), 16, 5, name='conv1')
        variables = {v.op.name: v for v in tf1.trainable_variables()}
        assert {n: v.shape.as_list() for n, v in variables.items()} == {
            'conv1/weights': [5, 5, 3, 16], 'conv1/biases': [16]}
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            weights, biases = sess.run([variables['conv1/weights'], variables['conv1/biases']])
    assert np.all(biases == 0)
    assert np.std(weights) > 0


@pytest.mark.parametrize('stride,padding,out_hw', [(1, 'SAME', (7, 9)), (2, 'SAME', (4, 5)),
                                                   (2, 'VALID', (3, 4))])
def test_conv2d_empty_and_dynamic_shapes(stride, padding, out_hw):
    # TF's CPU Conv2D returns its input unchanged on an empty batch; conv2d must not.
    with tf.Graph().as_default():
        x = tf1.placeholder(tf.float32, [None, None, None, 3])
        y = layers.conv2d(x, 8, 3, strides=stride, padding=padding)
        assert y.shape.as_list() == [None, None, None, 8]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for batch in (0, 2):
                out = sess.run(y, {x: np.ones((batch, 7, 9, 3), np.float32)})
                assert out.shape == (batch, *out_hw, 8)


@pytest.mark.parametrize('device,shape,reshaped', [
    ('/cpu:0', [None, 8, 8, 3], True),  # oneDNN's Conv2D may hand back an empty batch's input
    ('', [None, 8, 8, 3], True),  # no device: the placer may choose a CPU
    ('/job:worker/task:1', [None, 8, 8, 3], True),  # a task's own device: its CPU
    ('/cpu:0', [0, 8, 8, 3], True),  # empty for sure
    ('/gpu:0', [None, 8, 8, 3], False),  # a GPU's Conv2D shapes an empty output right
    ('/job:worker/task:0/device:GPU:1', [None, 8, 8, 3], False),
    ('/cpu:0', [2, 8, 8, 3], False),  # a static batch that is not empty
])
def test_conv2d_reshapes_its_output_only_where_the_batch_can_come_back_empty(device, shape,
                                                                            reshaped):
    with tf.Graph().as_default() as graph, tf1.device(device):
        y = layers.conv2d(tf1.placeholder(tf.float32, shape), 8, 3, activation=None,
                          use_bias=False)
    assert y.op.type == ('Reshape' if reshaped else 'Conv2D')
    assert y.shape.as_list() == shape[:1] + [8, 8, 8]
    # Without it, nothing of the output shape's arithmetic is left in the graph either.
    types = {op.type for op in graph.get_operations()}
    assert ({'Reshape', 'Pack'} <= types) == reshaped
    assert reshaped or not {'Reshape', 'Shape', 'Pack', 'StridedSlice'} & types


@pytest.mark.exact
@pytest.mark.parametrize('shape', [(4, 6), (4, 2, 3, 1)])
def test_dense_matches_numpy_and_flattens(shape):
    rng = np.random.default_rng(1)
    x = rng.normal(size=shape).astype(np.float32)
    w = rng.normal(size=(6, 5)).astype(np.float32)
    b = rng.normal(size=5).astype(np.float32)
    with tf.Graph().as_default():
        y = layers.dense(tf.constant(x), 5, activation=tf.nn.relu,
                         kernel_initializer=tf1.constant_initializer(w),
                         bias_initializer=tf1.constant_initializer(b), name='fc')
        assert [v.op.name for v in tf1.trainable_variables()] == ['fc/weights', 'fc/biases']
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            got = sess.run(y)
    np.testing.assert_allclose(got, np.maximum(x.reshape(4, 6) @ w + b, 0), rtol=1e-5,
                               atol=1e-5)


def test_flatten_keeps_dynamic_batch():
    with tf.Graph().as_default():
        x = tf1.placeholder(tf.float32, [None, 2, 3, 4])
        y = layers.flatten(x)
        assert y.shape.as_list() == [None, 24]
        with tf1.Session() as sess:
            for batch in (0, 3):
                data = np.arange(batch * 24, dtype=np.float32).reshape(batch, 2, 3, 4)
                np.testing.assert_array_equal(sess.run(y, {x: data}), data.reshape(batch, 24))


def test_flatten_rejects_unknown_inner_dims():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match='static'):
            layers.flatten(tf1.placeholder(tf.float32, [None, None, 3]))


@pytest.mark.exact
def test_max_pool_matches_numpy():
    x = np.arange(2 * 4 * 6 * 3, dtype=np.float32).reshape(2, 4, 6, 3) % 7
    with tf.Graph().as_default(), tf1.Session() as sess:
        got = sess.run(layers.max_pool(tf.constant(x), 2, 2))
    expected = x.reshape(2, 2, 2, 3, 2, 3).max(axis=(2, 4))
    np.testing.assert_array_equal(got, expected)


def test_layers_share_variables_under_reuse():
    with tf.Graph().as_default():
        x = tf.zeros([2, 8, 8, 3])

        def net():
            return layers.dense(layers.conv2d(x, 4, 3, name='conv'), 2, name='fc')

        first = net()
        with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
            second = net()
        assert len(tf1.global_variables()) == 4
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            a, b = sess.run([first, second])
    np.testing.assert_array_equal(a, b)


def test_dropout_identity_unless_training():
    x = tf.constant(np.ones((4, 4), np.float32))
    assert layers.dropout(x, 0.5, training=False) is x
    assert layers.dropout(x, 0.0, training=True) is x


def test_dropout_in_training_zeroes_and_rescales():
    with tf.Graph().as_default(), tf1.Session() as sess:
        y = sess.run(layers.dropout(tf.ones([100, 100]), 0.5, training=True, seed=3))
    kept = y[y != 0]
    np.testing.assert_allclose(kept, 2.0)  # inverted dropout scales by 1 / (1 - rate)
    assert 0.45 < 1 - kept.size / y.size < 0.55


def test_dropout_rejects_tensor_training_and_bad_rate():
    with tf.Graph().as_default():
        x = tf.ones([2, 2])
        with pytest.raises(TypeError, match='Python bool'):
            layers.dropout(x, 0.5, training=tf.constant(True))
        with pytest.raises(ValueError, match='rate'):
            layers.dropout(x, 1.0, training=True)


def _bn_input(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(loc=[3.0, -2.0, 10.0], scale=[2.0, 0.5, 5.0],
                      size=(16, 4, 4, 3)).astype(np.float32)


def test_batch_norm_variables_and_collections():
    with tf.Graph().as_default():
        layers.batch_norm(tf.zeros([2, 3]), training=True, name='bn')
        assert sorted(v.op.name for v in tf1.trainable_variables()) == ['bn/beta', 'bn/gamma']
        moving = sorted(v.op.name for v in tf1.moving_average_variables())
        assert moving == ['bn/moving_mean', 'bn/moving_variance']
        assert len(tf1.global_variables()) == 4
        assert all(v.shape.as_list() == [3] for v in tf1.global_variables())
        assert len(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)) == 2


@pytest.mark.exact
def test_batch_norm_training_normalises_per_channel():
    x = _bn_input()
    with tf.Graph().as_default(), tf1.Session() as sess:
        y = layers.batch_norm(tf.constant(x), training=True)
        sess.run(tf1.global_variables_initializer())
        out = sess.run(y)
    np.testing.assert_allclose(out.mean(axis=(0, 1, 2)), 0, atol=1e-5)
    np.testing.assert_allclose(out.var(axis=(0, 1, 2)), 1, atol=1e-3)


@pytest.mark.exact
def test_batch_norm_update_ops_follow_moving_average_formula():
    decay = 0.9
    batches = [_bn_input(1), _bn_input(2)]
    with tf.Graph().as_default(), tf1.Session() as sess:
        x = tf1.placeholder(tf.float32, [None, 4, 4, 3])
        layers.batch_norm(x, training=True, decay=decay, name='bn')
        updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        moving_mean, moving_var = tf1.moving_average_variables()
        sess.run(tf1.global_variables_initializer())
        expected_mean, expected_var = np.zeros(3), np.ones(3)  # the initial values
        for batch in batches:
            sess.run(updates, {x: batch})
            expected_mean = expected_mean * decay + batch.mean(axis=(0, 1, 2)) * (1 - decay)
            expected_var = expected_var * decay + batch.var(axis=(0, 1, 2)) * (1 - decay)
            got_mean, got_var = sess.run([moving_mean, moving_var])
            np.testing.assert_allclose(got_mean, expected_mean, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got_var, expected_var, rtol=1e-5, atol=1e-6)


@pytest.mark.exact
def test_batch_norm_inference_uses_moving_stats():
    x = _bn_input()
    mean, var = np.array([1.0, -1.0, 4.0]), np.array([4.0, 0.25, 9.0])
    gamma, beta = np.array([2.0, 1.0, 0.5]), np.array([0.0, 1.0, -1.0])
    with tf.Graph().as_default(), tf1.Session() as sess:
        y = layers.batch_norm(tf.constant(x), training=False, epsilon=1e-3, name='bn')
        assert tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) == []
        sess.run(tf1.global_variables_initializer())
        variables = {v.op.name: v for v in tf1.global_variables()}
        sess.run([tf1.assign(variables['bn/' + n], value) for n, value in [
            ('moving_mean', mean), ('moving_variance', var), ('gamma', gamma), ('beta', beta)]])
        out = sess.run(y)
    expected = (x - mean) / np.sqrt(var + 1e-3) * gamma + beta
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_batch_norm_shares_variables_under_reuse():
    with tf.Graph().as_default():
        x = tf.zeros([2, 4, 4, 3])
        layers.batch_norm(x, training=True)
        with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
            layers.batch_norm(x, training=False)
        assert len(tf1.global_variables()) == 4


def test_dropout_in_a_training_graph_is_stateless_and_each_call_draws_its_own_mask():
    with tf.Graph().as_default() as graph:
        graph.seed = 3
        step = tf1.train.get_or_create_global_step()
        x = tf.ones([4, 64])
        first, second = layers.dropout(x, 0.5, True), layers.dropout(x, 0.5, True)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            a1, b1 = sess.run([first, second])
            a2 = sess.run(first)
            step.load(1, sess)
            a3 = sess.run(first)
    # Two calls in one scope: two masks. The same step: the same mask, run after run
    # (a resumed run sees it again). The next step: another.
    assert not np.array_equal(a1 == 0, b1 == 0)
    np.testing.assert_array_equal(a1, a2)
    assert not np.array_equal(a1, a3)


def _bias_gradient_in(device):
    """(gradient of a bf16 conv's bias as towers reads it, float32's sum rounded once,
    whether the bias add is plain TensorFlow's) of conv2d on `device`."""
    rng = np.random.RandomState(0)
    with tf.Graph().as_default() as graph, tf1.device(device):
        images = tf.constant(rng.randn(64, 28, 28, 4).astype(np.float32))
        getter = Precision('bf16').getter()
        with tf1.variable_scope('net', custom_getter=getter):
            maps = layers.conv2d(tf.cast(images, tf.bfloat16), 16, 5, name='conv',
                                 bias_initializer=tf1.constant_initializer(0.1))
        weights, biases = tf1.trainable_variables()
        upstream = tf.constant(rng.randn(64, 28, 28, 16).astype(np.float32))
        loss = tf.reduce_sum(tf.cast(maps, tf.float32) * upstream)
        grads = tf.gradients(loss, [weights, biases])
        pre_activation = maps.op.inputs[0]  # relu(bias_add(...))
        wide = tf.reduce_sum(tf.cast(tf.gradients(loss, pre_activation)[0], tf.float32),
                             [0, 1, 2])
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            _, got, expected = sess.run(grads + [wide])
    once = expected.astype(tf.bfloat16.as_numpy_dtype).astype(np.float32)
    return got, once, pre_activation.op.type == 'BiasAdd'


def test_bf16_conv_bias_gradient_is_float32s_sum_rounded_once_on_cpu():
    # Where the probe found TensorFlow's own bias gradient fused into the conv's weight
    # gradient, towers uses it: it must be float32's sum rounded once, bit for bit, as the
    # wide sum (layers._add_bias) is, which stays everywhere else.
    got, once, plain = _bias_gradient_in('/cpu:0')
    assert plain == fused_bias_gradient_sums_wide()
    np.testing.assert_array_equal(got, once)


def test_bf16_conv_off_the_cpu_keeps_the_wide_bias_gradient():
    with tf.Graph().as_default(), tf1.device('/gpu:0'):
        maps = layers.conv2d(tf.zeros([2, 8, 8, 3], tf.bfloat16), 4, 3, name='conv')
    assert maps.op.inputs[0].op.type == 'IdentityN'  # tf.custom_gradient's


def _lrn_and_gradient(x, upstream, data_format='NHWC'):
    """(LRN of x, its gradient against upstream) by layers.local_response_norm."""
    with layout.data_format(data_format):
        y = layers.local_response_norm(x, depth_radius=2, bias=1.0, alpha=0.1, beta=0.75)
    return y, tf.gradients(y, x, upstream)[0]


@pytest.mark.parametrize('data_format', ['NHWC', 'NCHW'])
@pytest.mark.parametrize('static', [False, True])
def test_local_response_norm_on_an_empty_batch(data_format, static):
    # cuDNN's LRN aborts the process on an empty batch; the layer must not run it there.
    shape = (0, 5, 6, 8) if data_format == 'NHWC' else (0, 8, 5, 6)
    with tf.Graph().as_default(), tf1.Session() as sess:
        x = tf1.placeholder(tf.float32, shape if static else (None, *shape[1:]))
        upstream = tf1.placeholder(tf.float32, x.shape)
        y, grad = _lrn_and_gradient(x, upstream, data_format)
        feed = {x: np.zeros(shape, np.float32), upstream: np.zeros(shape, np.float32)}
        metadata = tf1.RunMetadata()
        got, got_grad = sess.run([y, grad], feed, run_metadata=metadata,
                                 options=tf1.RunOptions(trace_level=tf1.RunOptions.SOFTWARE_TRACE))
    assert got.shape == shape and got_grad.shape == shape
    # Neither kernel ran (what keeps a GPU's from aborting), forward or backward.
    ran = {node.timeline_label.split(' = ')[-1].split('(')[0]
           for device in metadata.step_stats.dev_stats for node in device.node_stats}
    assert ran and not ran & {'LRN', 'LRNGrad'}


def test_local_response_norm_is_plain_lrn_bit_for_bit():
    rng = np.random.default_rng(2)
    values = rng.normal(size=(3, 5, 6, 8)).astype(np.float32)
    upstreams = rng.normal(size=(3, 5, 6, 8)).astype(np.float32)
    with tf.Graph().as_default(), tf1.Session() as sess:
        x = tf1.placeholder(tf.float32, [None, 5, 6, 8])  # dynamic: the cond's path
        upstream = tf1.placeholder(tf.float32, x.shape)
        y, grad = _lrn_and_gradient(x, upstream)
        plain = tf.nn.local_response_normalization(x, depth_radius=2, bias=1.0, alpha=0.1,
                                                   beta=0.75)
        plain_grad = tf.gradients(plain, x, upstream)[0]
        got = sess.run([y, grad, plain, plain_grad], {x: values, upstream: upstreams})
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_array_equal(got[1], got[3])


# cifar_convnet (two LRNs) forward and backward on the GPU, batch 0 then 2, in a process of
# its own: a kernel's CHECK failure aborts that process, not pytest's.
_CIFAR_ON_THE_GPU = '''
import numpy as np
import tensorflow as tf
from towers import models
tf1 = tf.compat.v1
with tf.Graph().as_default():
    with tf1.device('/gpu:0'):
        images = tf1.placeholder(tf.float32, [None, 24, 24, 3])
        logits = models.build_model('cifar_convnet', (24, 24, 3), 10)(images, True)
        grads = tf.gradients(tf.reduce_sum(logits), tf1.trainable_variables())
    with tf1.Session(config=tf1.ConfigProto(allow_soft_placement=True)) as sess:
        sess.run(tf1.global_variables_initializer())
        for batch in (0, 2):
            metadata = tf1.RunMetadata()
            sess.run(grads, {images: np.ones((batch, 24, 24, 3), np.float32)},
                     options=tf1.RunOptions(output_partition_graphs=True),
                     run_metadata=metadata)
            lrn = {node.device for part in metadata.partition_graphs for node in part.node
                   if node.op in ('LRN', 'LRNGrad')}
            assert lrn and all('GPU' in device for device in lrn), lrn
print('ran')
'''


@pytest.mark.gpu
@pytest.mark.skipif(not tf.config.list_physical_devices('GPU'), reason='needs a GPU')
def test_cifar_convnet_trains_on_an_empty_batch_on_the_gpu():
    done = subprocess.run([sys.executable, '-c', _CIFAR_ON_THE_GPU], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == 'ran', done.stderr[-3000:]
