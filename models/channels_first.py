"""Whether this CPU's TensorFlow runs channels-first (NCHW) maps in a dtype: measured.

TensorFlow's own CPU kernels (Eigen) have no NCHW max pool and no NCHW conv input
gradient ("Default MaxPoolingOp only supports NHWC on device type CPU"); oneDNN's have
both. TensorFlow hands a dtype to oneDNN only where TF_ENABLE_ONEDNN_OPTS is on (towers
turns it on: towers/cli/main.py) and the CPU has the instructions for that dtype: float32
on any x86 CPU, bfloat16 only with AVX-512 ("oneDNN supports DT_BFLOAT16 only on platforms
with AVX-512"; on a 2-core AVX2 EPYC bfloat16 falls back to Eigen, and NCHW with it). So
it is measured, once per process and dtype: what the models run in NCHW (a conv with its
bias, both its gradients, a fused batch norm in training, a max and an average pool) on
/cpu:0, in a graph and Session of their own. (A graph built here and run on another
machine, as an in-graph cluster's, follows this machine's answer, as bias_gradient.py's.)
"""
import functools

import numpy as np
import tensorflow as tf

from towers.quiet import native_stderr_silenced

tf1 = tf.compat.v1

CPU_ONLY = tf1.ConfigProto(device_count={'CPU': 1, 'GPU': 0})


@functools.lru_cache(maxsize=None)
def cpu_runs_nchw(dtype_name):
    """True where NCHW maps run on this CPU in `dtype_name` ('float32', 'bfloat16',
    'float16'); False where a kernel refuses them (or the graph cannot run at all)."""
    dtype = tf.as_dtype(dtype_name)
    images = np.random.RandomState(0).rand(2, 3, 6, 6).astype(np.float32)
    with tf.Graph().as_default() as graph, tf.device('/cpu:0'):
        # Fed, not a constant: grappler would fold a graph of constants away.
        fed = tf1.placeholder(tf.float32, images.shape)
        x = tf.cast(fed, dtype)
        weights = tf.ones([3, 3, 3, 4], dtype)
        maps = tf.nn.bias_add(tf.nn.conv2d(x, weights, 1, 'SAME', data_format='NCHW'),
                              tf.zeros([4], dtype), data_format='NCHW')
        maps, _, _ = tf1.nn.fused_batch_norm(maps, tf.ones([4]), tf.zeros([4]),
                                             data_format='NCHW', is_training=True)
        pooled = tf.nn.max_pool2d(maps, 2, 2, 'SAME', data_format='NCHW')
        pooled = tf.nn.avg_pool2d(pooled, 2, 1, 'SAME', data_format='NCHW')
        loss = tf.reduce_sum(tf.cast(pooled, tf.float32))
        # Both conv gradients: the input's runs only where something below the conv needs it.
        run = [loss] + tf.gradients(loss, [x, weights])
    try:
        # No GPU device made: a process's first Session fixes its GPUs' memory and logical
        # split, which belongs to the run's own Session (towers/devices.py gpu_split).
        # oneDNN logs an error line where it hands a dtype back to Eigen: what this
        # measures, and the refusal says better.
        with native_stderr_silenced(), tf1.Session(graph=graph, config=CPU_ONLY) as sess:
            sess.run(run, {fed: images})
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
            tf.errors.NotFoundError):
        return False
    return True
