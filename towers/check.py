"""`towers check`: N towers train exactly as one device does — measured, not claimed.

The property that makes synchronous data parallelism "the same training,
faster": with each tower's gradient weighted by its share of the batch, the
averaged gradient of N towers is the one-device gradient of the whole batch,
and so are the variables after any number of steps. This builds both graphs
with the teaching layer (build_towers, average_gradients, one apply_gradients),
gives them the same initial weights and the same batches, and reports the
largest differences.
"""
import collections

import numpy as np
import tensorflow as tf

from towers.devices import session_config
from towers.gradients import average_gradients
from towers.tower import build_towers

tf1 = tf.compat.v1

CheckResult = collections.namedtuple(
    'CheckResult', ['gradient_diff', 'gradient_var', 'variable_diff', 'variable_var', 'scale',
                    'gradient_scale'])
CheckResult.__doc__ = """Largest absolute differences between N towers and one device.

  gradient_diff, gradient_var: over the first batch's averaged gradients, and
    the variable it is the gradient of.
  variable_diff, variable_var: over the variables after all steps.
  scale: the largest absolute variable value, to read variable_diff against.
  gradient_scale: the largest absolute gradient value, to read gradient_diff against.
"""


class _Run:
    """One graph: towers over the devices, the average, one SGD apply."""

    def __init__(self, model_fn, input_shape, devices, learning_rate, average, sync_bn):
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf1.set_random_seed(0)
            self.images = tf1.placeholder(tf.float32, [None] + list(input_shape))
            self.labels = tf1.placeholder(tf.int64, [None])
            opt = tf1.train.GradientDescentOptimizer(learning_rate)
            towers = build_towers(model_fn, self.images, self.labels, devices, optimizer=opt,
                                  sync_bn=sync_bn)
            grads = average([t.grads_and_vars for t in towers], [t.weight for t in towers])
            self.grads = {v.op.name: g for g, v in grads if g is not None}
            update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, towers[0].scope)
            self.train_op = tf.group(opt.apply_gradients(grads), *update_ops)
            self.variables = {v.op.name: v for v in tf1.global_variables()}
            self.has_batch_norm = bool(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
            init = tf1.global_variables_initializer()
        self.sess = tf1.Session(graph=self.graph, config=session_config(devices))
        self.sess.run(init)

    def feed(self, batch):
        return {self.images: batch[0], self.labels: batch[1]}


def check_towers(model_fn, input_shape, num_towers, batches, learning_rate=0.01,
                 average=average_gradients, sync_bn=False):
    """Train one device and num_towers virtual devices (or GPUs) on the same batches.

    Args:
      model_fn: callable(images, training) -> logits.
      input_shape: (H, W, C).
      num_towers: N; the towers are /cpu:0..N-1 without GPUs, else /gpu:0..N-1.
      batches: [(images [B, H, W, C] float32, labels [B] int64)], the same for both.
      average: the gradient combiner under test (tower_grads, weights) ->
        grads_and_vars; average_gradients unless a test breaks it on purpose.
      sync_bn: pool batch-norm moments over the towers (else a model with batch
        norm differs from one device by design).
    Returns:
      (CheckResult, has_batch_norm).
    """
    from towers.devices import resolve_devices
    one = _Run(model_fn, input_shape, resolve_devices(1), learning_rate, average_gradients,
               sync_bn=False)
    many = _Run(model_fn, input_shape, resolve_devices(num_towers), learning_rate, average,
                sync_bn)
    try:
        # The same starting point: the one-device graph's initial weights, copied.
        with many.graph.as_default():
            for name, value in one.sess.run(one.variables).items():
                many.variables[name].load(value, many.sess)
        grads_one = one.sess.run(one.grads, one.feed(batches[0]))
        grads_many = many.sess.run(many.grads, many.feed(batches[0]))
        gradient_var, gradient_diff = _largest(grads_one, grads_many)
        for batch in batches:
            one.sess.run(one.train_op, one.feed(batch))
            many.sess.run(many.train_op, many.feed(batch))
        after_one = one.sess.run(one.variables)
        variable_var, variable_diff = _largest(after_one, many.sess.run(many.variables))
        scale = max(float(np.max(np.abs(v))) for v in after_one.values())
        gradient_scale = max(float(np.max(np.abs(g))) for g in grads_one.values())
    finally:
        one.sess.close()
        many.sess.close()
    return (CheckResult(gradient_diff, gradient_var, variable_diff, variable_var, scale,
                        gradient_scale),
            one.has_batch_norm)


def _largest(expected, actual):
    """(name, largest |expected - actual|) over same-named arrays."""
    worst = max(expected, key=lambda n: float(np.max(np.abs(expected[n] - actual[n]))))
    return worst, float(np.max(np.abs(expected[worst] - actual[worst])))
