"""LARS: layer-wise adaptive rate scaling for very large batches (`--optimizer lars`).

You, Gitman and Ginsburg 2017 (arXiv:1708.03888): each layer's step is scaled by a trust
ratio, eta * ||w|| / (||g|| + wd * ||w||), so that no layer moves by more than a set fraction
of its own norm whatever the batch; then momentum, as MLPerf's ResNet-50 reference trains
with it (mlcommons/training image_classification/tensorflow2/lars_optimizer.py): the weight
decay is the optimizer's own (added to the gradient after the ratio is taken), and batch norm
and biases are left out of both (its skip list), here the variables --decay-on leaves out.

The optimizer sees the towers' averaged gradient (towers/gradients.py), as every optimizer of
towers does: N towers take one device's LARS step.
"""
import re

import tensorflow as tf

tf1 = tf.compat.v1

ETA = 0.001  # the paper's and the reference's trust coefficient
EPSILON = 1e-7  # the reference's --lars_epsilon=0, which it replaces by Keras' epsilon


class LARSOptimizer(tf1.train.MomentumOptimizer):
    """Momentum on trust-scaled, decayed gradients.

    For a variable w whose name the pattern finds, the gradient g becomes
    trust * (g + weight_decay * w), trust = eta * ||w|| / (||g|| + weight_decay * ||w|| +
    epsilon) (1 where ||w|| or ||g|| is 0); others keep g. Momentum then steps as
    MomentumOptimizer: v = momentum * v + rate * g', w -= v.

    Args:
      learning_rate: float or scalar tensor (a schedule).
      momentum: 0.9 in the reference.
      weight_decay: L2 rate, applied here, not by the trainer's processors.
      scaled: regex searched in variable names: the variables LARS scales and decays.
    """

    def __init__(self, learning_rate, momentum=0.9, weight_decay=0.0, scaled=r'.', eta=ETA,
                 epsilon=EPSILON, name='LARS'):
        super().__init__(learning_rate, momentum, name=name)
        self._weight_decay, self._eta, self._epsilon = weight_decay, eta, epsilon
        self._scaled = re.compile(scaled)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        pairs = [(self._trusted(g, v) if self._takes(g, v) else g, v)
                 for g, v in grads_and_vars]
        return super().apply_gradients(pairs, global_step=global_step, name=name)

    def _takes(self, grad, var):
        # A sparse gradient (an embedding's rows) steps as plain momentum, as the reference.
        return (grad is not None and not isinstance(grad, tf.IndexedSlices)
                and self._scaled.search(var.op.name) is not None)

    def _trusted(self, grad, var):
        with tf1.name_scope('lars'), tf.device(var.device):
            weights = tf.convert_to_tensor(var)
            w_norm, g_norm = tf.norm(weights), tf.norm(grad)
            ratio = self._eta * w_norm / (g_norm + self._weight_decay * w_norm + self._epsilon)
            trust = tf.where(tf.logical_and(w_norm > 0, g_norm > 0), ratio, 1.0)
            return trust * (grad + self._weight_decay * weights)
