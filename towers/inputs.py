"""Input sources: how each step's global batch reaches the towers.

Every source ends the same way, one TowerSlice per tower cut by split_batch,
so every mode trains the same model the same way. They differ in where the
copying happens, which is what decides whether the towers wait for data:

  feed       feed_dict from Python each step: the classic loop, the reference.
             The Python copy and the host-to-device copy sit on the step's
             critical path.
  staging    (staging.py) a host FIFOQueue filled by loader thread(s), then one StagingArea
             per tower on the tower's device (tf_cnn_benchmarks' design): step
             k computes on batch k while batch k+1 is copied to the devices.
  python     (staging.py) batches from a Python data source, loaded by K worker processes
             or threads (data/prefetch.py), then staged as above.
  synthetic  one random batch per tower, held on the tower's device: no input
             cost at all, the upper bound for benchmarks.
  dataset    an in-graph tf.data pipeline (data/pipeline.py): cleaning,
             normalisation, augmentation, shuffling and batching run in
             TensorFlow's own threads, prefetched ahead of the step.

The Session loop drives a source through four calls:
  build(input_shape, tower_devices) -> [TowerSlice]   while the graph is built
  start(sess, start_step, num_steps)                  once variables exist
  step(step) -> (extra fetches, feed_dict)            for each train step
  stop(sess)                                          always, even on errors
and asks it `end_of_data()` when a step raises OutOfRangeError.
"""
import tensorflow as tf

from towers.data import pipeline

from towers.errors import TowersError
from towers.tower import TowerSlice, split_batch

tf1 = tf.compat.v1

INPUT_MODES = ('feed', 'staging', 'dataset', 'synthetic')


class InputSource:
    """Base class: the four calls, doing nothing."""

    name = 'custom'  # what the Session loop's log calls this input

    def build(self, input_shape, tower_devices):
        raise NotImplementedError

    def start(self, sess, start_step, num_steps):
        pass

    def step(self, step):
        return [], None

    def stop(self, sess):
        pass

    def end_of_data(self):
        """A step hit the end of the input; return to end training, or raise."""
        raise TowersError('the %s input ran out of data before the last step'
                          % type(self).__name__)

    def cleaning(self, sess):
        """(records dropped, records read) by in-graph cleaning, or None."""
        return None


class FeedInput(InputSource):
    """Placeholders fed from an in-memory DataSet, in the sampler's order.

    Args:
      dataset: has images [N, H, W, C] float32 and labels [N] int64.
      sampler: a data.sampler.EpochSampler over it.
      (Both may be None for a graph that is only built, or fed by hand through
      the `images` and `labels` placeholders.)
    """

    name = 'feed'

    def __init__(self, dataset=None, sampler=None):
        self.dataset, self.sampler = dataset, sampler
        self.images = self.labels = None

    def build(self, input_shape, tower_devices):
        self.images = tf1.placeholder(tf.float32, [None] + list(input_shape), name='images')
        self.labels = tf1.placeholder(tf.int64, [None], name='labels')
        with tf.device('/cpu:0'):
            return split_batch(self.images, self.labels, len(tower_devices))

    def step(self, step):
        batch = self.sampler.indices(step)
        return [], {self.images: self.dataset.images[batch],
                    self.labels: self.dataset.labels[batch]}


class SyntheticInput(InputSource):
    """One fixed random batch, each tower's share held on the tower's device.

    Args:
      batch_size: the global batch.
      num_classes: labels are drawn from [0, num_classes).
    """

    name = 'synthetic'

    def __init__(self, batch_size, num_classes):
        self.batch_size, self.num_classes = batch_size, num_classes

    def build(self, input_shape, tower_devices):
        num_towers = len(tower_devices)
        slices = []
        for i, device in enumerate(tower_devices):
            count = self.batch_size // num_towers + (i < self.batch_size % num_towers)
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
      shuffle_buffer, seed, augment, mean, std: see data.pipeline.make_pipeline;
        augment None means its default for the input shape.
      source_fn: optional callable(input_shape) -> (source dataset, init feed)
        replacing the arrays (e.g. TFRecord shards); see data.pipeline.
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
                raise TowersError('--%s needs one value per channel (%d), got %s'
                                  % (name, input_shape[-1], options[name]))
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


def run_step(sess, source, step, fetches, options=None, run_metadata=None):
    """Run one train step fed by source; None when its data has ended.

    Args:
      sess: the Session.
      source: the InputSource the graph was built with.
      step: the global step about to run.
      fetches: list of tensors/ops to run (the train op among them).
      options, run_metadata: passed to sess.run (e.g. to trace the step).
    Returns:
      The values of fetches, or None at the end of the source's data.
    Raises:
      TowersError: the source failed (e.g. its loader raised), ended early,
        or read corrupt records.
    """
    extra, feed = source.step(step)
    try:
        return sess.run(list(fetches) + extra, feed, options=options,
                        run_metadata=run_metadata)[:len(fetches)]
    except tf.errors.OutOfRangeError:
        source.end_of_data()
        return None
    except tf.errors.DataLossError as e:
        # A shard damaged after its check (or read unchecked): say so in one line.
        raise TowersError('corrupt input data at step %d: %s' % (step, e.message)) from None


def make_input(mode, dataset, sampler, batch_size, num_classes, seed=0, epochs=None, mean=None,
               std=None):
    """The InputSource for an --input mode over an in-memory DataSet.

    Args:
      mode: one of INPUT_MODES.
      dataset: the training DataSet (images [N, H, W, C] float32, labels [N]),
        or a data.records.RecordSet (dataset mode only).
      sampler: an EpochSampler over it (feed and staging follow its order).
      batch_size: the global batch.
      num_classes: for cleaning (dataset) and synthetic labels.
      seed: shuffle seed of the dataset pipeline.
      epochs: passes the dataset pipeline makes before it ends (None: forever).
      mean, std: per-channel normalisation of the dataset pipeline, or None.
    """
    from towers.staging import StagingInput  # staging.py builds on this module
    if hasattr(dataset, 'source'):  # records on disk (data.records.RecordSet)
        if mode != 'dataset':
            raise TowersError('records stream through --input dataset, not %s' % mode)
        return DatasetInput(num_classes=num_classes, batch_size=batch_size, seed=seed,
                            pixel_scale=255.0, source_fn=dataset.source, epochs=epochs,
                            mean=mean, std=std)
    if mode == 'feed':
        return FeedInput(dataset, sampler)
    if mode == 'staging':
        return StagingInput(dataset, sampler)
    if mode == 'dataset':
        return DatasetInput(dataset.images, dataset.labels, num_classes, batch_size, seed=seed,
                            epochs=epochs, mean=mean, std=std)
    if mode == 'synthetic':
        return SyntheticInput(batch_size, num_classes)
    raise TowersError('unknown --input %r; choose one of: %s' % (mode, ', '.join(INPUT_MODES)))
