"""Combining the towers' gradients and applying them: where the towers meet.

`average_gradients` is the function of the classic CIFAR-10 multi-GPU tutorial,
made exact for any split of the batch: each tower's gradient is weighted by its
share of the examples, so N towers on an uneven (or partly empty) batch give the
same update as one device on the whole batch. `build_train_op` then makes the
tutorial's single `apply_gradients`, after `process_gradients`, the one place
where the averaged gradients are changed: weight decay (added here once, not
once per tower) and gradient processors (towers/processors.py).
"""
import tensorflow as tf

from towers.errors import GradientError

tf1 = tf.compat.v1


def check_same_variables(tower_variables, name=None):
    """Every tower must list the same variables in the same order.

    Args:
      tower_variables: per tower, the variables it has gradients for.
      name: None where the towers share one copy (they must list the very same
        variables); for towers with copies of their own, callable(variable) ->
        the name a copy shares with its master (variables.variable_name).
    Raises:
      GradientError: naming what one tower has and tower 0 has not.
    """
    label = name or (lambda v: v.op.name)
    key = name or id
    reference = [key(v) for v in tower_variables[0]]
    for i, variables in enumerate(tower_variables[1:], start=1):
        if [key(v) for v in variables] == reference:
            continue
        names0 = {label(v) for v in tower_variables[0]}
        names_i = {label(v) for v in variables}
        only0, only_i = sorted(names0 - names_i), sorted(names_i - names0)
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
        if len(present) == 1 and is_one(present[0][1]):
            return present[0][0]
        dense_shape = present[0][0].dense_shape
        values = tf.concat([weighted(g.values, w) for g, w in present], 0)
        indices = tf.concat([g.indices for g, _ in present], 0)
        return tf.IndexedSlices(values, indices, dense_shape)
    terms = [weighted(tf.convert_to_tensor(g), w) for g, w in present]
    return tf.add_n(terms) if len(terms) > 1 else terms[0]


def weighted(tensor, weight):
    """tensor * weight in tensor's dtype; the tensor itself for a weight of exactly 1 (a
    tower that holds the whole batch), which multiplying would only copy."""
    return tensor if is_one(weight) else tensor * tf.cast(weight, tensor.dtype)


def count_weighted(counts, metrics):
    """Each metric's mean over parts that hold counts[i] examples each (float64): the sum
    of count x metric over the parts, over the total. In float64 so that an exact ratio such
    as accuracy stays exact to print: 912 right of 1,000 reads 0.912, not
    0.9119999825954437.

    Args:
      counts: scalar int tensors, one per part (a tower, or a tower's micro-batch).
      metrics: one {name: scalar} per part, the same names in each.
    """
    counts = [tf.cast(n, tf.float64) for n in counts]
    total = tf.maximum(tf.add_n(counts), 1.0)
    return {name: tf.math.divide(
        tf.add_n([n * tf.cast(m[name], tf.float64) for n, m in zip(counts, metrics)]),
        total, name=name) for name in sorted(metrics[0])}


def is_one(weight):
    """Whether a tower's weight is the number 1 (not a tensor that may be 1 at run time)."""
    return isinstance(weight, (int, float)) and weight == 1


def average_gradients(tower_grads, weights=None, device=None):
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
      device: where every sum is formed; None: on each variable's own device, as
        in the classic tutorial. A parameter-server worker sums its towers on its
        own device: summed on the ps, each gradient would cross the network to it and
        back before the worker pushes the sum (towers/cluster/syncreplicas.py).

    Returns:
      num_vars x (grad, var): the weighted sum per variable. grad is a dense
      tensor, or tf.IndexedSlices when every tower's grad is sparse, or None when
      no tower has a gradient.

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
    check_same_variables([[v for _, v in grads_and_vars] for grads_and_vars in tower_grads])
    average = []
    with tf.name_scope('average_gradients'):
        for grads_and_vars in zip(*tower_grads):
            var = grads_and_vars[0][1]
            # The sum lands where the variable lives, as in the classic tutorial
            # (there, /cpu:0), unless told otherwise: each tower's gradient crosses once.
            with tf.device(device or var.device):
                grad = combine([g for g, _ in grads_and_vars], weights)
            average.append((grad, var))
    return average


def process_gradients(grads_and_vars, weight_decay=None, processors=()):
    """What happens to the averaged gradients before they are applied, in this order.

    Args:
      grads_and_vars: num_vars x (grad, var), the towers' average.
      weight_decay: a towers.processors.WeightDecay (its gradient added once,
        not once per tower), or None.
      processors: callables grads_and_vars -> grads_and_vars, applied in order
        after the decay (towers/processors.py: ClipGlobalNorm, ScaleGradient,
        FreezeVariables).
    Returns:
      num_vars x (grad, var), what the optimizer applies.
    """
    if weight_decay is not None:
        grads_and_vars = weight_decay(grads_and_vars)
    for process in processors:
        grads_and_vars = process(grads_and_vars)
    return grads_and_vars


def build_train_op(towers, optimizer, global_step, weight_decay=None, processors=()):
    """Average the towers' gradients, decay and process them, apply them once.

    Args:
      towers: Towers built with the optimizer (grads_and_vars set).
      optimizer: the optimizer that computed them.
      global_step: incremented by the apply.
      weight_decay, processors: see process_gradients.
    Returns:
      (train_op, the grads_and_vars that were applied).
    """
    grads = average_gradients([t.grads_and_vars for t in towers],
                              weights=[t.weight for t in towers])
    grads = process_gradients(grads, weight_decay, processors)
    apply_op = optimizer.apply_gradients(grads, global_step=global_step)
    # Batch-norm moving averages from tower 0 only: once per step, not N times.
    return tf.group(apply_op, *tower_update_ops(towers[0]), name='train_op'), grads


def tower_update_ops(tower):
    """The UPDATE_OPS (batch-norm moving averages) built by one tower.

    Only tower 0's are run, once per step, as tf_cnn_benchmarks does: running
    every tower's would move the averages N times per step.
    """
    return tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, scope=tower.scope)
