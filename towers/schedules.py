"""Learning-rate schedules: tensors of the global step, counted in epochs.

The rate is computed in the graph from global_step (TensorFlow's own
piecewise_constant and exponential_decay), so a resumed run continues on the
same curve with nothing to restore, and the optimizer reads it every step.

From the command line (`--lr 0.1 --lr-schedule SPEC --warmup-epochs W`):
  constant                      the rate stays --lr (default)
  piecewise:EPOCH=LR,...        from each EPOCH on the rate is LR, e.g. piecewise:80=0.01,120=0.001
  exponential:FACTOR,EPOCHS     multiply by FACTOR every EPOCHS epochs, in steps (a staircase),
                                as the classic CIFAR-10 tutorial does with 0.1 every 350 epochs
  cosine[:EPOCHS]               half a cosine from the rate down to 0 over EPOCHS (default: the
                                whole run), after the warm-up (Loshchilov & Hutter 2017, as
                                NVIDIA's ResNet-50 v1.5)
  poly[:POWER[,END]]            (1 - t)^POWER from the rate down to END (default 2 and 0) over
                                the run after the warm-up, as MLPerf's ResNet-50 with LARS
                                (power 2, END 0.0001)
--warmup-epochs W ramps the rate up linearly over the first W epochs (Goyal
et al. 2017), in front of any schedule.
"""
import fractions
import math

from towers.errors import SettingError
from towers.names import SCHEDULES


def total_steps(epochs, steps, steps_per_epoch):
    """Steps of a whole run; a fractional epoch count is rounded up to a step."""
    if steps is not None:
        return steps
    # Fraction: 0.07 epochs of 1,100 steps is 77 steps, not 78 as float ceil says.
    return max(1, math.ceil(fractions.Fraction(repr(float(epochs))) * steps_per_epoch))


