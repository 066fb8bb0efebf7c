"""Tests for the models registry and the nets."""
import collections

import numpy as np
import pytest
import tensorflow as tf

from towers import models
from towers.models import ModelError, build_model

tf1 = tf.compat.v1



def _resnet_variables(n):
    """{name: shape} of ResNet-(6n+2) v1 for 32x32x3 and 10 classes."""
    def bn(scope, channels):
        return {'%s/%s' % (scope, v): [channels]
                for v in ('beta', 'gamma', 'moving_mean', 'moving_variance')}
    shapes = {'conv1/weights': [3, 3, 3, 16], **bn('bn1', 16),
              'logits/weights': [64, 10], 'logits/biases': [10]}
    previous = 16
    for stage, filters in enumerate((16, 32, 64), start=1):
        for block in range(1, n + 1):
            scope = 'stage%d/block%d' % (stage, block)
            shapes['%s/conv1/weights' % scope] = [3, 3, previous, filters]
            shapes['%s/conv2/weights' % scope] = [3, 3, filters, filters]
            shapes.update(bn(scope + '/bn1', filters))
            shapes.update(bn(scope + '/bn2', filters))
            previous = filters
    return shapes


# name, input_shape, {variable: shape}, trainable parameter count (worked out by hand).
CASES = [
    # conv1 5*5*1*32+32 = 832; conv2 5*5*32*64+64 = 51,264;
    # fc1 (7*7*64)*1024+1024 = 3,212,288; fc2 1024*10+10 = 10,250 -> 3,274,634.
    ('mnist_convnet', (28, 28, 1), {
        'conv1/weights': [5, 5, 1, 32], 'conv1/biases': [32],
        'conv2/weights': [5, 5, 32, 64], 'conv2/biases': [64],
        'fc1/weights': [3136, 1024], 'fc1/biases': [1024],
        'fc2/weights': [1024, 10], 'fc2/biases': [10]}, 3_274_634),
    # conv1 3*3*1*32+32 = 320; VALID 28 -> 26 -> pool 13; logits 13*13*32*10+10 = 54,090.
    ('small_convnet', (28, 28, 1), {
        'conv1/weights': [3, 3, 1, 32], 'conv1/biases': [32],
        'logits/weights': [5408, 10], 'logits/biases': [10]}, 54_410),
    # conv1 3*3*3*32+32 = 896; VALID 32 -> 30 -> pool 15; logits 15*15*32*10+10 = 72,010.
    ('small_convnet', (32, 32, 3), {
        'conv1/weights': [3, 3, 3, 32], 'conv1/biases': [32],
        'logits/weights': [7200, 10], 'logits/biases': [10]}, 72_906),
    # conv1 4,864; conv2 102,464; 32 -> pool 16 -> pool 8, local3 8*8*64*384+384 = 1,573,248;
    # local4 384*192+192 = 73,920; softmax_linear 192*10+10 = 1,930 -> 1,756,426.
    ('cifar_convnet', (32, 32, 3), {
        'conv1/weights': [5, 5, 3, 64], 'conv1/biases': [64],
        'conv2/weights': [5, 5, 64, 64], 'conv2/biases': [64],
        'local3/weights': [4096, 384], 'local3/biases': [384],
        'local4/weights': [384, 192], 'local4/biases': [192],
        'softmax_linear/weights': [192, 10], 'softmax_linear/biases': [10]}, 1_756_426),
    # As above but 24 -> 12 -> 6, local3 6*6*64*384+384 = 885,120 -> 1,068,298.
    ('cifar_convnet', (24, 24, 3), {
        'conv1/weights': [5, 5, 3, 64], 'conv1/biases': [64],
        'conv2/weights': [5, 5, 64, 64], 'conv2/biases': [64],
        'local3/weights': [2304, 384], 'local3/biases': [384],
        'local4/weights': [384, 192], 'local4/biases': [192],
        'softmax_linear/weights': [192, 10], 'softmax_linear/biases': [10]}, 1_068_298),
    # He et al. 2016, 6n + 2 layers, option-A shortcuts, no conv biases. resnet20 (n = 3):
    # conv1 3*3*3*16 = 432 + bn 32; stage1 6 convs * 2,304 = 13,824 + bn 6*32 = 192;
    # stage2 3*3*16*32 + 5 * 9,216 = 50,688 + bn 384; stage3 18,432 + 5 * 36,864 = 202,752
    # + bn 768; logits 64*10+10 = 650 -> 269,722 (the paper's 0.27M).
    ('resnet20', (32, 32, 3), _resnet_variables(3), 269_722),
    # n = 9: 432 + 32 + 18 * 2,304 + 576 + (4,608 + 17 * 9,216) + 1,152
    # + (18,432 + 17 * 36,864) + 2,304 + 650 = 853,018 (the paper's 0.85M).
    ('resnet56', (32, 32, 3), _resnet_variables(9), 853_018),
]
CASE_IDS = [f'{name}-{"x".join(map(str, shape))}' for name, shape, _, _ in CASES]


