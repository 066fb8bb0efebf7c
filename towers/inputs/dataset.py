"""dataset: an in-graph tf.data pipeline (towers/data/pipeline.py).

Cleaning, normalisation, augmentation, shuffling and batching run in
TensorFlow's own threads, prefetched ahead of the step; the batch is split
over the towers on the host.
"""
import tensorflow as tf

from towers.data import pipeline
from towers.errors import SettingError
from towers.inputs.base import InputSource
from towers.tower import split_batch

tf1 = tf.compat.v1


class DatasetInput(InputSource):
    """An in-graph tf.data pipeline over in-memory arrays (or any source).

    Args:
      images: numpy [N, H, W, C], bytes (pixel_scale 255) or floats.
      labels: numpy [N] integers.
      num_classes: labels outside [0, num_classes) are cleaned out.
      batch_size: the global batch.
      pixel_scale: None: 255 for uint8 images, else 1.
      epochs: passes over the data, after which training ends (an epoch is
        what cleaning kept, which may be fewer steps than the raw count);
        None repeats until the step count is reached.
      shuffle_buffer, seed, augment, mean, std: see towers.data.pipeline.make_pipeline;
        augment None means its default for the input shape.
      source_fn: optional callable(input_shape) -> (source dataset, init feed)
        replacing the arrays (e.g. TFRecord shards); see towers.data.pipeline.
    """

    name = 'dataset'

    def __init__(self, images=None, labels=None, num_classes=10, batch_size=100,
                 pixel_scale=None, epochs=None, shuffle_buffer=10000, seed=0, augment=None,
                 mean=None, std=None, source_fn=None):
        if source_fn is None:
            def source_fn(input_shape):
                return pipeline.array_source(images, labels, input_shape)
            if pixel_scale is None:
                pixel_scale = 255.0 if images.dtype == 'uint8' else 1.0
        self._source_fn, self.pixel_scale = source_fn, pixel_scale or 1.0
        self.options = dict(num_classes=num_classes, batch_size=batch_size, epochs=epochs,
                            shuffle_buffer=shuffle_buffer, seed=seed, augment=augment,
                            mean=mean, std=std)

    def build(self, input_shape, tower_devices):
        options = dict(self.options)
        for name in ('mean', 'std'):
            if options[name] is not None and len(options[name]) != input_shape[-1]:
                raise SettingError('{%s} needs one value per channel (%%d), got %%s' % name,
                                   input_shape[-1], list(options[name]))
        if options['augment'] is None:
            options['augment'] = pipeline.should_augment(input_shape)
        with tf.device('/cpu:0'), tf1.name_scope('pipeline'):
            source, self._init_feed = self._source_fn(input_shape)
            dataset, self.counts = pipeline.make_pipeline(
                source, input_shape, pixel_scale=self.pixel_scale, **options)
            # A resumed run skips the batches it already trained on; with a
            # seeded shuffle that continues the uninterrupted run's order.
            self._skip = tf1.placeholder_with_default(tf.constant(0, tf.int64), [], 'skip')
            self._iterator = tf1.data.make_initializable_iterator(dataset.skip(self._skip))
            images, labels = self._iterator.get_next()
            return split_batch(images, labels, len(tower_devices))

    def start(self, sess, start_step, num_steps):
        feed = dict(self._init_feed)
        feed[self._skip] = start_step
        sess.run(self._iterator.initializer, feed)

    def end_of_data(self):
        """The pipeline's last epoch ended: training stops there."""

    def cleaning(self, sess):
        read, dropped = sess.run(self.counts)
        return int(dropped), int(read)
