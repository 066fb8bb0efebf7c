"""synthetic: one random batch per tower, held on the tower's device.

No input cost at all: the upper bound for benchmarks, never a way to train.
"""
import tensorflow as tf

from towers.inputs.base import InputSource
from towers.names import INPUT_MODES
from towers.slicing import TowerSlice, share_of

tf1 = tf.compat.v1


class SyntheticInput(InputSource):
    """One fixed random batch, each tower's share held on the tower's device.

    Args:
      batch_size: the global batch.
      num_classes: labels are drawn from [0, num_classes).
    """

    name, tf_data, stages, has_images = INPUT_MODES['synthetic']

    @classmethod
    def over(cls, dataset, sampler, batch_size, num_classes, seed=0, epochs=None, mean=None,
             std=None, share=None, augment=None):
        """A worker's (share) is its share of a random batch, as a benchmark's."""
        return cls(share_of(batch_size, share[1], share[0])[1] if share else batch_size,
                   num_classes)

    def __init__(self, batch_size, num_classes):
        self.batch_size, self.num_classes = batch_size, num_classes

    def build(self, input_shape, tower_devices):
        num_towers = len(tower_devices)
        slices = []
        for i, device in enumerate(tower_devices):
            _, count = share_of(self.batch_size, num_towers, i)
            with tf.device(device), tf1.variable_scope('synthetic_%d' % i):
                # Local variables: filled once by init_op, never saved.
                images = tf1.get_local_variable(
                    'images', shape=[max(count, 1)] + list(input_shape), dtype=tf.float32,
                    initializer=tf1.random_uniform_initializer())
                labels = tf1.get_local_variable(
                    'labels', shape=[max(count, 1)], dtype=tf.int64,
                    initializer=tf1.random_uniform_initializer(0, self.num_classes))
                slices.append(TowerSlice(images.read_value(), labels.read_value(),
                                         tf.constant(count), tf.constant(self.batch_size)))
        return slices