class LearningRate:
    """A base rate, a schedule in epochs, and an optional linear warm-up.

    Args:
      base: the rate at the start (after warm-up).
      kind: 'constant', 'piecewise' or 'exponential'.
      points: piecewise: [(epoch, rate)] in increasing epoch order.
      factor, every: exponential: multiply by factor every `every` epochs.
      length: cosine: the epochs it decays over, None for the whole run (build's total_steps).
      power, end: poly: the polynomial's power and the rate it ends at.
      warmup_epochs: linear ramp from base/warmup_steps to base over this many epochs.
    """

    def __init__(self, base, kind='constant', points=(), factor=None, every=None,
                 warmup_epochs=0.0, length=None, power=2.0, end=0.0):
        if not (base > 0 and math.isfinite(base)):
            raise SettingError('{learning_rate} must be positive, got %g', base)
        if not (warmup_epochs >= 0 and math.isfinite(warmup_epochs)):
            raise SettingError('{warmup_epochs} must be 0 or more, got %g', warmup_epochs)
        if kind not in SCHEDULES:
            raise SettingError('unknown {lr_schedule} %r; choose one of: %s', kind,
                               ', '.join(SCHEDULES))
        self.base, self.kind, self.points = float(base), kind, list(points)
        self.factor, self.every, self.warmup_epochs = factor, every, float(warmup_epochs)
        self.length, self.power, self.end = length, power, end

    @classmethod
    def parse(cls, base, spec='constant', warmup_epochs=0.0):
        """A LearningRate from the --lr-schedule text; SettingError naming what is wrong."""
        kind, _, args = (spec or 'constant').partition(':')
        usage = ('{lr_schedule} wants constant, piecewise:EPOCH=LR,..., '
                 'exponential:FACTOR,EPOCHS, cosine[:EPOCHS] or poly[:POWER[,END]], got %r')
        try:
            if kind == 'constant' and not args:
                return cls(base, warmup_epochs=warmup_epochs)
            numbers = [float(v) for v in args.replace('=', ',').split(',')] if args else []
            if not all(math.isfinite(v) for v in numbers):
                raise SettingError(usage + ': every number must be finite', spec)
            if kind == 'piecewise':
                points = [(float(e), float(r)) for e, r in
                          (item.split('=') for item in args.split(','))]
                epochs = [e for e, _ in points]
                if not points or epochs != sorted(set(epochs)) or epochs[0] <= 0 \
                        or min(r for _, r in points) <= 0:
                    raise SettingError(usage + ': epochs must increase from above 0 and rates '
                                       'be positive', spec)
                return cls(base, 'piecewise', points=points, warmup_epochs=warmup_epochs)
            if kind == 'cosine':
                length = float(args) if args else None
                if length is not None and not length > warmup_epochs:
                    raise SettingError(usage + ': its EPOCHS must pass the warm-up\'s %g',
                                       spec, warmup_epochs)
                return cls(base, 'cosine', length=length, warmup_epochs=warmup_epochs)
            if kind == 'poly' and len(numbers) <= 2:
                power, end = (numbers + [2.0, 0.0][len(numbers):])
                if not power > 0 or not 0 <= end < base:
                    raise SettingError(usage + ': POWER must be positive and END lie in [0, the '
                                       'rate)', spec)
                return cls(base, 'poly', power=power, end=end, warmup_epochs=warmup_epochs)
            if kind == 'exponential':
                factor, every = (float(v) for v in args.split(','))
                if not 0 < factor or not every > 0:
                    raise SettingError(usage + ': FACTOR and EPOCHS must be positive', spec)
                return cls(base, 'exponential', factor=factor, every=every,
                           warmup_epochs=warmup_epochs)
        except ValueError:
            pass
        raise SettingError(usage, spec)

    def build(self, global_step, steps_per_epoch, total_steps=None):
        """Scalar float32 tensor: the rate for the step global_step is about to take;
        total_steps: the run's length, which a cosine without EPOCHS decays over."""
        import tensorflow as tf  # only here: a schedule is parsed without TensorFlow
        tf1 = tf.compat.v1
        with tf1.name_scope('learning_rate'):
            step = tf.cast(global_step, tf.int64)
            if self.kind == 'piecewise':
                # piecewise_constant switches once step > boundary: one step
                # before the epoch's first, so that step already has the new rate.
                boundaries = [tf.constant(_steps(e, steps_per_epoch) - 1, tf.int64)
                              for e, _ in self.points]
                values = [self.base] + [r for _, r in self.points]
                rate = tf1.train.piecewise_constant(step, boundaries, values)
            elif self.kind == 'exponential':
                rate = tf1.train.exponential_decay(
                    self.base, step, _steps(self.every, steps_per_epoch), self.factor,
                    staircase=True)
            elif self.kind in ('cosine', 'poly'):
                rate = self._decay(step, steps_per_epoch, total_steps)
            else:
                rate = tf.constant(self.base)
            warmup_steps = _steps(self.warmup_epochs, steps_per_epoch)
            if warmup_steps > 0:
                ramp = tf.minimum(1.0, tf.cast(step + 1, tf.float32) / float(warmup_steps))
                rate = rate * ramp
            return tf.identity(tf.cast(rate, tf.float32), name='value')

    def _decay(self, step, steps_per_epoch, total_steps):
        """TensorFlow's cosine_decay or polynomial_decay from the end of the warm-up to the end
        of its length."""
        import tensorflow as tf
        warmup_steps = _steps(self.warmup_epochs, steps_per_epoch)
        length = total_steps if self.length is None else _steps(self.length, steps_per_epoch)
        if length is None:
            raise SettingError('{lr_schedule} %s decays over the run: give its length '
                               '(cosine:EPOCHS) where the run has none', self.kind)
        if length <= warmup_steps:
            raise SettingError('{lr_schedule} %s decays after the warm-up of %d steps, but '
                               'the run is only %d steps long', self.kind, warmup_steps, length)
        after = tf.maximum(step - warmup_steps, 0)
        if self.kind == 'poly':
            return tf.compat.v1.train.polynomial_decay(self.base, after, length - warmup_steps,
                                                       self.end, self.power)
        return tf.compat.v1.train.cosine_decay(self.base, after, length - warmup_steps)

    def describe(self):
        text = {'constant': 'constant %g' % self.base,
                'piecewise': '%g, then %s' % (self.base, ', '.join(
                    '%g from epoch %g' % (r, e) for e, r in self.points)),
                'exponential': '%g x %g every %g epochs' % (self.base, self.factor or 0,
                                                            self.every or 0),
                'cosine': 'cosine from %g to 0 over %s' % (
                    self.base, 'the run' if self.length is None else '%g epochs' % self.length),
                'poly': 'polynomial (power %g) from %g to %g over the run' % (
                    self.power, self.base, self.end),
                }[self.kind]
        return text + (', linear warm-up over %g epochs' % self.warmup_epochs
                       if self.warmup_epochs else '')


def _steps(epochs, steps_per_epoch):
    """Epochs as a whole number of steps (at least 1 for any positive count)."""
    if epochs <= 0:
        return 0
    return max(1, int(round(epochs * steps_per_epoch)))
