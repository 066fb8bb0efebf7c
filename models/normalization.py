"""Batch normalisation over the towers: each tower's slice, or the whole batch (--sync-bn).

The statistics, variables and moving averages are float32 whatever the map's
type (towers/precision.py). An NHWC map is normalised by TensorFlow's fused
kernel; --sync-bn pools its moments over the towers with TensorFlow's
collective ops and normalises with tf.nn ops. Part of towers/models/layers.py,
which the models import it from.
"""
import tensorflow as tf

from towers.models import layout
from towers.models.errors import check_training, static_channels

tf1 = tf.compat.v1


MIN_EPSILON = 1.001e-5  # the fused kernel's floor (cuDNN's)


def batch_norm(x, training, decay=0.997, epsilon=MIN_EPSILON, scale=True, name='batch_norm'):
    """Batch normalisation over the channel axis (the last; NCHW's second, see layout.py).

    Creates `beta` [C] (zeros) and `gamma` [C] (ones; not with scale=False, where
    a ReLU follows and a scale would only be undone by the next layer), trainable, and
    `moving_mean` [C] (zeros) and `moving_variance` [C] (ones), non-trainable and
    in GLOBAL_VARIABLES and MOVING_AVERAGE_VARIABLES (so savers and EMA tools see
    them but optimizers do not).

    In training the batch moments (over every axis but the channels') normalise `x`,
    and ops setting `moving = moving * decay + batch * (1 - decay)` are added to
    `tf1.GraphKeys.UPDATE_OPS`; they are created in the current name scope, so
    a multi-tower caller can run only one tower's updates with
    `tf1.get_collection(UPDATE_OPS, scope)`. In inference the moving stats are used.
    An NHWC x is normalised by TensorFlow's fused kernel (FusedBatchNormV3, its
    sums in float32 whatever x's type); --sync-bn's pooled moments and other
    ranks by tf.nn ops (in float32 for a bfloat16 or float16 x).

    Args:
        x: [batch, ..., C], float32 (or a mixed-precision run's bfloat16 or
            float16: the moments, variables and moving averages stay float32);
            C static. Training needs a non-empty batch.
        training: Python bool, or a TowerContext: with sync_bn the moments are
            those of every tower's real examples together (all-reduced), so N
            towers normalise exactly as one device on the whole batch.
        decay: moving-average decay.
        epsilon: added to the variance for numerical stability; below
            MIN_EPSILON, the fused kernel's floor, the tf.nn ops normalise.
        scale: learn gamma; False fixes it at one (Inception v3, as Keras builds it).
        name: variable scope of the four variables.

    Returns:
        Same shape and dtype as `x`.
    """
    check_training(training, 'batch_norm')
    channels = static_channels(x, 'batch_norm')

    def var(var_name, init, trainable=True):
        collections = None if trainable else [tf1.GraphKeys.GLOBAL_VARIABLES,
                                              tf1.GraphKeys.MOVING_AVERAGE_VARIABLES]
        # float32 whatever x is: the statistics need its digits (towers/precision.py).
        return tf1.get_variable(var_name, [channels], dtype=tf.float32, initializer=init,
                                trainable=trainable, collections=collections)

    with tf1.variable_scope(name):
        beta = var('beta', tf1.zeros_initializer())
        gamma = (var('gamma', tf1.ones_initializer()) if scale
                 else tf.ones([channels], tf.float32, name='gamma'))
        moving_mean = var('moving_mean', tf1.zeros_initializer(), trainable=False)
        moving_variance = var('moving_variance', tf1.ones_initializer(), trainable=False)
        fused = _fusable(x) and epsilon >= MIN_EPSILON
        data_format = layout.format_of(x)
        if not training:
            if fused:
                return tf1.nn.fused_batch_norm(x, gamma, beta, moving_mean, moving_variance,
                                               epsilon, data_format=data_format,
                                               is_training=False)[0]
            return _normalize(x, moving_mean, moving_variance, beta, gamma, epsilon,
                              tf.cast(x, tf.float32))
        axes = layout.other_axes(x)
        pooled = getattr(training, 'sync_bn', False)
        if fused and not pooled:
            y, mean, variance = _fused_training(x, gamma, beta, epsilon, channels, data_format)
        else:
            wide = tf.cast(x, tf.float32)  # x itself in float32
            mean, variance = (_pooled_moments(wide, axes, training) if pooled
                              else tf.nn.moments(wide, axes=axes))
            y = _normalize(x, mean, variance, beta, gamma, epsilon, wide)
        for moving, batch in ((moving_mean, mean), (moving_variance, variance)):
            update = tf1.assign(moving, moving * decay + batch * (1 - decay))
            tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, update)
        return y


