"""Gradient processors: what may happen to the averaged gradients before the apply.

Each is a callable grads_and_vars -> grads_and_vars (num_vars x (grad, var)),
run once on the towers' average by towers/gradients.py process_gradients,
never per tower. Variables are matched by the name a checkpoint gives them
(a replicated run's copies by their master's), with `re.search`.
"""
import tensorflow as tf

from towers.config import check, check_pattern
from towers.errors import SettingError
from towers.variables import variable_name


class WeightDecay:
    """L2 weight decay: rate * sum(v**2) / 2 over the variables whose name matches pattern.

    Its gradient, rate * v, is added to the *averaged* gradient of each matched
    variable, so it counts once per step whatever the number of towers (adding
    it to every tower's loss would compute it N times). `loss(variables)` is the
    term itself, for reporting.
    """

    def __init__(self, rate, pattern=r'(^|/)weights$'):
        self.rate = check('weight_decay', rate)
        self.pattern = check_pattern(pattern, '{decay_pattern}')

    def matches(self, var):
        return self.pattern.search(variable_name(var)) is not None

    def loss(self, variables):
        """Scalar float32: the decay term over the matched variables (0 if none)."""
        terms = [tf.nn.l2_loss(v) for v in variables if self.matches(v)]
        return self.rate * tf.add_n(terms) if terms else tf.constant(0.0)

    def __call__(self, grads_and_vars):
        out = []
        with tf.name_scope('weight_decay'):
            for grad, var in grads_and_vars:
                if grad is not None and self.matches(var):
                    with tf.device(var.device):
                        grad = tf.convert_to_tensor(grad) + self.rate * var.value()
                out.append((grad, var))
        return out


class ClipGlobalNorm:
    """Scale all gradients down together so their global norm is at most max_norm."""

    def __init__(self, max_norm):
        self.max_norm = check('clip_norm', max_norm)

    def __call__(self, grads_and_vars):
        grads = [g for g, _ in grads_and_vars]
        with tf.name_scope('clip_global_norm'):
            clipped, _ = tf.clip_by_global_norm(grads, self.max_norm)
        return list(zip(clipped, [v for _, v in grads_and_vars]))


class ScaleGradient:
    """Multiply the gradients of variables matched by each regex by its factor.

    Args:
      rules: [(pattern, factor)]; the first matching rule wins.
    """

    def __init__(self, rules):
        self.rules = [(check_pattern(p, 'gradient scale pattern'), float(f)) for p, f in rules]

    def __call__(self, grads_and_vars):
        out = []
        for grad, var in grads_and_vars:
            factor = next((f for p, f in self.rules if p.search(variable_name(var))), 1.0)
            if grad is not None and factor != 1.0:
                if isinstance(grad, tf.IndexedSlices):
                    grad = tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
                else:
                    grad = grad * factor
            out.append((grad, var))
        return out


class FreezeVariables:
    """Drop the gradients of variables whose name matches pattern: they are not updated."""

    def __init__(self, pattern):
        self.pattern = check_pattern(pattern, '{freeze}')

    def __call__(self, grads_and_vars):
        kept = [(g, v) for g, v in grads_and_vars if not self.pattern.search(variable_name(v))]
        if not any(g is not None for g, _ in kept):
            raise SettingError('{freeze} %r matches every trained variable; nothing would train',
                               self.pattern.pattern)
        return kept
