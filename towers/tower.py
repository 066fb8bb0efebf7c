"""Towers: one copy of the model's compute per device, one shared set of variables.

This is the classic multi-GPU recipe. The global batch is sliced, slice i goes
to device i under the name scope `tower_i`, and every tower builds the same
model under one shared variable scope (tower 0 creates the variables, the
others reuse them), so there is exactly one copy of each variable whatever the
number of towers. The variables sit on a parameter device (the tutorial's
`/cpu:0` by default); each tower's compute, and its gradients, on its own device.
"""
import collections
import contextlib
import functools

import tensorflow as tf

from towers.context import EVAL, TRAIN, TowerContext
from towers.deviceplan import DevicePlan
from towers.errors import SettingError
from towers.gradients import combine
from towers.models import layout
from towers.models.channels_first import cpu_runs_nchw
from towers.precision import Precision

tf1 = tf.compat.v1

# Op types that hold a variable's storage (resource variables, and the older
# ref variables); they go to the parameter device.
VARIABLE_OPS = frozenset(['VarHandleOp', 'VariableV2'])

TowerSlice = collections.namedtuple('TowerSlice', ['images', 'labels', 'count', 'batch'])
TowerSlice.__doc__ = """One tower's share of a global batch.

  images: [m, H, W, C] float32; labels: [m] int64.
  count: scalar int32, how many of the m examples are real (m = max(count, 1):
    an empty share carries one stand-in example, see split_batch).
  batch: scalar int32, the global batch size the share was cut from.
"""

Tower = collections.namedtuple(
    'Tower', ['device', 'scope', 'images', 'labels', 'loss', 'metrics', 'count', 'weight',
              'grads_and_vars'])
Tower.__doc__ = """The tensors of one tower.

  device: the tower's device string.
  scope: its name scope, e.g. 'tower_0/'.
  images, labels: its slice, [m_i, H, W, C] float32 and [m_i] int64, where
    m_i = max(n_i, 1) (see split_batch).
  loss: scalar float32, the mean loss over the slice (cross-entropy for
    build_towers; a ModelDesc's cost in the Trainer).
  metrics: dict name -> scalar float, each a mean over the slice (e.g.
    'accuracy'); towers combine them weighted by their share, as the loss.
  count: scalar int32, n_i.
  weight: scalar float32, n_i / global batch: the tower's share; the number 1.0 where
    the tower holds the whole batch (one tower of one process).
  grads_and_vars: num_vars x (grad, var), or None when built without optimizer.
"""


def variables_on(param_device, compute_device):
    """Device function: variables on param_device, every other op on compute_device.

    param_device may itself be a device function (e.g. one that spreads the
    variables over several devices, towers/variables.py), or None: the
    variables go where the graph's own device function puts them (a cluster's
    replica_device_setter).
    """
    def device_fn(op):
        if op.type not in VARIABLE_OPS:
            return compute_device
        if param_device is None:
            return op.device
        return param_device(op) if callable(param_device) else param_device
    return device_fn


def share_of(batch, num_parts, index):
    """(start, size) of part `index` of a batch of Python int size, cut as split_sizes cuts
    it: as equal as possible, the first parts larger (100 over 3: (0, 34), (34, 33), (67, 33))."""
    base, extra = divmod(batch, num_parts)
    return index * base + min(index, extra), base + (index < extra)


def split_sizes(batch, num_towers):
    """Per-tower slice sizes of a batch: as equal as possible, the first towers larger.

    100 over 3 towers -> [34, 33, 33]; 2 over 3 towers -> [1, 1, 0].

    Args:
      batch: scalar int32 tensor (or int), the global batch size.
      num_towers: Python int.
    Returns:
      [num_towers] int32 tensor.
    """
    base, extra = batch // num_towers, batch % num_towers
    return tf.stack([base + tf.cast(i < extra, tf.int32) for i in range(num_towers)])


def split_batch(images, labels, num_towers):
    """Slice a global batch into num_towers contiguous pieces.

    A tower whose share is empty (a batch smaller than num_towers) is handed
    the batch's last example as a stand-in, with count 0: tower_loss masks it
    out and the tower's weight is 0. Feeding it nothing would be cleaner, but
    some CPU kernels (oneDNN's max-pool gradient) abort on an empty batch.

    Args:
      images: [batch, H, W, C] float32; batch may be unknown, must be >= 1.
      labels: [batch] int64.
      num_towers: Python int.
    Returns:
      num_towers TowerSlices.
    """
    with tf.name_scope('split_batch'):
        batch = tf.shape(labels)[0]
        if num_towers == 1:
            return [TowerSlice(images, labels, batch, batch)]
        sizes = split_sizes(batch, num_towers)
        starts = tf.cumsum(sizes, exclusive=True)
        slices = []
        for i in range(num_towers):
            begin = tf.minimum(starts[i], batch - 1)
            end = begin + tf.maximum(sizes[i], 1)
            slices.append(TowerSlice(images[begin:end], labels[begin:end], sizes[i], batch))
        return slices


