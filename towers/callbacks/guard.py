"""NaNGuard: a step whose loss or applied gradient is not finite stops the run; SkippedSteps
says which steps a dynamic fp16 loss scale skipped."""
import numpy as np
import tensorflow as tf

from towers.callbacks.base import Callback
from towers.callbacks.checkpoint import Checkpoint
from towers.errors import TowersError


class NonFiniteStep(TowersError):
    """A step whose loss or applied gradient is NaN or Inf (NaNGuard): what went non-finite
    at which step, what to try, and the checkpoint that is intact (if any)."""

    def __init__(self, what, advice, kept, step):
        super().__init__('%s; %s%s' % (what, advice, kept))
        self.what, self.kept, self.step = what, kept, step

    def with_origin(self, origin):
        """The same error, its advice replaced by where the NaN came from (origin.py)."""
        return NonFiniteStep(self.what + self.kept, origin, '', self.step)


class NaNGuard(Callback):
    """Stop at the first step whose loss or applied gradient is NaN or Inf.

    It runs before the checkpoint callbacks, so the bad step is never saved and
    the newest checkpoint holds finite weights. The Trainer then replays the step
    to say where the NaN came from (origin.py).
    """

    order = 0

    def fetches(self, trainer):
        return {'finite': trainer.graph.finite}

    def after_step(self, trainer, values):
        if values['finite']:
            return
        loss = values['loss']
        if not np.isfinite(loss):
            what, advice = 'loss is %s at step %d' % (loss, trainer.step), 'lower {learning_rate}'
        else:
            what = 'a gradient is NaN or Inf at step %d (loss %.4g)' % (trainer.step, loss)
            advice = 'lower {learning_rate} or clip with {clip_norm}'
        saved = [c.last_saved for c in trainer.callbacks
                 if isinstance(c, Checkpoint) and c.last_saved]
        kept = ' (%s, saved before it, is intact)' % saved[0] if saved else ''
        raise NonFiniteStep(what, advice, kept, trainer.step)


class SkippedSteps(Callback):
    """Say each step a dynamic fp16 loss scale skipped (towers/precision.py), as it happens.

    A skipped step's gradients overflowed float16 at the scale; its update was
    not applied and the scale halved. Reads the scale's variables once the step
    (its update included) has run.
    """

    order = 1

    def __init__(self):
        self._after, self._skipped = None, None

    def setup_graph(self, trainer):
        scale = trainer.graph.loss_scale
        if scale is None or not scale.dynamic:
            return
        with tf.control_dependencies([trainer.graph.train_op]):
            self._after = {'loss_scale': tf.identity(scale.scale.read_value()),
                           'skipped_steps': tf.identity(scale.skipped_steps.read_value())}

    def fetches(self, trainer):
        return self._after or {}

    def before_train(self, trainer):
        if self._after is not None:  # a resumed run has skipped some already
            self._skipped = int(trainer.sess.run(trainer.graph.loss_scale.skipped_steps))

    def after_step(self, trainer, values):
        if self._after is None:
            return
        skipped = int(values['skipped_steps'])
        if skipped > self._skipped:
            trainer.log('step %d skipped: a float16 gradient overflowed at loss scale %g, the '
                        'update was not applied (%d skipped so far); the scale is now %g'
                        % (trainer.step, 2 * values['loss_scale'], skipped,
                           values['loss_scale']))
        self._skipped = skipped
