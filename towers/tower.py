"""Towers: one copy of the model's compute per device, one shared set of variables.

This is the classic multi-GPU recipe. The global batch is sliced, slice i goes
to device i under the name scope `tower_i`, and every tower builds the same
model under one shared variable scope (tower 0 creates the variables, the
others reuse them), so there is exactly one copy of each variable whatever the
number of towers. The variables sit on a parameter device (the tutorial's
`/cpu:0` by default); each tower's compute, and its gradients, on its own device.
"""
import collections
import functools

import tensorflow as tf

from towers.accumulation import accumulated
from towers.context import EVAL, TRAIN, TowerContext
from towers.deviceplan import DevicePlan
from towers.errors import SettingError
from towers.models import layout
from towers.models.channels_first import cpu_runs_nchw
from towers.precision import Precision
from towers.slicing import split_batch

tf1 = tf.compat.v1

# Op types that hold a variable's storage (resource variables, and the older
# ref variables); they go to the parameter device.
VARIABLE_OPS = frozenset(['VarHandleOp', 'VariableV2'])

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
        slice into K micro-batches and runs them one after
        another in the step, summing their gradients weighted by their shares
        of the slice (towers/accumulation.py); 1: the slice at once.
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
            step = TowerStep(loss_fn, optimizer, precision, plan.copies, TowerContext(
                TRAIN if training else EVAL, i, plan.num_towers, piece.count, weight,
                sync_bn=sync_bn))
            if training and accumulate > 1:
                (loss, metrics, grads_and_vars), scope = accumulated(step, piece, accumulate)
            else:
                loss, metrics, grads_and_vars = step(piece)
        towers.append(Tower(device, scope, piece.images, piece.labels, loss, metrics,
                            piece.count, weight, grads_and_vars))
    return towers


class TowerStep:
    """One tower's forward pass on a piece of its slice, and its backward pass where
    there is an optimizer: (loss, metrics, grads_and_vars or None).

    Built inside the tower's scopes. context is the tower's TowerContext, for the
    slice whole; a micro-batch gets its own (TowerContext.micro, towers/accumulation.py).
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