def _build(name, input_shape, training=True, num_classes=10, **options):
    model_fn = build_model(name, input_shape, num_classes, **options)
    images = tf1.placeholder(tf.float32, [None, *input_shape], name='images')
    return model_fn, images, model_fn(images, training)


class _TwoCalls:
    """A net called in training, in a graph of its own, then again under reuse for inference:
    what the first call left (variables, update ops) and the variables after the second."""

    def __init__(self, name, input_shape):
        with tf.Graph().as_default() as self.graph:
            model_fn, images, _ = _build(name, input_shape)
            self.variables = {v.op.name: v.shape.as_list() for v in tf1.global_variables()}
            self.before = [v.op.name for v in tf1.global_variables()]
            self.count = sum(v.shape.num_elements() for v in tf1.trainable_variables())
            self.updates = len(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
            with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
                model_fn(images, False)
            self.after = [v.op.name for v in tf1.global_variables()]


@pytest.fixture(scope='module')
def two_calls():
    """two_calls(name, input_shape): its _TwoCalls, built once for the module's tests, which
    only read it (a ResNet-56 takes 3 CPU-s of Python to build)."""
    built = {}

    def get(name, input_shape):
        if (name, input_shape) not in built:
            built[name, input_shape] = _TwoCalls(name, input_shape)
        return built[name, input_shape]
    return get


@pytest.mark.parametrize('name,input_shape,expected,count', CASES, ids=CASE_IDS)
def test_variables_names_shapes_and_count(two_calls, name, input_shape, expected, count):
    net = two_calls(name, input_shape)
    assert net.variables == expected
    assert net.count == count


@pytest.mark.parametrize('name,input_shape,expected,count', CASES, ids=CASE_IDS)
def test_logits_shape_with_dynamic_batch_including_empty(name, input_shape, expected, count):
    with tf.Graph().as_default():
        _, images, logits = _build(name, input_shape, training=False)
        assert logits.dtype == tf.float32
        assert logits.shape.as_list() == [None, 10]
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            # oneDNN's strided Conv2D on an empty batch hands back its input, and
            # grappler then drops the reshape that repairs it in layers.conv2d, so
            # the ResNets run batch 0 only with TF_ENABLE_ONEDNN_OPTS=0. Towers
            # never feed an empty batch (split_batch gives a stand-in example).
            for batch in (3,) if name.startswith('resnet') else (3, 0):
                data = np.random.default_rng(batch).random((batch, *input_shape), np.float32)
                out = sess.run(logits, {images: data})
                assert out.shape == (batch, 10)
                assert np.all(np.isfinite(out))


def test_a_gpu_towers_resnet_leaves_the_conv_reshape_and_its_shape_arithmetic_out():
    def types(device):
        with tf.Graph().as_default() as graph, tf1.device(device):
            images = tf1.placeholder(tf.float32, [None, 32, 32, 3])  # a tower's dynamic share
            logits = build_model('resnet20', (32, 32, 3), 10)(images, True)
            tf.gradients(tf.reduce_sum(logits), tf1.trainable_variables())
        return collections.Counter(op.type for op in graph.get_operations())
    cpu, gpu = types('/cpu:0'), types('/gpu:0')
    assert cpu['Conv2D'] == gpu['Conv2D'] == 19  # conv1 and two in each of 9 blocks
    # On a CPU each conv keeps it: a Reshape and its gradient's, the output shape's Pack of
    # the batch's StridedSlice of a Shape (and their constants); on a GPU none of them.
    extra = cpu - gpu
    assert not gpu - cpu and extra.pop('Const') > 0
    assert extra == {'Reshape': 38, 'Shape': 19, 'StridedSlice': 19, 'Pack': 19}


@pytest.mark.parametrize('name,input_shape', [(c[0], c[1]) for c in CASES], ids=CASE_IDS)
def test_second_call_under_reuse_creates_no_variables(two_calls, name, input_shape):
    net = two_calls(name, input_shape)
    assert net.after == net.before


def test_variables_follow_the_callers_device_function():
    # The tower builder pins variables to a parameter device; the nets must not override it.
    def device_fn(op):
        return '/job:ps/task:0' if op.type in ('VarHandleOp', 'VariableV2') else '/job:worker'

    with tf.Graph().as_default() as graph, graph.device(device_fn):
        _build('mnist_convnet', (28, 28, 1))
        assert {v.device for v in tf1.global_variables()} == {'/job:ps/task:0'}


def test_mnist_dropout_is_off_at_eval_and_on_in_training():
    with tf.Graph().as_default():
        model_fn, images, train_logits = _build('mnist_convnet', (28, 28, 1))
        with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
            eval_logits = model_fn(images, False)
        data = np.random.default_rng(0).random((8, 28, 28, 1), np.float32)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            eval_a, eval_b = (sess.run(eval_logits, {images: data}) for _ in range(2))
            train_a, train_b = (sess.run(train_logits, {images: data}) for _ in range(2))
    np.testing.assert_array_equal(eval_a, eval_b)
    assert not np.allclose(train_a, train_b)


def test_mnist_dropout_rate_zero_makes_training_deterministic():
    with tf.Graph().as_default():
        _, images, logits = _build('mnist_convnet', (28, 28, 1), dropout_rate=0.0)
        data = np.ones((2, 28, 28, 1), np.float32)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(logits, {images: data}),
                                          sess.run(logits, {images: data}))


