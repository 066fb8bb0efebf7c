"""Whether TensorFlow sums a bfloat16 conv's bias gradient in float32 on this CPU: measured.

TensorFlow's own BiasAddGrad sums a bfloat16 gradient in bfloat16, which loses
digits over a conv's batch and positions, so layers.py sums it in float32
itself. On a CPU where TensorFlow hands bfloat16 to oneDNN, it fuses the bias
gradient into the conv's weight gradient (_MklNativeConv2DBackpropFilterWithBias),
whose sum is float32's rounded once, and free. Whether that happens depends
on the build (TF_ENABLE_ONEDNN_OPTS) and on the CPU (oneDNN takes bfloat16 only
where the CPU has the instructions for it; elsewhere TensorFlow falls back to
its own kernels), so it is measured, once per process: a small bfloat16 conv's
weight and bias gradients on /cpu:0, in a graph and Session of their own,
checked for the fused kernel and for the bias gradient being float32's sum
rounded once, bit for bit. (A graph built here and run on another machine, as
an in-graph cluster's, follows this machine's answer.)
"""
import functools

import numpy as np
import tensorflow as tf

from towers.models.channels_first import CPU_ONLY

tf1 = tf.compat.v1


@functools.lru_cache(maxsize=None)
def fused_bias_gradient_sums_wide():
    """True where this CPU's TensorFlow fuses a bf16 conv's bias gradient and sums it in
    float32 (rounded once); False where it does not, or the probe cannot run."""
    rng = np.random.RandomState(0)
    # 8 x 16 x 16 = 2,048 terms a channel: summed in bfloat16 they lose digits.
    values = [rng.randn(*shape).astype(np.float32)
              for shape in ([8, 16, 16, 4], [3, 3, 4, 8], [8, 16, 16, 8])]
    with tf.Graph().as_default() as graph, tf.device('/cpu:0'):
        # Fed, not constants: grappler would fold a graph of constants away.
        fed = [tf1.placeholder(tf.float32, value.shape) for value in values]
        images, weights, upstream = (tf.cast(x, tf.bfloat16) for x in fed)
        biases = tf.zeros([8], tf.bfloat16)
        maps = tf.nn.bias_add(tf.nn.conv2d(images, weights, 1, 'SAME'), biases)
        grads = tf.gradients(maps, [weights, biases], grad_ys=upstream)
        wide = tf.reduce_sum(tf.cast(upstream, tf.float32), [0, 1, 2])
    metadata = tf1.RunMetadata()
    try:
        # No GPU device made (channels_first.py's CPU_ONLY): the run's own Session sets the
        # GPUs' memory and logical split.
        with tf1.Session(graph=graph, config=CPU_ONLY) as sess:
            (_, got), expected = sess.run([grads, wide], dict(zip(fed, values)),
                                          options=tf1.RunOptions(output_partition_graphs=True),
                                          run_metadata=metadata)
    except tf.errors.OpError:
        return False
    fused = any(node.op.endswith('Conv2DBackpropFilterWithBias')
                for part in metadata.partition_graphs for node in part.node)
    once = expected.astype(tf.bfloat16.as_numpy_dtype)
    return fused and np.array_equal(got.view(np.uint16), once.view(np.uint16))
