"""Input sources: how each step's global batch reaches the towers.

Every source ends the same way, one TowerSlice per tower cut by split_batch,
so every mode trains the same model the same way. They differ in where the
copying happens, which is what decides whether the towers wait for data:

  feed       feed_dict from Python each step: the classic loop, the reference.
             The Python copy and the host-to-device copy sit on the step's
             critical path.
  staging    a host FIFOQueue filled by loader thread(s), then one StagingArea
             per tower on the tower's device (tf_cnn_benchmarks' design): step
             k computes on batch k while batch k+1 is copied to the devices.
  python     batches from a Python data source, loaded by K worker processes
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
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import data_flow_ops

from data import pipeline
from data.prefetch import Prefetcher

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
      epochs: passes over the data; None repeats until the step count is reached.
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
        if options['augment'] is None:
            options['augment'] = pipeline.should_augment(input_shape)
        with tf.device('/cpu:0'), tf1.name_scope('pipeline'):
            source, self._init_feed = self._source_fn(input_shape)
            dataset, self.dropped = pipeline.make_pipeline(
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


class StagingInput(InputSource):
    """A loader thread fills a host queue; per-tower StagingAreas hide the copies.

    Before the first step one batch is put into every tower's StagingArea
    (priming); each step then runs the towers on the staged batch k together
    with the put of batch k+1, so the host-to-device copy overlaps compute.

    Args:
      dataset: has images [N, H, W, C] float32 and labels [N] int64.
      sampler: a data.sampler.EpochSampler over it; the loader follows its order.
      capacity: host queue capacity, in global batches.
      num_threads: loader threads. With more than one, each step's batch is
        still drawn exactly once, but batches may reach the queue out of order.
      batches: optional callable(step) -> (images [n, H, W, C] float32,
        labels [n] int64) that makes a step's batch instead of dataset/sampler
        (a Python data source); what it raises reaches the trainer.
    """

    name = 'staging'

    def __init__(self, dataset=None, sampler=None, capacity=4, num_threads=1, batches=None):
        self.dataset, self.sampler = dataset, sampler
        self.capacity, self.num_threads = capacity, num_threads
        self._make_batch = batches or self._dataset_batch
        self._threads, self._error, self._stopping = [], None, False
        self._next_step = self._num_steps = 0
        self._lock = threading.Lock()
        self._puts = []

    def _dataset_batch(self, step):
        batch = self.sampler.indices(step)
        return self.dataset.images[batch], self.dataset.labels[batch]

    def build(self, input_shape, tower_devices):
        shape = [None] + list(input_shape)
        with tf.device('/cpu:0'), tf1.name_scope('staging'):
            # Shapes stay unset: a queue's shapes must be fully defined, and a
            # short last batch of an epoch has another batch size.
            self._queue = data_flow_ops.FIFOQueue(
                self.capacity, [tf.float32, tf.int64], name='host_queue')
            self._images = tf1.placeholder(tf.float32, shape, name='images')
            self._labels = tf1.placeholder(tf.int64, [None], name='labels')
            self._enqueue = self._queue.enqueue([self._images, self._labels])
            self._close = self._queue.close(cancel_pending_enqueues=True)
            images, labels = self._queue.dequeue()
            images.set_shape(shape)
            labels.set_shape([None])
            pieces = split_batch(images, labels, len(tower_devices))
        slices = []
        for i, (device, piece) in enumerate(zip(tower_devices, pieces)):
            with tf.device(device), tf1.name_scope('staging_%d' % i):
                area = data_flow_ops.StagingArea(
                    [tf.float32, tf.int64, tf.int32, tf.int32],
                    shapes=[shape, [None], [], []], capacity=2)
                self._puts.append(area.put(list(piece)))
                slices.append(TowerSlice(*area.get()))
        return slices

    def start(self, sess, start_step, num_steps):
        self._next_step, self._num_steps = start_step, num_steps
        self._threads = [threading.Thread(target=self._load, args=(sess,), daemon=True,
                                          name='towers-loader-%d' % i)
                         for i in range(self.num_threads)]
        for thread in self._threads:
            thread.start()
        if start_step < num_steps:
            self._run_or_fail(sess, self._puts)  # prime: batch 0 waits on every device

    def _claim_step(self):
        with self._lock:
            if self._stopping or self._error is not None or self._next_step >= self._num_steps:
                return None
            step, self._next_step = self._next_step, self._next_step + 1
            return step

    def _load(self, sess):
        try:
            while True:
                step = self._claim_step()
                if step is None:
                    return
                images, labels = self._make_batch(step)
                sess.run(self._enqueue, {self._images: images, self._labels: labels})
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            pass  # the queue was closed by stop(): nothing more is wanted
        except Exception as e:  # the loader's error must reach the trainer
            with self._lock:
                self._error = e
            # Closing wakes a step blocked on an empty queue with OutOfRange.
            try:
                sess.run(self._close)
            except tf.errors.OpError:
                pass  # the session is closing anyway

    def _run_or_fail(self, sess, fetches):
        try:
            sess.run(fetches)
        except tf.errors.OutOfRangeError:
            self.end_of_data()
            raise

    def step(self, step):
        # The put of the next batch rides along with this step's compute.
        return (self._puts if step + 1 < self._num_steps else []), None

    def end_of_data(self):
        if self._error is not None:
            raise TowersError('the data loader failed: %s: %s'
                              % (type(self._error).__name__, self._error)) from self._error
        super().end_of_data()

    def stop(self, sess):
        with self._lock:
            self._stopping = True
        try:
            sess.run(self._close)  # cancels an enqueue blocked on a full queue
        except tf.errors.OpError:
            pass  # the session is already closing
        for thread in self._threads:
            thread.join(timeout=30)
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        if alive:
            raise TowersError('loader thread(s) %s did not stop' % ', '.join(alive))


class PythonInput(StagingInput):
    """Batches from a Python data source, loaded in parallel, then staged.

    For data only Python can produce (tensorpack's DataFlow idea): `source` is
    any sequence (len + getitem) or iterable with a length whose items are
    (images [n, H, W, C] float32, labels [n] int) batches; one pass is one
    epoch. A data.prefetch.Prefetcher runs its K workers; one loader thread
    moves their batches into the staging queue, in order when ordered=True. A
    worker's error stops training with that error, never a hang.

    Args:
      source: the data source; len(source) batches per epoch.
      num_workers, workers, ordered: see data.prefetch.Prefetcher.
      capacity: host queue capacity, in batches.
    """

    name = 'python'

    def __init__(self, source, num_workers=2, workers='thread', ordered=True, capacity=4):
        super().__init__(capacity=capacity, batches=self._next_batch)
        self.prefetcher = Prefetcher(source, num_workers=num_workers, workers=workers,
                                     ordered=ordered)
        self.steps_per_epoch = len(source)
        self._batches = None

    def start(self, sess, start_step, num_steps):
        self._batches = self._from_step(start_step)
        super().start(sess, start_step, num_steps)

    def _from_step(self, start_step):
        """Batches from global step start_step on, epoch after epoch."""
        skip = start_step % self.steps_per_epoch
        while True:
            for batch in self.prefetcher:
                if skip:
                    skip -= 1  # a resumed run: this epoch's first batches are done
                    continue
                yield batch

    def _next_batch(self, step):
        images, labels = next(self._batches)
        return np.asarray(images, np.float32), np.asarray(labels, np.int64)

    def stop(self, sess):
        try:
            super().stop(sess)
        finally:
            self.prefetcher.close()


def run_step(sess, source, step, fetches):
    """Run one train step fed by source; None when its data has ended.

    Args:
      sess: the Session.
      source: the InputSource the graph was built with.
      step: the global step about to run.
      fetches: list of tensors/ops to run (the train op among them).
    Returns:
      The values of fetches, or None at the end of the source's data.
    Raises:
      TowersError: the source failed (e.g. its loader raised) or ended early.
    """
    extra, feed = source.step(step)
    try:
        return sess.run(list(fetches) + extra, feed)[:len(fetches)]
    except tf.errors.OutOfRangeError:
        source.end_of_data()
        return None


def make_input(mode, dataset, sampler, batch_size, num_classes, seed=0):
    """The InputSource for an --input mode over an in-memory DataSet.

    Args:
      mode: one of INPUT_MODES.
      dataset: the training DataSet (images [N, H, W, C] float32, labels [N]),
        or a data.records.RecordSet (dataset mode only).
      sampler: an EpochSampler over it (feed and staging follow its order).
      batch_size: the global batch.
      num_classes: for cleaning (dataset) and synthetic labels.
      seed: shuffle seed of the dataset pipeline.
    """
    if hasattr(dataset, 'source'):  # records on disk (data.records.RecordSet)
        if mode != 'dataset':
            raise TowersError('records stream through --input dataset, not %s' % mode)
        return DatasetInput(num_classes=num_classes, batch_size=batch_size, seed=seed,
                            pixel_scale=255.0, source_fn=dataset.source)
    if mode == 'feed':
        return FeedInput(dataset, sampler)
    if mode == 'staging':
        return StagingInput(dataset, sampler)
    if mode == 'dataset':
        return DatasetInput(dataset.images, dataset.labels, num_classes, batch_size, seed=seed)
    if mode == 'synthetic':
        return SyntheticInput(batch_size, num_classes)
    raise TowersError('unknown --input %r; choose one of: %s' % (mode, ', '.join(INPUT_MODES)))