def test_mnist_sizes_fc1_from_input_and_honours_num_classes():
    with tf.Graph().as_default():
        _, _, logits = _build('mnist_convnet', (32, 32, 3), num_classes=3)
        shapes = {v.op.name: v.shape.as_list() for v in tf1.global_variables()}
        assert shapes['conv1/weights'] == [5, 5, 3, 32]
        assert shapes['fc1/weights'] == [8 * 8 * 64, 1024]
        assert shapes['fc2/weights'] == [1024, 3]
        assert logits.shape.as_list() == [None, 3]


def test_registry_lists_the_models():
    assert models.model_names() == ['alexnet', 'cifar_convnet', 'inception3', 'mnist_convnet',
                                    'resnet101', 'resnet152', 'resnet20', 'resnet50',
                                    'resnet56', 'small_convnet', 'trivial', 'vgg16']
    assert sorted(models.DESIGNS) == models.model_names()
    assert sorted(models.MODELS) == models.model_names()
    assert callable(models.layers.conv2d)
    assert issubclass(ModelError, ValueError)


def test_importing_models_leaves_eager_mode_on():
    assert tf.executing_eagerly()


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ModelError) as info:
        build_model('resnet', (28, 28, 1), 10)
    message = str(info.value)
    assert '\n' not in message and 'resnet' in message
    for name in models.model_names():
        assert name in message


