"""TowerContext: what a layer may ask about the tower it is being built in.

tensorpack's TowerContext, passed explicitly instead of kept in a global: the
tower builder (towers/tower.py) hands each tower's model its context as the
`training` argument, `model_fn(images, context)`. It is truthy exactly when
the tower trains, so a model written for `training: bool` works unchanged,
and the layers that need more (batch norm under --sync-bn, towers/models/
layers.py) read it from there. TensorFlow-free: the models import it, and it
imports nothing of towers.
"""

TRAIN, EVAL = 'train', 'eval'


class TowerContext:
    """One tower's mode, index and share of the batch.

    Args:
      mode: 'train' or 'eval'.
      index: this tower's index, 0 .. num_towers - 1.
      num_towers: how many towers the step has.
      count: scalar int32 tensor, the real examples in this tower's slice (a
        stand-in for an empty share is not one of them).
      weight: scalar float32 tensor, this tower's share of the global batch:
        its gradient is weighted so.
      sync_bn: batch norms pool their statistics over all the towers (TF
        collective ops), so that N towers normalise as one device on the
        whole batch; only in training.
    """

    # The collective group the towers of one step form (--sync-bn).
    GROUP_KEY = 1
    # Micro-batch k's batch norms (--accumulate) meet under keys from k * KEYS_PER_MICRO on.
    KEYS_PER_MICRO = 1000000

    def __init__(self, mode, index, num_towers, count, weight, sync_bn=False,
                 micro_batch=None):
        if mode not in (TRAIN, EVAL):
            raise ValueError('a tower is built to train or eval, not %r' % (mode,))
        self.mode, self.index, self.num_towers = mode, index, num_towers
        self.count, self.weight = count, weight
        self.sync_bn = sync_bn and mode == TRAIN
        self.micro_batch = micro_batch
        self._collectives = (micro_batch or 0) * self.KEYS_PER_MICRO

    def micro(self, k, count, weight):
        """The context of this tower's micro-batch k (--accumulate): its count, and the
        weight its gradient goes on with (its share of the slice times the tower's
        weight); its batch norms pool with the other towers' micro-batch k."""
        return TowerContext(self.mode, self.index, self.num_towers, count, weight,
                            self.sync_bn, micro_batch=k)

    @property
    def training(self):
        return self.mode == TRAIN

    def __bool__(self):
        return self.training

    def __repr__(self):
        return 'TowerContext(%s, tower %d of %d%s%s)' % (
            self.mode, self.index, self.num_towers, ', sync_bn' if self.sync_bn else '',
            '' if self.micro_batch is None else ', micro-batch %d' % self.micro_batch)

    def next_collective_keys(self):
        """Collective instance keys (forward, backward) of the next pooled batch norm.

        Every tower builds its batch norms in the same order, so the k-th of
        each meet under the same keys.
        """
        self._collectives += 1
        return 2 * self._collectives, 2 * self._collectives + 1


def is_training_flag(training):
    """Whether `training` is what a model takes: a Python bool or a TowerContext.

    A tensor would silently be truthy and turn evaluation into training.
    """
    return isinstance(training, (bool, TowerContext))
