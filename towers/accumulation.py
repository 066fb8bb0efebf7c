"""--accumulate K: towers in time. A training tower cuts its slice into K micro-batches
(towers/slicing.py micro_slices) and builds them one after another inside the step; their
gradients, losses and metrics are weighted by their shares of the slice and summed, and the
tower goes on as one tower (towers/tower.py). One Session.run a step, so a checkpoint never
sees half of one.
"""
import contextlib

import tensorflow as tf

from towers.gradients import combine, count_weighted, weighted
from towers.slicing import micro_slices

tf1 = tf.compat.v1


def accumulated(step, piece, parts):
    """A training tower's step in `parts` micro-batches: ((loss, metrics, grads_and_vars),
    the first micro-batch's name scope, whose batch-norm updates the step runs).

    Args:
      step: the tower's towers.tower.TowerStep, built inside its scopes.
      piece: the tower's TowerSlice.

    Micro-batch k starts once k-1's gradients are computed, so one micro-batch's
    activations are alive at a time; each gradient, loss and metric is weighted by its
    share of the slice (n_k / n, exact for any cut, as the towers' weights are). Batch
    norm's statistics are each micro-batch's own (--sync-bn pools micro-batch k over the
    towers, under its context's own collective keys).
    """
    whole = tf.cast(tf.maximum(piece.count, 1), tf.float32)
    built, after = [], []
    with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=_read_once(),
                            auxiliary_name_scope=False):
        for k, micro in enumerate(micro_slices(piece, parts)):
            built.append(_micro_step(step, micro, k, whole, after))
            grads = built[-1][2]
            after = [tf.group(*[g.op for g, _ in grads if g is not None])] if grads else []
    losses, metrics, grads, scopes, shares, counts = zip(*built)
    loss = tf.add_n([share * part for share, part in zip(shares, losses)], name='loss')
    metrics = count_weighted(counts, metrics)
    if grads[0] is None:
        return (loss, metrics, None), scopes[0]
    summed = [(combine([g[j][0] for g in grads], shares), var)
              for j, (_, var) in enumerate(grads[0])]
    return (loss, metrics, summed), scopes[0]


def _micro_step(step, micro, k, whole, after):
    """Micro-batch k of a tower, its forward pass waiting for `after`: (loss, metrics,
    grads_and_vars, name scope, share of the slice, count)."""
    share = tf.math.divide(tf.cast(micro.count, tf.float32), whole, name='share_%d' % k)
    # Its gradient goes on weighted by the share times the tower's weight.
    context = step.context.micro(k, micro.count, weighted(share, step.context.weight))
    # The first builds the tower's variables (or reuses them as the tower does).
    again = tf1.variable_scope(tf1.get_variable_scope(), reuse=True,
                               auxiliary_name_scope=False) if k else contextlib.nullcontext()
    with again, tf1.name_scope('micro_%d' % k) as scope:
        return step(micro, context, after) + (scope, share, micro.count)


def _read_once():
    """A custom getter under which a tower's micro-batches share one read of each trained
    variable, made on the tower's device by the first: a tower away from its variables
    copies them once a step, not once a micro-batch. (Batch norm's moving averages, which
    the step assigns, are handed out as they are.)"""
    reads = {}

    def read_once(getter, name, *args, **kwargs):
        value = getter(name, *args, **kwargs)
        if kwargs.get('trainable') is False:
            return value
        if name not in reads:
            reads[name] = tf.identity(value, name='read_once')
        return reads[name]
    return read_once


def accumulation_line(parts, sync_bn, batch_norm):
    """What --accumulate K does to a run, in the words of its first lines; batch_norm:
    whether the model has batch norm, whose statistics are each micro-batch's own."""
    norms = ('; batch norm\'s statistics are each micro-batch\'s own%s'
             % (' pooled over the towers (--sync-bn)' if sync_bn else '')) if batch_norm else ''
    return ('accumulating: each tower runs its slice as %d micro-batches one after another, and '
            'the step applies their summed gradients once%s' % (parts, norms))
