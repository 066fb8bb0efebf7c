"""Checkpoint: the shared variables saved every K steps, at each epoch end and at the end."""
from towers import checkpoints
from towers.callbacks.base import Callback
from towers.errors import TowersError
from towers.logdir import take_over


class Checkpoint(Callback):
    """Save the shared variables every K steps, at each epoch end and at the end.

    Keeps the newest `keep` checkpoints in the logdir (older ones are deleted,
    also across resumes). The data order's settings are variables too, so a
    checkpoint says which batches come next.

    Args:
      every_steps: save every this many steps (0: only epochs and the end).
      keep: how many of the newest checkpoints to keep.
      at_epoch_end: also save when an epoch ends.
    """

    order = 15

    def __init__(self, every_steps=500, keep=5, at_epoch_end=True):
        self.every_steps, self.keep, self.at_epoch_end = every_steps, keep, at_epoch_end
        self.saver, self.last_saved, self._saved_step = None, None, None

    def setup_graph(self, trainer):
        if not trainer.logdir:
            raise TowersError('the Checkpoint callback needs a logdir')
        # One copy of each variable (local ones hold input state; replicas are copies).
        self.saver = checkpoints.make_saver(trainer.graph.strategy.saved_variables(), self.keep)
        self.weights_finite = checkpoints.weights_finite()

    def before_train(self, trainer):
        state = take_over(trainer.logdir, self.saver, trainer.log)  # this run holds it now
        if state and state.model_checkpoint_path:
            self.last_saved = state.model_checkpoint_path

    def save(self, trainer):
        if self._saved_step != trainer.step:
            checkpoints.check_weights(trainer.sess, self.weights_finite, trainer.step,
                                      self.last_saved)
            self.last_saved = checkpoints.save(self.saver, trainer.sess, trainer.logdir,
                                               trainer.step)
            self._saved_step = trainer.step

    def after_step(self, trainer, values):
        if self.every_steps and trainer.step % self.every_steps == 0:
            self.save(trainer)

    def after_epoch(self, trainer):
        if self.at_epoch_end:
            self.save(trainer)

    def after_train(self, trainer):
        self.save(trainer)
        trainer.log('checkpoint: %s' % self.last_saved)
