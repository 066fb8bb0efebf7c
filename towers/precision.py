"""Mixed precision: towers that compute in bfloat16 or float16 over float32 variables.

tf_cnn_benchmarks' recipe (`--use_fp16`), in graph mode:

- The variables stay float32: the master copy the optimizer updates and the
  checkpoints hold, so a checkpoint moves between precisions. Each tower reads
  them through a custom getter that casts on read (`Precision.getter`), and
  its slice of images is cast once where it enters the tower.
- What needs float32's range or digits stays float32: the loss and softmax
  (the logits are cast back, towers/tower.py), batch-norm statistics
  (towers/models/layers.py), and the gradients: the cast's own gradient hands
  each variable's back in float32, so the towers meet and are averaged there.
- float16 has 5 exponent bits: small gradients underflow to 0. Its loss is
  scaled before the backward pass and every gradient divided back after it
  (`LossScale`): by a fixed power the user gives, or dynamically, as
  tf_cnn_benchmarks' --auto_loss_scale and Keras' LossScaleOptimizer: start at
  2**15, double after `growth_steps` steps whose gradients were all finite,
  halve when one is not, and skip that step's update. bfloat16 has float32's
  exponent range and needs no scaling.

A skipped step is still a step: the global step, the data and the schedule move
on (as tf_cnn_benchmarks' step counter does); only the update is left out: the
optimizer's apply (variables, slots, Adam's powers) runs under a `tf.cond`.
The scale, its streak of finite steps and the count of skipped steps are
variables, saved with every checkpoint, so a resumed run goes on exactly.
TensorFlow's own tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
does the scaling too, but does not count what it skips, holds a step's counter
back when it skips, and cannot share one scale between a replicated run's
optimizers (each would update it once per step).
"""
import tensorflow as tf
from tensorflow.python.framework import kernels

from towers.config import DYNAMIC, check, check_loss_scale
from towers.errors import SettingError

tf1 = tf.compat.v1

DTYPES = {'fp32': tf.float32, 'bf16': tf.bfloat16, 'fp16': tf.float16}
INITIAL_SCALE = 2.0 ** 15  # Keras' and tf_cnn_benchmarks' first dynamic scale
GROWTH_STEPS = 2000  # finite steps before the dynamic scale doubles (Keras' default)
MAX_SCALE = 2.0 ** 32


class Precision:
    """What the towers compute in, and how the loss is scaled.

    Args:
      name: 'fp32', 'bf16' or 'fp16'.
      loss_scale: fp16 only: None or 'dynamic' (the default for fp16), or a
        positive number, a fixed scale (a power of two keeps the division exact).
      initial_scale, growth_steps: the dynamic scale's start and how many
        finite steps double it.
    """

    def __init__(self, name='fp32', loss_scale=None, initial_scale=INITIAL_SCALE,
                 growth_steps=GROWTH_STEPS):
        check('precision', name)
        check_loss_scale(name, loss_scale)
        self.name, self.dtype = name, DTYPES[name]
        if name == 'fp16' and loss_scale in (None, DYNAMIC):
            self.scaling = (DYNAMIC, float(initial_scale), int(growth_steps))
        elif loss_scale is not None:
            self.scaling = ('fixed', float(loss_scale), None)
        else:
            self.scaling = None

    @classmethod
    def of(cls, precision):
        """A Precision from a Precision, a name or None (fp32)."""
        return precision if isinstance(precision, cls) else cls(precision or 'fp32')

    @property
    def mixed(self):
        return self.dtype != tf.float32

    def __repr__(self):
        scaling = '' if not self.scaling else ', %s loss scale %g' % self.scaling[:2]
        return 'Precision(%s%s)' % (self.name, scaling)

    def describe(self):
        """One line: what computes in which type."""
        if not self.mixed:
            return 'float32 throughout'
        text = 'towers compute in %s over float32 variables (loss, softmax, batch-norm ' \
            'statistics and gradients in float32)' % self.dtype.name
        if self.scaling:
            kind, value, growth = self.scaling
            text += ('; dynamic loss scale from %g (doubles after %d finite steps, halves and '
                     'skips a step that overflows)' % (value, growth) if kind == DYNAMIC
                     else '; fixed loss scale %g' % value)
        return text

    def getter(self):
        """A custom getter: variables float32, each read cast to the type asked; None in fp32."""
        if not self.mixed:
            return None
        low = self.dtype

        def cast_on_read(getter, name, *args, **kwargs):  # TF passes these by keyword
            dtype = kwargs.get('dtype')
            if dtype != low:
                return getter(name, *args, **kwargs)
            kwargs['dtype'] = tf.float32
            return tf.cast(getter(name, *args, **kwargs), low)
        return cast_on_read

    def cast(self, images):
        """A tower's images in the compute type (unchanged in fp32)."""
        return tf.cast(images, self.dtype) if self.mixed else images

    def build_loss_scale(self):
        """The LossScale of a training graph (its variables, when dynamic), or None."""
        if not self.scaling:
            return None
        kind, value, growth = self.scaling
        return LossScale(value, growth if kind == DYNAMIC else None)