# Top-k accuracy's k (tf_cnn_benchmarks' and the ImageNet papers' top-5): a metric of every
# classifier of more than k classes, beside accuracy (top-1).
TOP_K = 5


def tower_loss(model_fn, images, labels, count, training, label_smoothing=0.0):
    """Build the model on one slice: its mean loss and accuracy.

    Args:
      model_fn: callable(images, training) -> logits [m, num_classes] float32.
      images: [m, H, W, C] float32.
      labels: [m] int64.
      count: scalar int32, how many of the m examples are real (the rest are
        stand-ins for an empty slice, see split_batch).
      training: Python bool or the tower's TowerContext (dropout, batch-norm
        mode), handed to model_fn.
      label_smoothing: Python float in [0, 1): the target of each example is
        (1 - label_smoothing) on its label plus label_smoothing / num_classes on
        every class; 0 for the label alone.
    Returns:
      (loss, metrics): scalar float32, the mean cross-entropy over the real
      examples (0 for none, never NaN); {'accuracy': scalar float64}, the
      fraction of the real examples classified right (0 for none), and with more
      than TOP_K classes 'top5', the fraction whose label is among the TOP_K
      highest logits (tf.math.in_top_k: a tie at the k-th place counts in).
    """
    # float32 whatever the towers compute in: the softmax needs its range (precision.py).
    logits = tf.cast(model_fn(images, training), tf.float32)
    real = tf.range(tf.shape(labels)[0]) < count
    if label_smoothing:
        # Per example, so that every tower count sums the same terms.
        targets = tf.one_hot(labels, tf.shape(logits)[1], on_value=1.0 - label_smoothing,
                             off_value=0.0) + label_smoothing / tf.cast(tf.shape(logits)[1],
                                                                          tf.float32)
        xent = tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    else:
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    xent = tf.where(real, xent, tf.zeros_like(xent))
    loss = tf.math.divide(tf.reduce_sum(xent), tf.cast(tf.maximum(count, 1), tf.float32),
                          name='loss')
    predictions = tf.argmax(logits, axis=1, output_type=labels.dtype)
    metrics = {'accuracy': _rate(tf.equal(predictions, labels), real, count, 'accuracy')}
    if (logits.shape[1] or 0) > TOP_K:  # over k classes: top-k is not 1 by construction
        metrics['top%d' % TOP_K] = _rate(tf.math.in_top_k(labels, logits, TOP_K), real, count,
                                         'top%d' % TOP_K)
    return loss, metrics


def _rate(hits, real, count, name):
    """The fraction of the real examples that hit, in float64: over a whole test set,
    count * rate gives back the exact count (a tower's rates combine as counts)."""
    hits = tf.logical_and(real, hits)
    return tf.math.divide(tf.reduce_sum(tf.cast(hits, tf.float64)),
                          tf.cast(tf.maximum(count, 1), tf.float64), name=name)


def build_towers(model_fn, images, labels, tower_devices, param_device='/cpu:0',
                 optimizer=None, training=True, reuse=False, sync_bn=False, precision=None):
    """Build one tower per device over slices of the global batch.

    Args:
      model_fn: callable(images, training) -> logits; creates its variables
        with tf.compat.v1.get_variable so that the towers share them.
      images: [batch, H, W, C] float32 (e.g. a placeholder with batch None).
      labels: [batch] int64.
      tower_devices: device strings, one per tower ('/gpu:0', '/cpu:1', ...).
      param_device: where the variables live (a device, or a device function).
      optimizer: a tf.compat.v1.train.Optimizer; when given, each tower computes
        its gradients (on its own device) into Tower.grads_and_vars.
      training: Python bool: training towers, or inference-mode ones. Each
        tower's model gets a towers.context.TowerContext for it.
      reuse: True when the variables already exist (e.g. an evaluation copy of
        a training graph); tower 0 then reuses them too.
      sync_bn: batch norms use the whole batch's moments (build_towers_from_slices).
      precision: what the towers compute in (build_towers_from_slices).
    Returns:
      A list of Tower, one per device.
    """
    with tf.device('/cpu:0'):
        # Slicing on the host, as the classic tutorial dequeues there; each
        # slice is then copied once to its tower's device.
        slices = split_batch(images, labels, len(tower_devices))
    plan = DevicePlan(tower_devices, variables=param_device)
    return build_towers_from_slices(functools.partial(tower_loss, model_fn), slices, plan,
                                    optimizer, training, reuse, sync_bn=sync_bn,
                                    precision=precision)


