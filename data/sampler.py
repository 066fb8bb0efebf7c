"""Which examples make up each training step: a stateless, seeded epoch sampler.

The batch of global step s depends only on (seed, s). Epoch e = s // steps_per_epoch
is a permutation drawn from RandomState([seed, e]); step s takes the next
batch_size indices of it, and the last batch of an epoch is short when
batch_size does not divide N. So every epoch shows each example exactly once,
and a run resumed at step s sees exactly the batches an uninterrupted run would,
with nothing to save but the step.
"""
import numpy as np


class EpochSampler:
    """Index batches for global steps 0, 1, 2, ... over num_examples examples.

    Args:
      num_examples: N >= 1.
      batch_size: global batch, 1 <= batch_size.
      seed: int; the same seed gives the same order.
      shuffle: False serves 0..N-1 in order every epoch.
    """

    def __init__(self, num_examples, batch_size, seed=0, shuffle=True):
        if num_examples < 1:
            raise ValueError('cannot sample batches from an empty dataset')
        if batch_size < 1:
            raise ValueError('batch_size must be at least 1, got %d' % batch_size)
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.steps_per_epoch = -(-num_examples // batch_size)
        self._cached_epoch, self._cached_order = None, None

    def epoch_order(self, epoch):
        """int64 [N]: the order of the examples in one epoch."""
        if epoch != self._cached_epoch:
            if self.shuffle:
                order = np.random.RandomState([self.seed, epoch]).permutation(self.num_examples)
            else:
                order = np.arange(self.num_examples)
            self._cached_epoch, self._cached_order = epoch, order.astype(np.int64)
        return self._cached_order

    def indices(self, step):
        """int64 [batch_size] (or fewer, at an epoch's end): the examples of a step."""
        epoch, position = divmod(step, self.steps_per_epoch)
        start = position * self.batch_size
        return self.epoch_order(epoch)[start:start + self.batch_size]
