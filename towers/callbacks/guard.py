"""NaNGuard: a step whose loss or applied gradient is not finite stops the run."""
import numpy as np

from towers.callbacks.base import Callback
from towers.callbacks.checkpoint import Checkpoint
from towers.errors import TowersError


class NaNGuard(Callback):
    """Stop at the first step whose loss or applied gradient is NaN or Inf.

    It runs before the checkpoint callbacks, so the bad step is never saved and
    the newest checkpoint holds finite weights.
    """

    order = 0

    def fetches(self, trainer):
        return {'finite': trainer.graph.finite}

    def after_step(self, trainer, values):
        if values['finite']:
            return
        loss = values['loss']
        if not np.isfinite(loss):
            message = 'loss is %s at step %d; lower {learning_rate}' % (loss, trainer.step)
        else:
            message = ('a gradient is NaN or Inf at step %d (loss %.4g); lower {learning_rate} '
                       'or clip with {clip_norm}' % (trainer.step, loss))
        saved = [c.last_saved for c in trainer.callbacks
                 if isinstance(c, Checkpoint) and c.last_saved]
        if saved:
            message += ' (%s, saved before it, is intact)' % saved[0]
        raise TowersError(message)
