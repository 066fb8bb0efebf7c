"""The Callback interface, and the images/sec window the reporting callbacks share.

The Trainer (towers/trainer.py) calls, in each callback's `order`:
  setup_graph(trainer)        while the graph is built (add ops, Savers)
  fetches(trainer) -> dict    tensors to run with every step
  wants_trace(trainer)        whether to trace the coming step (--trace)
  before_train(trainer)       session ready, variables initialised or restored
  after_step(trainer, values) values: the step's fetches, plus 'seconds'
  after_epoch(trainer)        every steps_per_epoch steps
  after_train(trainer)        the loop ended or was stopped (trainer.stopped)
  close()                     always, errors included
"""


class Callback:
    """Base class: every hook does nothing."""

    order = 50

    def setup_graph(self, trainer):
        pass

    def fetches(self, trainer):
        return {}

    def wants_trace(self, trainer):
        """True to run the coming step (trainer.step + 1) fully traced; its
        RunMetadata then arrives in after_step's values['run_metadata']."""
        return False

    def before_train(self, trainer):
        pass

    def after_step(self, trainer, values):
        pass

    def after_epoch(self, trainer):
        pass

    def after_train(self, trainer):
        pass

    def close(self):
        pass


class Throughput:
    """images/sec over the steps since the last report.

    The first warmup_steps of this process are left out (graph optimisation and
    memory allocation happen there), also when a run resumes mid-way.
    """

    def __init__(self, warmup_steps):
        self.warmup_left = warmup_steps
        self.images = 0
        self.seconds = 0.0

    def add(self, images, seconds):
        if self.warmup_left > 0:
            self.warmup_left -= 1
        else:
            self.images += images
            self.seconds += seconds

    def take(self):
        rate = self.images / self.seconds if self.seconds else None
        self.images, self.seconds = 0, 0.0
        return rate
