"""The augmentation of a global batch fed from the host (feed, staging), in the graph.

TensorFlow ops rather than numpy in the batch function: the recipes are written once
(towers/data/augment.py) and train the same in every mode, inception's box sampling
included, and the ops run in TensorFlow's threads, not under the GIL of the loader. The
batch is augmented on the host before it is cut per tower, its numbers drawn from (the run's
seed, the step), row i of the global batch from row i of the draw: N towers get what one
device gets, a cluster worker's share what those rows of the whole batch get, and a resumed
run what the uninterrupted one got. Fed with each batch: the step, and where its rows sit
in the global batch.
"""
import tensorflow as tf

from towers.data.augment import CENTER, as_augmentation, augment_batch
from towers.errors import SettingError
from towers.slicing import share_of

tf1 = tf.compat.v1


class FedAugmentation:
    """A fed batch augmented as the step it is fed for says.

    Args:
      augment: None (nothing), a name of towers.names.AUGMENTATIONS, or an Augmentation.
      seed: the run's seed.
      sampler: the EpochSampler the batches follow, for the size of each step's global
        batch when a share of it is fed; None: each fed batch is a whole global batch.
      share: (index, count): the fed rows are share index of count of the global batch, cut
        as split_batch cuts; None: all of it.
    """

    def __init__(self, augment=None, seed=0, sampler=None, share=None):
        self.augmentation = as_augmentation(augment)
        self.seed, self.sampler, self.share = seed, sampler, share
        if share is not None and sampler is None and self.augmentation is not None \
                and self.augmentation.name != CENTER:
            raise SettingError('a share of each global batch is augmented as those rows of the '
                               'whole batch: give the sampler the batches follow')
        self._step = None

    def apply(self, images):
        """images [n, H, W, C] (a placeholder, on the host) -> the same, augmented."""
        if self.augmentation is None or self.augmentation.name == CENTER:
            return images
        with tf1.name_scope('augment'):
            self._step = tf1.placeholder_with_default(tf.constant(0, tf.int64), [], 'step')
            self._first = tf1.placeholder_with_default(tf.constant(0, tf.int64), [], 'first')
            self._total = tf1.placeholder_with_default(tf.constant(-1, tf.int64), [], 'total')
            return augment_batch(images, self.augmentation.name, self.seed, self._step,
                                 self._first, self._total)

    def feed(self, step):
        """The feed_dict entries that key the batch of `step` ({} when nothing is drawn)."""
        if self._step is None:
            return {}
        first, total = 0, -1
        if self.share is not None:
            total = len(self.sampler.indices(step))
            first = share_of(total, self.share[1], self.share[0])[0]
        return {self._step: step, self._first: first, self._total: total}
