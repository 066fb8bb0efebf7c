"""Combining the towers' gradients and applying them: where the towers meet.

`average_gradients` is the function of the classic CIFAR-10 multi-GPU tutorial,
made exact for any split of the batch: each tower's gradient is weighted by its
share of the examples, so N towers on an uneven (or partly empty) batch give the
same update as one device on the whole batch. `build_train_op` then makes the
tutorial's single `apply_gradients`, after the optional steps that act on the
averaged gradients: weight decay (added here once, not once per tower) and
gradient processors (clip by global norm, scale or freeze variables by regex).
"""
import re

import tensorflow as tf

from towers.errors import GradientError, TowersError
from towers.tower import tower_update_ops


def _check_same_variables(tower_grads):
    """Every tower must list the same variables in the same order."""
    reference = [v for _, v in tower_grads[0]]
    for i, grads_and_vars in enumerate(tower_grads[1:], start=1):
        variables = [v for _, v in grads_and_vars]
        if len(variables) != len(reference) or any(
                a is not b for a, b in zip(variables, reference)):
            names0 = {v.op.name for v in reference}
            names_i = {v.op.name for v in variables}
            only0 = sorted(names0 - names_i)
            only_i = sorted(names_i - names0)
            detail = ('only in tower 0: %s; only in tower %d: %s'
                      % (only0 or '-', i, only_i or '-')) if (only0 or only_i) else \
                'same variables in a different order'
            raise GradientError(
                'towers disagree on their variables (tower 0 has %d, tower %d has %d; %s): '
                'build every tower with the same model under one shared variable scope'
                % (len(reference), i, len(variables), detail))


def combine(grads, weights):
    """Weighted sum of one variable's gradients; None grads are zero.

    IndexedSlices stay sparse: their scaled values and indices are concatenated
    (duplicate indices are summed by the optimizer's sparse apply). Only a mix of
    dense and sparse is densified, since the sum is dense anyway.
    """
    present = [(g, w) for g, w in zip(grads, weights) if g is not None]
    if not present:
        return None
    if all(isinstance(g, tf.IndexedSlices) for g, _ in present):
        dense_shape = present[0][0].dense_shape
        values = tf.concat([g.values * tf.cast(w, g.values.dtype) for g, w in present], 0)
        indices = tf.concat([g.indices for g, _ in present], 0)
        return tf.IndexedSlices(values, indices, dense_shape)
    terms = [tf.convert_to_tensor(g) * tf.cast(w, g.dtype) for g, w in present]
    return tf.add_n(terms) if len(terms) > 1 else terms[0]


def average_gradients(tower_grads, weights=None):
    """Average gradients across towers, one result per shared variable.

    Args:
      tower_grads: num_towers x num_vars x (grad, var), as returned by
        `optimizer.compute_gradients` in each tower. Every tower lists the same
        variables in the same order. A grad may be None (the variable is unused
        by that tower's loss): it counts as zero, which is what that tower
        contributes to the total loss.
      weights: num_towers scalars (floats or scalar tensors) summing to 1, each
        tower's share of the global batch. None means equal shares (1/N), the
        classic tutorial's plain mean.

    Returns:
      num_vars x (grad, var): the weighted sum per variable, computed on the
      variable's own device. grad is a dense tensor, or tf.IndexedSlices when
      every tower's grad is sparse, or None when no tower has a gradient.

    Raises:
      GradientError: the towers disagree on their variables, or weights has the
        wrong length.
    """
    if not tower_grads:
        raise GradientError('average_gradients needs at least one tower')
    if weights is None:
        weights = [1.0 / len(tower_grads)] * len(tower_grads)
    if len(weights) != len(tower_grads):
        raise GradientError('got %d weights for %d towers' % (len(weights), len(tower_grads)))
    _check_same_variables(tower_grads)
    average = []
    with tf.name_scope('average_gradients'):
        for grads_and_vars in zip(*tower_grads):
            var = grads_and_vars[0][1]
            # The sum lands where the variable lives, as in the classic tutorial
            # (there, /cpu:0): each tower's gradient crosses once.
            with tf.device(var.device):
                grad = combine([g for g, _ in grads_and_vars], weights)
            average.append((grad, var))
    return average


_REPLICA = re.compile(r'^replica_\d+/')


def variable_name(var):
    """A variable's name as checkpoints and the user's regexes see it.

    A replicated run's copies (towers/variables.py) are named replica_<i>/NAME;
    a regex such as ^conv1/ must match them as it matches the master NAME.
    """
    return _REPLICA.sub('', var.op.name)


def check_pattern(pattern, what):
    """Compile a user's regex, or say which setting holds a bad one."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise TowersError('%s %r is not a valid regular expression: %s' % (what, pattern, e)) \
            from None


class WeightDecay:
    """L2 weight decay: rate * sum(v**2) / 2 over the variables whose name matches pattern.

    Its gradient, rate * v, is added to the *averaged* gradient of each matched
    variable, so it counts once per step whatever the number of towers (adding
    it to every tower's loss would compute it N times). `loss(variables)` is the
    term itself, for reporting.
    """

    def __init__(self, rate, pattern=r'(^|/)weights$'):
        if rate < 0:
            raise TowersError('--weight-decay must be 0 or more, got %g' % rate)
        self.rate, self.pattern = rate, check_pattern(pattern, '--decay-pattern')

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
        if max_norm <= 0:
            raise TowersError('--clip-norm must be positive, got %g' % max_norm)
        self.max_norm = max_norm

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
        self.pattern = check_pattern(pattern, '--freeze')

    def __call__(self, grads_and_vars):
        kept = [(g, v) for g, v in grads_and_vars if not self.pattern.search(variable_name(v))]
        if not any(g is not None for g, _ in kept):
            raise TowersError('--freeze %r matches every trained variable; nothing would train'
                              % self.pattern.pattern)
        return kept


def build_train_op(towers, optimizer, global_step, weight_decay=None, processors=()):
    """Average the towers' gradients, decay and process them, apply them once.

    Args:
      towers: Towers built with the optimizer (grads_and_vars set).
      optimizer: the optimizer that computed them.
      global_step: incremented by the apply.
      weight_decay: a WeightDecay, or None.
      processors: callables grads_and_vars -> grads_and_vars, applied in order
        after the decay (e.g. ClipGlobalNorm, ScaleGradient, FreezeVariables).
    Returns:
      (train_op, the grads_and_vars that were applied).
    """
    grads = average_gradients([t.grads_and_vars for t in towers],
                              weights=[t.weight for t in towers])
    if weight_decay is not None:
        grads = weight_decay(grads)
    for process in processors:
        grads = process(grads)
    apply_op = optimizer.apply_gradients(grads, global_step=global_step)
    # Batch-norm moving averages from tower 0 only: once per step, not N times.
    return tf.group(apply_op, *tower_update_ops(towers[0]), name='train_op'), grads