class LossScale:
    """The fp16 loss scale of one training graph.

    Args:
      value: the fixed scale, or the dynamic scale's start.
      growth_steps: None for a fixed scale; else finite steps before it doubles.

    Attributes:
      value: scalar float32, this step's scale, read once for every tower.
      dynamic: whether steps that overflow are skipped.
      scale, good_steps, skipped_steps: the dynamic scale's variables (saved in
        checkpoints; float32, int64, int64), else None.
      gate: scalar bool, whether this step's update is applied (its gradients
        are finite), once an optimizer's apply_gradients has been built.
    """

    def __init__(self, value, growth_steps=None):
        self.dynamic, self.growth_steps = growth_steps is not None, growth_steps
        self.scale = self.good_steps = self.skipped_steps = self.gate = None
        with tf1.variable_scope('loss_scale'):
            if not self.dynamic:
                self.value = tf.constant(value, tf.float32, name='fixed')
                return
            kept = dict(trainable=False, collections=[tf1.GraphKeys.GLOBAL_VARIABLES])
            self.scale = tf1.get_variable('scale', [], tf.float32,
                                          tf1.constant_initializer(value), **kept)
            self.good_steps = tf1.get_variable('good_steps', [], tf.int64,
                                               tf1.zeros_initializer(), **kept)
            self.skipped_steps = tf1.get_variable('skipped_steps', [], tf.int64,
                                                  tf1.zeros_initializer(), **kept)
            self.value = tf.identity(self.scale.read_value(), name='value')

    @property
    def variables(self):
        return [v for v in (self.scale, self.good_steps, self.skipped_steps) if v is not None]

    def skipped(self, sess, log):
        """The steps a dynamic scale skipped over the whole run (resumes included), said in
        one line where there are any; 0 for a fixed scale."""
        if not self.dynamic:
            return 0
        skipped, value = sess.run([self.skipped_steps, self.scale])
        if skipped:
            log('skipped %d step(s) whose float16 gradients overflowed; the loss scale is now '
                '%g' % (skipped, value))
        return int(skipped)

    def optimizer(self, optimizer, primary=True):
        """optimizer, scaling its loss and (when dynamic) skipping steps that overflow.

        primary: the optimizer whose apply moves the scale (a replicated run has
        one optimizer per copy; only the first one's decides).
        """
        return LossScaleOptimizer(optimizer, self, primary)

    def stuck(self, train_op):
        """Scalar bool, once train_op has run: the step overflowed at scale 1 (a NaN or Inf
        no scale removes): it was skipped at 1 and the scale stays there."""
        with tf.control_dependencies([train_op]):
            after = tf.identity(self.scale.read_value())
            streak = tf.identity(self.good_steps.read_value())
        # Applied at 1, the streak is at least 1, or the scale grew; skipped, both stay.
        return tf.logical_and(tf.logical_and(self.value <= 1.0, after <= 1.0),
                              tf.equal(streak, 0), name='stuck_at_1')

    def update(self, finite):
        """The op that moves the dynamic scale after a step whose gradients were finite or not."""
        with tf1.name_scope('loss_scale_update'), tf1.colocate_with(self.scale):
            streak = tf.where(finite, self.good_steps + 1, tf.zeros([], tf.int64))
            grow = streak >= self.growth_steps
            scale = tf.where(finite,
                             tf.where(grow, tf.minimum(self.value * 2.0, MAX_SCALE), self.value),
                             tf.maximum(self.value / 2.0, 1.0))
            return tf.group(tf1.assign(self.scale, scale),
                            tf1.assign(self.good_steps,
                                       tf.where(grow, tf.zeros([], tf.int64), streak)),
                            tf1.assign_add(self.skipped_steps,
                                           tf.cast(tf.logical_not(finite), tf.int64)))