def build_towers_from_slices(loss_fn, slices, plan, optimizer=None, training=True, reuse=False,
                             sync_bn=False, precision=None, accumulate=1):
    """build_towers for input already cut per tower (e.g. staged on each device).

    Args:
      loss_fn: callable(images, labels, count, context) -> (loss, metrics),
        run once per tower with its TowerContext (truthy when training):
        tower_loss over a model_fn, or a ModelDesc's tower_loss (towers/model.py).
      slices: one TowerSlice per tower of the plan.
      plan: the towers.deviceplan.DevicePlan: each tower's device, where its
        variables go (one shared copy, or copies of its own), and the layout
        its maps are built in by a model written for both (plan.data_format,
        towers/models/layout.py).
      sync_bn: in training, the towers' contexts ask their batch norms to
        use the whole global batch's moments (pooled over the towers) instead
        of each slice's own.
      precision: a towers.precision.Precision (or its name): each tower casts
        its images to the compute type and reads the float32 variables cast to
        it; its loss comes back float32. None: float32.
      accumulate: K, towers in time (--accumulate): a training tower cuts its
        slice into K micro-batches (micro_slices) and runs them one after
        another in the step, summing their gradients weighted by their shares
        of the slice; 1: the slice at once.
      The other arguments are those of build_towers.
    Returns:
      A list of Tower, one per device.
    """
    precision = Precision.of(precision)
    _check_channels_first(plan, precision)
    towers = []
    for i, (device, piece) in enumerate(zip(plan.towers, slices)):
        own_scope, variable_device = plan.variable_home(i)
        # The reuse flag lives only inside this `with`, so it cannot leak into
        # the optimizer's slot creation later (Momentum/Adam get_variable calls).
        shares = own_scope is None and (reuse or i > 0)
        with tf1.variable_scope(own_scope or tf1.get_variable_scope(),
                                reuse=True if (shares or reuse) else None,
                                custom_getter=precision.getter(),
                                caching_device=plan.read_cache,
                                auxiliary_name_scope=False), \
                tf1.device(variables_on(variable_device, device)), \
                layout.prefer(plan.data_format), \
                tf1.name_scope('tower_%d' % i) as scope:
            # A tower that holds the whole batch has a weight of exactly 1: the number,
            # which the gradients' combination and the loss leave out (towers/gradients.py).
            weight = 1.0 if piece.count is piece.batch else tf.math.divide(
                tf.cast(piece.count, tf.float32), tf.cast(tf.maximum(piece.batch, 1),
                                                          tf.float32), name='weight')
            step = _TowerStep(loss_fn, optimizer, precision, plan.copies, TowerContext(
                TRAIN if training else EVAL, i, plan.num_towers, piece.count, weight,
                sync_bn=sync_bn))
            if training and accumulate > 1:
                (loss, metrics, grads_and_vars), scope = _accumulated(step, piece, accumulate)
            else:
                loss, metrics, grads_and_vars = step(piece)
        towers.append(Tower(device, scope, piece.images, piece.labels, loss, metrics,
                            piece.count, weight, grads_and_vars))
    return towers


class _TowerStep:
    """One tower's forward pass on a piece of its slice, and its backward pass where
    there is an optimizer: (loss, metrics, grads_and_vars or None).

    Built inside the tower's scopes. context is the tower's TowerContext, for the
    slice whole; a micro-batch gets its own (TowerContext.micro).
    """

    def __init__(self, loss_fn, optimizer, precision, copies, context):
        self.loss_fn, self.optimizer, self.precision = loss_fn, optimizer, precision
        self.copies, self.context = copies, context
        self.before = set(tf1.trainable_variables())

    def __call__(self, piece, context=None, after=()):
        """after: ops the forward pass waits for (the previous micro-batch's gradients)."""
        with tf.control_dependencies(after):
            loss, metrics = self.loss_fn(self.precision.cast(piece.images), piece.labels,
                                         piece.count, context or self.context)
            loss = tf.cast(loss, tf.float32)
        if self.optimizer is None:
            return loss, metrics, None
        # A tower with copies of its own differentiates only those.
        own = ([v for v in tf1.trainable_variables() if v not in self.before]
               if self.copies else None)
        # No gating: each gradient is ready as soon as it is computed, so the
        # next layer's backward pass runs beside this layer's weight gradient
        # (GATE_OP, the default, holds it back; the values are the same).
        return loss, metrics, self.optimizer.compute_gradients(
            loss, var_list=own, colocate_gradients_with_ops=True,
            gate_gradients=tf1.train.Optimizer.GATE_NONE)