@pytest.mark.parametrize('name,input_shape,num_classes,options,match', [
    ('mnist_convnet', (28, 28), 10, {}, 'three positive ints'),
    ('mnist_convnet', (1, 28, 28, 1), 10, {}, 'without the batch'),
    ('mnist_convnet', (28, 28, 0), 10, {}, 'three positive ints'),
    ('mnist_convnet', (None, 28, 1), 10, {}, 'three positive ints'),
    ('mnist_convnet', 28, 10, {}, 'three positive ints'),
    ('cifar_convnet', (28, 28, 1), 10, {}, r'RGB images \(H, W, 3\)'),
    ('small_convnet', (3, 3, 1), 10, {}, 'at least 4x4'),
    ('small_convnet', (28, 28, 1), 0, {}, 'num_classes must be an int >= 1'),
    ('small_convnet', (28, 28, 1), 2.5, {}, 'num_classes must be an int >= 1'),
    ('small_convnet', (28, 28, 1), 10, {'dropout_rate': 0.5},
     'does not take option.*dropout_rate; its options are: none'),
    ('mnist_convnet', (28, 28, 1), 10, {'dropout': 0.5}, 'its options are: dropout_rate'),
    ('mnist_convnet', (28, 28, 1), 10, {'dropout_rate': 1.0}, r'in \[0, 1\)'),
])
def test_bad_arguments_raise_actionable_model_errors(name, input_shape, num_classes, options,
                                                     match):
    with pytest.raises(ModelError, match=match) as info:
        build_model(name, input_shape, num_classes, **options)
    assert '\n' not in str(info.value)


def test_model_fn_rejects_images_it_was_not_built_for():
    model_fn = build_model('small_convnet', (28, 28, 1), 10)
    with tf.Graph().as_default():
        with pytest.raises(ModelError, match='built for images'):
            model_fn(tf1.placeholder(tf.float32, [None, 32, 32, 3]), True)
        with pytest.raises(ModelError, match='float32'):
            model_fn(tf1.placeholder(tf.uint8, [None, 28, 28, 1]), True)
        with pytest.raises(TypeError, match='Python bool'):
            model_fn(tf1.placeholder(tf.float32, [None, 28, 28, 1]), tf.constant(True))
        assert tf1.global_variables() == []


def test_resnet_runs_each_batch_norm_update_once_per_call_and_halves_twice(two_calls):
    net = two_calls('resnet20', (32, 32, 3))
    # 1 + 3 stages * 3 blocks * 2 batch norms, two moving averages each.
    assert net.updates == 2 * 19
    last = net.graph.get_tensor_by_name('stage3/block3/Relu:0')  # the training call's
    assert last.shape.as_list() == [None, 8, 8, 64]


def test_resnet_option_a_shortcut_subsamples_and_zero_pads():
    from towers.models.resnet import _shortcut
    x = np.arange(2 * 4 * 4 * 2, dtype=np.float32).reshape(2, 4, 4, 2)
    out = _shortcut(tf.constant(x), 6, 2).numpy()
    assert out.shape == (2, 2, 2, 6)
    np.testing.assert_array_equal(out[..., 2:4], x[:, ::2, ::2, :])
    assert not out[..., :2].any() and not out[..., 4:].any()


@pytest.mark.parametrize('dtype', [tf.float32, tf.bfloat16])
def test_resnet_shortcut_is_the_strided_slice_forward_and_back_on_odd_maps_too(dtype):
    # It subsamples with a 1x1 pool of stride 2 (ten times faster than the slice here):
    # the same numbers both ways, a 5x5 map to 3x3 as x[:, ::2, ::2] takes it.
    from towers.models.resnet import _shortcut
    rng = np.random.RandomState(0)
    x = tf.cast(tf.constant(rng.randn(2, 5, 5, 3).astype(np.float32)), dtype)
    upstream = tf.cast(tf.constant(rng.randn(2, 3, 3, 3).astype(np.float32)), dtype)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        pooled = _shortcut(x, 3, 2)  # the same filters: no padding, the subsample alone
        sliced = x[:, ::2, ::2, :]
    np.testing.assert_array_equal(pooled.numpy(), sliced.numpy())
    np.testing.assert_array_equal(tape.gradient(pooled, x, upstream).numpy(),
                                  tape.gradient(sliced, x, upstream).numpy())


def test_resnet_refuses_images_too_small_to_halve_twice():
    with pytest.raises(ModelError, match='resnet20 halves the image twice'):
        build_model('resnet20', (4, 4, 3), 10)