def _fusable(x):
    """Whether TensorFlow's fused kernel normalises x: an NHWC map, float32 or low.

    FusedBatchNormV3 takes x in its own type with float32 statistics and
    accumulates in float32, forward and backward: in bfloat16 the float32
    numbers without the casts around every batch norm (resnet20's bf16 step was
    half batch norm without it), and in float32 too a third faster than the
    moments and batch_normalization ops. --sync-bn pools its own moments and
    keeps those ops.
    """
    return x.dtype in (tf.float32, tf.bfloat16, tf.float16) and x.shape.rank == 4


def _fused_training(x, gamma, beta, epsilon, channels, data_format):
    """(y, batch mean, biased batch variance) from the fused kernel in training."""
    y, mean, unbiased = tf1.nn.fused_batch_norm(x, gamma, beta, epsilon=epsilon,
                                                data_format=data_format, is_training=True)
    # The kernel hands back the variance with Bessel's correction, n / (n - 1); the
    # moving average keeps the biased one, as tf.nn.moments gives it.
    n = tf.cast(tf.size(x) // channels, tf.float32)
    return y, mean, unbiased * tf.maximum(n - 1.0, 0.0) / tf.maximum(n, 1.0)


def _normalize(x, mean, variance, beta, gamma, epsilon, wide):
    """(x - mean) / sqrt(variance + epsilon) * gamma + beta, in float32, in x's type.

    A bfloat16 or float16 x is normalised as `wide`, itself in float32, and cast
    back: the gradients of beta, gamma and the moments are sums over the whole
    batch, which the low type's digits cannot hold.
    """
    mean, variance, beta, gamma = (layout.per_channel(t, x)
                                   for t in (mean, variance, beta, gamma))
    if x.dtype == tf.float32:
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, epsilon)
    return tf.cast(tf.nn.batch_normalization(wide, mean, variance, beta, gamma, epsilon),
                   x.dtype)


def _pooled_moments(x, axes, tower):
    """Mean and (biased) variance over every tower's real examples, per channel.

    Two passes, as tf.nn.moments: the mean first, then the mean squared
    deviation from it (E[x^2] - E[x]^2 in one pass loses digits to cancellation).
    """
    real = tf.cast(tf.range(tf.shape(x)[0]) < tower.count, x.dtype)
    real = tf.reshape(real, [-1] + [1] * (x.shape.rank - 1))
    per_example = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), layout.spatial_axes(x))),
                          x.dtype)
    channels = x.shape[layout.channel_axis(x)]
    sums = _all_reduce(tf.concat([tf.reduce_sum(x * real, axes),
                                  [tf.reduce_sum(real) * per_example]], axis=0), tower)
    count = tf.maximum(sums[-1], 1.0)
    mean = sums[:channels] / count
    squares = _all_reduce(tf.reduce_sum(tf.square(x - layout.per_channel(mean, x)) * real,
                                        axes), tower)
    return mean, squares / count


def _all_reduce(local, tower):
    """The sum of `local` over the towers, with the gradient a weighted tower needs."""
    from tensorflow.python.ops import collective_ops  # TF's own all-reduce
    forward, backward = tower.next_collective_keys()
    weight = tf.cast(tower.weight, local.dtype)

    @tf.custom_gradient
    def all_reduce(local):
        def grad(upstream):
            # Tower i differentiates only its own loss L_i, and its gradient is
            # then weighted by w_i: the statistics' gradient every tower needs is
            # sum_k w_k dL_k/ds, handed back divided by w_i.
            total = collective_ops.all_reduce(upstream * weight, tower.num_towers,
                                              tower.GROUP_KEY, backward, 'Add', 'Id')
            return tf.math.divide_no_nan(total, weight)
        return collective_ops.all_reduce(local, tower.num_towers, tower.GROUP_KEY, forward,
                                         'Add', 'Id'), grad

    return all_reduce(local)