def micro_slices(piece, parts):
    """A tower's slice cut into `parts` micro-batches (--accumulate), as split_batch cuts a
    global batch: contiguous, as equal as possible, the first larger, and a micro-batch
    with no real example carries a stand-in (count 0). Each one's `batch` is the slice's
    count, which its share is a part of."""
    with tf.name_scope('micro_batches'):
        size = tf.shape(piece.labels)[0]  # >= 1: the count, or an empty share's stand-in
        sizes = split_sizes(piece.count, parts)
        starts = tf.cumsum(sizes, exclusive=True)
        micros = []
        for k in range(parts):
            begin = tf.minimum(starts[k], size - 1)
            end = begin + tf.maximum(sizes[k], 1)
            micros.append(TowerSlice(piece.images[begin:end], piece.labels[begin:end],
                                     sizes[k], piece.count))
        return micros


def _micro_step(step, micro, k, whole, after, results, shares, counts):
    """Build micro-batch k of a tower (after: what its forward pass waits for); append its
    (loss, metrics, grads_and_vars, name scope), share of the slice and count."""
    share = tf.math.divide(tf.cast(micro.count, tf.float32), tf.cast(whole, tf.float32),
                           name='share_%d' % k)
    context = step.context.micro(k, micro.count, share)
    # The first builds the tower's variables (or reuses them as the tower does).
    again = tf1.variable_scope(tf1.get_variable_scope(), reuse=True,
                               auxiliary_name_scope=False) if k else contextlib.nullcontext()
    with again, tf1.name_scope('micro_%d' % k) as scope:
        results.append(step(micro, context, after) + (scope,))
    shares.append(share)
    counts.append(micro.count)


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


def _accumulated(step, piece, parts):
    """A training tower's step in `parts` micro-batches: ((loss, metrics, grads_and_vars),
    the first micro-batch's name scope, whose batch-norm updates the step runs).

    Micro-batch k starts once k-1's gradients are computed, so one micro-batch's
    activations are alive at a time; each gradient, loss and metric is weighted by its
    share of the slice (n_k / n, exact for any cut, as the towers' weights are), and the
    tower's sums go on as one tower's. Batch norm's statistics are each micro-batch's own
    (--sync-bn pools micro-batch k over the towers, its context's collective keys k's).
    """
    whole = tf.maximum(piece.count, 1)
    results, counts, shares, after, first = [], [], [], [], None
    with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=_read_once(),
                            auxiliary_name_scope=False):
        for k, micro in enumerate(micro_slices(piece, parts)):
            _micro_step(step, micro, k, whole, after, results, shares, counts)
            first = first or results[-1][3]
            grads = results[-1][2]
            after = [tf.group(*[g.op for g, _ in grads if g is not None])] if grads else []
    losses, metrics, grads, _ = zip(*results)
    loss = tf.add_n([share * part for share, part in zip(shares, losses)], name='loss')
    # In the metric's own type (accuracy's float64): sum n_k m_k / n.
    metrics = {name: tf.math.divide(
        tf.add_n([tf.cast(n, m[name].dtype) * m[name] for n, m in zip(counts, metrics)]),
        tf.cast(whole, metrics[0][name].dtype), name=name) for name in metrics[0]}
    if grads[0] is None:
        return (loss, metrics, None), first
    summed = [(combine([g[j][0] for g in grads], shares), var)
              for j, (_, var) in enumerate(grads[0])]
    return (loss, metrics, summed), first


def _check_channels_first(plan, precision):
    """Refuses NCHW on CPU towers where this CPU's TensorFlow cannot run it in the towers'
    dtype (measured: towers/models/channels_first.py), before a step fails on a kernel."""
    on_cpu = [d for d in plan.towers
              if (tf.DeviceSpec.from_string(d).device_type or 'CPU').upper() == 'CPU']
    if plan.data_format == 'NCHW' and on_cpu and not cpu_runs_nchw(precision.dtype.name):
        raise SettingError(
            '{data_format} NCHW: this CPU\'s TensorFlow has no channels-first kernels in %s '
            '(oneDNN has them, in float32 where TF_ENABLE_ONEDNN_OPTS is on and in bfloat16 or '
            'float16 only on CPUs with AVX-512): use {data_format} NHWC on CPU towers '
            '(%s)', precision.dtype.name, ','.join(on_cpu))