class LossScaleOptimizer:
    """A tf.compat.v1 optimizer whose gradients are of the scaled loss, divided back.

    Duck-typed as the optimizers towers' strategies call (compute_gradients,
    apply_gradients, the slot accessors), so it wraps any of them, and
    SyncReplicasOptimizer can wrap it in turn.
    """

    def __init__(self, optimizer, loss_scale, primary=True):
        self._opt, self._scale, self._primary = optimizer, loss_scale, primary

    def compute_gradients(self, loss, *args, **kwargs):
        value = self._scale.value
        pairs = self._opt.compute_gradients(loss * value, *args, **kwargs)
        inverse = 1.0 / value  # a power of two: the division is exact
        return [(_times(g, inverse), v) for g, v in pairs]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if not self._scale.dynamic:
            return self._opt.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        pairs = list(grads_and_vars)
        finite = all_finite([g for g, _ in pairs if g is not None])

        def apply():
            with tf.control_dependencies([self._opt.apply_gradients(
                    pairs, global_step=global_step, name=name)]):
                return tf.constant(True)

        def skip():  # the step still counts: the global step moves on
            moved = [tf1.assign_add(global_step, 1)] if global_step is not None else []
            with tf.control_dependencies(moved):
                return tf.constant(False)

        applied = tf.cond(finite, apply, skip, name='apply_if_finite')
        if not self._primary:
            return applied.op
        self._scale.gate = finite
        return tf.group(applied, self._scale.update(finite), name='loss_scaled_apply')

    def get_slot(self, *args, **kwargs):
        return self._opt.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._opt.get_slot_names(*args, **kwargs)

    def get_name(self):
        return self._opt.get_name()

    def variables(self):
        return self._opt.variables()


def _times(grad, factor):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor


def all_finite(tensors):
    """Scalar bool: no NaN or Inf in any of the tensors (IndexedSlices by their values).

    Each device's tensors are checked and reduced to one bool where they are: a step's
    guard copies one scalar per device to the host, not one per gradient (161 for
    ResNet-50 on a GPU, each a device-to-host copy and a sync).
    """
    with tf1.name_scope('all_finite'):
        by_device = {}
        for t in tensors:
            values = t.values if isinstance(t, tf.IndexedSlices) else t
            by_device.setdefault(values.device, []).append(values)
        checks = []
        for device, group in by_device.items():
            with tf.device(device):
                flags = [tf.reduce_all(tf.math.is_finite(v)) for v in group]
                checks.append(flags[0] if len(flags) == 1 else tf.reduce_all(tf.stack(flags)))
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def check_kernels(graph, precision, scopes=('tower_',)):
    """SettingError naming the first op of the towers that has no kernel for its type there.

    Every op whose `T` is the compute type must have a kernel registered for
    its device's type (CPU, GPU) and that type; else the run would fail at its
    first step with a placement error, or a soft placement would quietly move
    the op to the CPU.
    """
    if not precision.mixed:
        return
    dtype = precision.dtype.as_datatype_enum
    known = {}
    for op in graph.get_operations():
        if not op.name.startswith(scopes) or 'T' not in op.node_def.attr:
            continue
        if op.node_def.attr['T'].type != dtype:
            continue
        device = tf.DeviceSpec.from_string(op.device or '').device_type or 'CPU'
        key = (op.type, device)
        if key not in known:
            known[key] = _has_kernel(op.type, device, dtype)
        if not known[key]:
            raise SettingError('{precision} %s: %s (%s) has no %s kernel for %s on this '
                               'TensorFlow; train this model in another {precision}',
                               precision.name, op.type, op.name, device, precision.dtype.name)


def _has_kernel(op_type, device_type, dtype):
    for kernel in kernels.get_registered_kernels_for_op(op_type).kernel:
        if kernel.device_type != device_type:
            continue
        allowed = [c.allowed_values.list.type for c in kernel.constraint if c.name == 'T']
        if not allowed or dtype in allowed[0]:
            return True
    return False
