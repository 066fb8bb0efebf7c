"""Graph-mode layers built from `tf1.get_variable` and `tf.nn` ops only.

Every variable is created through `tf1.get_variable`, so the caller's
`tf1.variable_scope(..., reuse=...)` shares it across towers and the caller's
device function decides where it lives; nothing here sets a device.
Images are NHWC: [batch, height, width, channels]; batch may be dynamic.
Inside layout.data_format('NCHW') the maps are channels first (see layout.py);
the shapes below are given NHWC.
`training` is a Python bool, or the tower's towers.context.TowerContext
(truthy when training), whose sync_bn makes batch_norm pool its moments over
the towers. batch_norm itself is in normalization.py, with its float32 statistics.
"""
import math
import zlib

import tensorflow as tf

from towers.models import layout
from towers.models.bias_gradient import fused_bias_gradient_sums_wide
from towers.models.errors import check_training, static_channels
from towers.models.normalization import MIN_EPSILON, batch_norm

tf1 = tf.compat.v1

__all__ = ['MIN_EPSILON', 'avg_pool', 'batch_norm', 'concat_channels', 'conv2d', 'dense',
           'dropout', 'flatten', 'global_average_pool', 'local_response_norm', 'max_pool']


def _conv_output_shape(x, kernel_hw, strides, padding, filters):
    size = tf.shape(x)
    dims = []
    for axis, k in zip(layout.spatial_axes(x), kernel_hw):
        n = x.shape[axis] if x.shape[axis] is not None else size[axis]
        dims.append((n + strides - 1) // strides if padding.upper() == 'SAME'
                    else (n - k + strides) // strides)
    if layout.channels_first(x):
        return tf.stack([size[0], filters] + dims)
    return tf.stack([size[0]] + dims + [filters])


def _may_come_back_empty(x, y):
    """Whether conv output y needs the reshape that repairs oneDNN's empty batch: where x's
    batch can be empty (not a static, non-empty shape) and y may run on a CPU (by its op's
    device: not a GPU, whose Conv2D gives an empty output of the right shape; no device, or
    a task's, may be a CPU). Elsewhere it would cost every step a Shape, StridedSlice, Pack
    and Reshape per conv, and the Reshape's gradient, which grappler cannot fold on a dynamic
    batch."""
    if x.shape.num_elements():
        return False
    return tf.DeviceSpec.from_string(y.op.device).device_type != 'GPU'


def _weights_and_biases(kernel_shape, dtype, kernel_initializer, bias_initializer):
    weights = tf1.get_variable('weights', kernel_shape, dtype=dtype,
                               initializer=kernel_initializer or tf1.glorot_uniform_initializer())
    biases = tf1.get_variable('biases', kernel_shape[-1:], dtype=dtype,
                              initializer=bias_initializer or tf1.zeros_initializer())
    return weights, biases


def conv2d(x, filters, kernel_size, strides=1, padding='SAME', activation=tf.nn.relu,
           kernel_initializer=None, bias_initializer=None, use_bias=True, name='conv2d'):
    """2-D convolution plus bias and activation.

    Args:
        x: [batch, height, width, in_channels] float32; in_channels static.
        filters: number of output channels.
        kernel_size: int k for a k x k kernel, or a pair (kh, kw).
        strides: int stride used for both spatial dimensions.
        padding: 'SAME' or 'VALID'.
        activation: function applied last, or None for a linear output.
        kernel_initializer: initializer of `weights`; default Glorot uniform.
        bias_initializer: initializer of `biases`; default zeros.
        use_bias: False leaves `biases` out (a batch norm's beta follows).
        name: variable scope holding `weights` [kh, kw, in_channels, filters]
            and `biases` [filters].

    Returns:
        [batch, out_height, out_width, filters] float32.
    """
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    in_channels = static_channels(x, 'conv2d')
    with tf1.variable_scope(name):
        kernel_shape = [kh, kw, in_channels, filters]
        if use_bias:
            weights, biases = _weights_and_biases(kernel_shape, x.dtype, kernel_initializer,
                                                  bias_initializer)
        else:
            weights = tf1.get_variable('weights', kernel_shape, dtype=x.dtype,
                                       initializer=kernel_initializer
                                       or tf1.glorot_uniform_initializer())
        y = tf.nn.conv2d(x, weights, strides=strides, padding=padding,
                         data_format=layout.current())
        if _may_come_back_empty(x, y):
            # oneDNN's CPU Conv2D returns its *input* unchanged for an empty batch;
            # reshaping to the true shape keeps batch-0 inference working. (Gradients
            # on an empty batch still fail in oneDNN kernels.)
            y = tf.reshape(y, _conv_output_shape(x, (kh, kw), strides, padding, filters))
        if use_bias:
            y = _add_bias(y, biases, after_conv=True)
        return activation(y) if activation is not None else y


def _add_bias(y, biases, after_conv=False):
    """y + biases over the last axis; in bfloat16 or float16, the bias gradient summed in float32.

    TensorFlow's BiasAddGrad sums a bfloat16 gradient over the batch and every
    position in bfloat16: over a 50x28x28 conv output that loses a third of
    conv1's bias gradient (towers check --precision bf16 showed it). Summed in
    float32 and rounded once, it is off by one rounding.

    Except after a bfloat16 conv on a CPU where TensorFlow hands bfloat16 to
    oneDNN, as measured once (bias_gradient.py): there it fuses BiasAddGrad into
    the conv's weight gradient (_MklNativeConv2DBackpropFilterWithBias), whose
    sum is float32's rounded once, bit for bit, and free; the wide sum here
    would cost mnist_convnet 3.5% of its bf16 step. (A conv whose weights are
    not trained keeps TensorFlow's unfused, bfloat16 sum.)
    """
    data_format = layout.format_of(y)
    if y.dtype == tf.float32 or (after_conv and fuses_bias_gradient(y)):
        return tf.nn.bias_add(y, biases, data_format=data_format)
    axes = layout.other_axes(y)  # read now: the gradient is built outside the layout scope

    @tf.custom_gradient
    def bias_add_wide_gradient(y, biases):
        def grad(upstream):
            summed = tf.reduce_sum(tf.cast(upstream, tf.float32), axes)
            return upstream, tf.cast(summed, biases.dtype)
        return tf.nn.bias_add(y, biases, data_format=data_format), grad
    return bias_add_wide_gradient(y, biases)


def fuses_bias_gradient(y):
    """Whether TensorFlow sums the bias gradient of conv output `y` in float32 inside the
    conv's weight gradient: bfloat16 on a CPU tower (by its op's device; no device says
    nothing) where bias_gradient.py measured it so."""
    return (y.dtype == tf.bfloat16
            and tf.DeviceSpec.from_string(y.op.device).device_type == 'CPU'
            and fused_bias_gradient_sums_wide())


def flatten(x):
    """Collapses all but the batch dimension.

    Args:
        x: [batch, d1, ..., dn] with d1..dn static; batch may be dynamic (even 0).

    Returns:
        [batch, d1 * ... * dn], same dtype.
    """
    if layout.channels_first(x):  # the dense layers' weights are NHWC-ordered in any layout
        x = layout.to_nhwc(x)
    inner = x.shape[1:]
    if not inner.is_fully_defined():
        raise ValueError(f'flatten: inner dimensions must be static, got shape {x.shape}')
    return tf.reshape(x, [-1, math.prod(inner.as_list())])


def dense(x, units, activation=None, kernel_initializer=None, bias_initializer=None,
          name='dense'):
    """Fully connected layer; a rank > 2 input is flattened first.

    Args:
        x: [batch, features] or [batch, d1, ..., dn] float32 with static inner dims.
        units: number of outputs.
        activation: function applied last, or None for a linear output (logits).
        kernel_initializer: initializer of `weights`; default Glorot uniform.
        bias_initializer: initializer of `biases`; default zeros.
        name: variable scope holding `weights` [features, units] and `biases` [units].

    Returns:
        [batch, units] float32.
    """
    if x.shape.rank != 2:
        x = flatten(x)
    features = static_channels(x, 'dense')
    with tf1.variable_scope(name):
        weights, biases = _weights_and_biases([features, units], x.dtype,
                                              kernel_initializer, bias_initializer)
        y = _add_bias(tf.matmul(x, weights), biases)
        return activation(y) if activation is not None else y


def max_pool(x, pool_size=2, strides=2, padding='SAME', name=None):
    """Max pooling over pool_size x pool_size windows with the given int stride.

    `x` is [batch, height, width, channels]; the result is
    [batch, out_height, out_width, channels] of the same dtype.
    """
    return tf.nn.max_pool2d(x, ksize=pool_size, strides=strides, padding=padding, name=name,
                            data_format=layout.current())


def avg_pool(x, pool_size=3, strides=1, padding='SAME', name=None):
    """Average pooling, as max_pool; with SAME padding the border windows average
    only the pixels inside the map (TensorFlow's, and Keras', rule)."""
    return tf.nn.avg_pool2d(x, ksize=pool_size, strides=strides, padding=padding, name=name,
                            data_format=layout.current())


def concat_channels(maps, name=None):
    """The maps side by side along the channel axis (an Inception module's branches)."""
    return tf.concat(maps, axis=layout.channel_axis(maps[0]), name=name)


def global_average_pool(x):
    """[batch, H, W, C] -> [batch, C]: the mean over each map."""
    return tf.reduce_mean(x, axis=layout.spatial_axes(x))


def local_response_norm(x, depth_radius=5, bias=1.0, alpha=1.0, beta=0.5, name=None):
    """Local response normalisation across channels (AlexNet style); no variables.

    `x` is [batch, height, width, channels] and so is the result, of x's type
    (computed in float32 for a bfloat16 or float16 x); the arguments are those
    of `tf.nn.local_response_normalization`. batch may be 0 on any device.
    """
    # A normalisation: in float32 whatever x is (TensorFlow's CPU LRN has no bfloat16).
    wide = tf.cast(x, tf.float32)
    first = layout.channels_first(x)
    if first:  # TensorFlow's LRN is channels last only
        wide = layout.to_nhwc(wide)

    def normalize(maps, op_name=None):
        return tf.nn.local_response_normalization(maps, depth_radius=depth_radius, bias=bias,
                                                  alpha=alpha, beta=beta, name=op_name)
    if wide.shape[0] is not None:  # a static batch: non-empty, or empty and known now
        y = normalize(wide, name) if wide.shape[0] else tf.identity(wide, name=name)
    else:
        # cuDNN's LRN kernel CHECK-fails (aborts the process) on an empty batch, which a
        # tower gets from a final partial batch. A cond on the batch size runs it only on
        # a non-empty one: no copy of the maps (padding a row and slicing it back would
        # copy them twice each way) and the same LRN and LRNGrad ops, so the values and
        # gradients are plain LRN's, bit for bit.
        y = tf.cond(tf.shape(wide)[0] > 0, lambda: normalize(wide),
                    lambda: tf.identity(wide), name=name)
    if first:
        y = layout.to_nchw(y)
    return tf.cast(y, x.dtype)


def dropout(x, rate, training, seed=None):
    """Inverted dropout: zeroes a `rate` fraction and scales the rest by 1/(1-rate).

    Args:
        x: any float tensor.
        rate: drop probability in [0, 1).
        training: Python bool or TowerContext; when false (or rate == 0) `x` is
            returned unchanged, so eval graphs contain no random ops.
        seed: optional op-level seed. In a graph with a global step (the
            trainer's, found in its graph collection) the mask is stateless,
            drawn from (graph seed, this call's unique name scope, seed, step),
            so that a resumed run continues with the masks it would have had.

    Returns:
        Tensor of the same shape and dtype as `x`.
    """
    check_training(training, 'dropout')
    if not 0 <= rate < 1:
        raise ValueError(f'dropout: rate must be in [0, 1), got {rate}')
    if not training or rate == 0:
        return x
    step = tf1.train.get_global_step()
    if step is None:
        return tf.nn.dropout(x, rate=rate, seed=seed)
    # In a training graph the mask is a function of (graph seed, this op's name
    # scope, global step): a run resumed from a checkpoint at step k draws the
    # masks an uninterrupted run draws at k, and each tower (its own scope) its own.
    with tf1.name_scope('dropout') as scope:  # unique per call: dropout, dropout_1, ...
        graph_seed = tf1.get_default_graph().seed or 0
        key = zlib.crc32(scope.encode()) ^ (seed or 0)
        stateless_seed = tf.stack([tf.constant((graph_seed * 7919 + key) % 2**31, tf.int64),
                                   tf.cast(step, tf.int64)])
        if x.dtype == tf.float32:
            return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=stateless_seed)
        # The mask is drawn in float32 whatever x is: a bfloat16 or float16 run drops
        # the units a float32 run drops (its uniforms would be other numbers).
        keep = tf.nn.experimental.stateless_dropout(tf.ones(tf.shape(x), tf.float32),
                                                    rate=rate, seed=stateless_seed)
        return x * tf.cast(keep, x.dtype)
