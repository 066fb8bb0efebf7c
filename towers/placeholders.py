"""FedBatch: the classic recipe's training batch, two placeholders fed by hand.

The CIFAR-10 tutorial's loop feeds each global batch through placeholders and cuts
it per tower. build_training_graph builds these when it is given no input source
(a graph only built, or fed through `images` and `labels` by hand);
towers.inputs.FeedInput builds the same ones and feeds them from a DataSet each
step. They live here, below the inputs, so that the core needs none of towers.inputs.
"""
import tensorflow as tf

from towers.slicing import split_batch

tf1 = tf.compat.v1


class FedBatch:
    """The placeholders of a fed global batch, cut one TowerSlice per tower.

    Attributes:
      images: placeholder [None, H, W, C] float32 named 'images', once built.
      labels: placeholder [None] int64 named 'labels', once built.
    """

    name = 'feed'
    # The cut: split_batch, unless a caller gives its own (towers check --split).
    split = staticmethod(split_batch)

    def __init__(self):
        self.images = self.labels = None

    def build(self, input_shape, tower_devices):
        """Make the placeholders in the default graph; returns len(tower_devices) TowerSlices,
        cut on the CPU as the feed arrives there."""
        self.images = tf1.placeholder(tf.float32, [None] + list(input_shape), name='images')
        self.labels = tf1.placeholder(tf.int64, [None], name='labels')
        with tf.device('/cpu:0'):
            return self.split(self.on_host(self.images), self.labels, len(tower_devices))

    def on_host(self, images):
        """What the fed images become on the host before they are cut (a subclass's
        augmentation); the images themselves here."""
        return images
