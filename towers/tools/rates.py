"""What the devices give TensorFlow: conv and matmul GFLOP/s, measured here, in a precision.

`towers bench --compare` holds each row's training GFLOP/s against these, so a
row reads as a share of what the hardware reaches on the same kind of work
(a slow precision or a slow step is then visible, not guessed):

  conv    a 5x5 convolution, 32 -> 64 channels on 14x14 maps at batch 128
          (mnist_convnet's second, the bulk of its step), forward and both
          gradients, in the towers' layout (NHWC on CPUs, NCHW on GPUs);
  matmul  a 2048 x 2048 matmul.

Every device runs its own copy at once (virtual CPUs share the cores, as the
towers do); variables are float32, cast on read to the precision, as in a
tower. Each kind is run once to warm up (oneDNN builds its kernels), then
timed: the best of a few runs.
"""
import time

import tensorflow as tf

from towers.devices import session_config

tf1 = tf.compat.v1

CONV = dict(batch=128, side=14, channels=32, filters=64, kernel=5)
MATMUL_SIZE = 2048


def conv_flops(batch, side, channels, filters, kernel):
    """FLOPs of one SAME, stride-1 conv's forward and both gradients (3 x 2 x MACs)."""
    return 3 * 2 * batch * side * side * filters * kernel * kernel * channels


def kernel_rates(devices, dtype=tf.float32, runs=3, conv=None, matmul_size=MATMUL_SIZE,
                 repeats=1, data_format='NHWC', per_gpu=None):
    """{'conv': GFLOP/s, 'matmul': GFLOP/s} of every device at once, in `dtype`.

    Args:
      devices: the tower devices ('/cpu:0', '/gpu:1', ...).
      dtype: tf.float32, tf.bfloat16 or tf.float16.
      runs: timed runs of each kind (the best is kept).
      conv: CONV's keys, to time another shape (tests use a small one).
      matmul_size, repeats: the matmul's side, and how many are chained.
      data_format: the conv's layout, 'NHWC' or 'NCHW' (as the towers' DevicePlan).
      per_gpu: the process's logical GPUs per GPU (towers/devices.py process_split).
    """
    conv = dict(CONV, **(conv or {}))
    graph = tf.Graph()
    with graph.as_default():
        uniform = tf1.random_uniform_initializer(-1.0, 1.0, seed=0)
        fetches = {'conv': [], 'matmul': []}
        for i, device in enumerate(devices):
            with tf.device(device), tf1.variable_scope('device_%d' % i):
                maps = [conv['side'], conv['side']]
                images = tf1.get_variable('images', [conv['batch']] + (
                    [conv['channels']] + maps if data_format == 'NCHW'
                    else maps + [conv['channels']]), initializer=uniform)
                weights = tf1.get_variable('weights', [conv['kernel'], conv['kernel'],
                                                       conv['channels'], conv['filters']],
                                           initializer=uniform)
                square = tf1.get_variable('square', [matmul_size] * 2, initializer=uniform)
                x, w = tf.cast(images, dtype), tf.cast(weights, dtype)
                out = tf.nn.conv2d(x, w, 1, 'SAME', data_format=data_format)
                # Every result summed: grappler prunes what nothing reads.
                fetches['conv'].append(tf.add_n([_sum(t) for t in [out] + tf.gradients(
                    out, [x, w], grad_ys=out)]))
                a = product = tf.cast(square, dtype)
                for _ in range(repeats):
                    product = tf.matmul(product, a) * tf.constant(1.0 / matmul_size, dtype)
                fetches['matmul'].append(_sum(product))
        init = tf1.global_variables_initializer()
    flops = {'conv': conv_flops(**conv) * len(devices),
             'matmul': 2.0 * matmul_size ** 3 * repeats * len(devices)}
    with tf1.Session(graph=graph, config=session_config(devices, per_gpu=per_gpu)) as sess:
        sess.run(init)
        return {kind: flops[kind] / _best_seconds(sess, fetch, runs) / 1e9
                for kind, fetch in fetches.items()}


def _sum(tensor):
    return tf.reduce_sum(tf.cast(tensor, tf.float32))


def _best_seconds(sess, fetch, runs):
    sess.run(fetch)  # warm-up
    best = float('inf')
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(fetch)
        best = min(best, time.perf_counter() - start)
    return best
