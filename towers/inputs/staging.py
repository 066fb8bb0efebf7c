"""staging: batches copied to every tower's device while the towers compute.

tf_cnn_benchmarks' design, on `data_flow_ops`: loader thread(s) fill a host
FIFOQueue with global batches; the dequeued batch is split per tower and put
into one StagingArea per tower, on that tower's device. Before the first step
one batch is staged everywhere (priming); each step then computes on the staged
batch k while the put of batch k+1 (the host-to-device copy) runs beside it. An augmented
batch is augmented on its way into the host queue, in the loader's run
(towers/inputs/augmenting.py): off the step's critical path.
"""
import functools
import threading

import tensorflow as tf
from tensorflow.python.ops import data_flow_ops

from towers.errors import TowersError, op_error_summary
from towers.inputs.augmenting import FedAugmentation
from towers.inputs.base import InputSource, sampled_batch
from towers.names import INPUT_MODES
from towers.slicing import TowerSlice, split_batch

tf1 = tf.compat.v1


def past_the_end(step, num_steps):
    """TowersError for a step at or past the count a staged source was started for: no
    batch was put for it, and its get would wait forever."""
    if step >= num_steps:
        raise TowersError('step %d of a staged input started for %d steps: start it for '
                          'every step it will run' % (step, num_steps))


def stage(slices, devices, finish=None):
    """Put each tower's slice into a StagingArea on the tower's device.

    The put (the host-to-device copy) of one step's batch runs beside the step
    before it; the tower computes on what get() returns.

    Args:
      slices: one TowerSlice per tower, on the host.
      devices: the towers' devices.
      finish: callable(images) -> images run on the device after the get (e.g.
        the cast and normalisation of uint8 pixels that crossed as bytes), or None.
    Returns:
      (the put ops, one per tower; the TowerSlices the towers read).
    """
    puts, staged = [], []
    for i, (device, piece) in enumerate(zip(devices, slices)):
        with tf.device(device), tf1.name_scope('staging_%d' % i):
            area = data_flow_ops.StagingArea([t.dtype for t in piece],
                                             shapes=[t.shape for t in piece], capacity=2)
            puts.append(area.put(list(piece)))
            images, labels, count, batch = area.get()
            staged.append(TowerSlice(finish(images) if finish else images, labels, count, batch))
    return puts, staged


class StagingInput(InputSource):
    """A loader thread fills a host queue; per-tower StagingAreas hide the copies.

    Before the first step one batch is put into every tower's StagingArea
    (priming); each step then runs the towers on the staged batch k together
    with the put of batch k+1, so the host-to-device copy overlaps compute.

    Args:
      dataset: has images [N, H, W, C] float32 and labels [N] int64.
      sampler: a towers.data.sampler.EpochSampler over it; the loader follows its order.
      capacity: host queue capacity, in global batches.
      num_threads: loader threads. With more than one, each step's batch is
        still drawn exactly once, but batches may reach the queue out of order.
      batches: optional callable(step) -> (images [n, H, W, C] float32,
        labels [n] int64) that makes a step's batch instead of dataset/sampler
        (a Python data source); what it raises reaches the trainer.
      augment, seed, share: as towers.inputs.FeedInput's.
    """

    name, tf_data, stages, has_images = INPUT_MODES['staging']

    def __init__(self, dataset=None, sampler=None, capacity=4, num_threads=1, batches=None,
                 augment=None, seed=0, share=None):
        self.dataset, self.sampler = dataset, sampler
        self.capacity, self.num_threads = capacity, num_threads
        self._make_batch = batches or functools.partial(sampled_batch, dataset, sampler,
                                                        share=share)
        self._augment = FedAugmentation(augment, seed, sampler, share)
        self.augmentation = self._augment.augmentation
        self._threads, self._error, self._stopping = [], None, False
        self._next_step = self._num_steps = 0
        self._lock = threading.Lock()
        self._puts = []

    def build(self, input_shape, tower_devices):
        shape = [None] + list(input_shape)
        with tf.device('/cpu:0'), tf1.name_scope('staging'):
            # Shapes stay unset: a queue's shapes must be fully defined, and a
            # short last batch of an epoch has another batch size.
            self._queue = data_flow_ops.FIFOQueue(
                self.capacity, [tf.float32, tf.int64], name='host_queue')
            self._images = tf1.placeholder(tf.float32, shape, name='images')
            self._labels = tf1.placeholder(tf.int64, [None], name='labels')
            self._enqueue = self._queue.enqueue([self._augment.apply(self._images),
                                                 self._labels])
            self._close = self._queue.close(cancel_pending_enqueues=True)
            images, labels = self._queue.dequeue()
            images.set_shape(shape)
            labels.set_shape([None])
            pieces = split_batch(images, labels, len(tower_devices))
        self._puts, slices = stage(pieces, tower_devices)
        return slices

    def start(self, sess, start_step, num_steps):
        if start_step and self.num_threads > 1:
            raise TowersError('cannot resume at step %d with %d loader threads: their batches '
                              'reach the queue out of order; resume with one'
                              % (start_step, self.num_threads))
        self._next_step, self._num_steps = start_step, num_steps
        self._threads = [threading.Thread(target=self._load, args=(sess,), daemon=True,
                                          name='towers-loader-%d' % i)
                         for i in range(self.num_threads)]
        for thread in self._threads:
            thread.start()
        if start_step < num_steps:
            try:
                sess.run(self._puts)  # prime: batch 0 waits on every device
            except tf.errors.OutOfRangeError:
                self.end_of_data()  # raises: the loader's error, or too little data

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
                sess.run(self._enqueue, {self._images: images, self._labels: labels,
                                         **self._augment.feed(step)})
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            pass  # the queue was closed by stop(): nothing more is wanted
        except Exception as e:  # the loader's error must reach the trainer
            if self._stopping:
                return  # e.g. the session closed under a stopping loader
            with self._lock:
                self._error = e
            # Closing wakes a step blocked on an empty queue with OutOfRange.
            try:
                sess.run(self._close)
            except tf.errors.OpError:
                pass  # the session is closing anyway

    def step(self, step):
        past_the_end(step, self._num_steps)
        # The put of the next batch rides along with this step's compute.
        return (self._puts if step + 1 < self._num_steps else []), None

    def end_of_data(self):
        if self._error is not None:
            error = self._error
            cause = (op_error_summary(error) if isinstance(error, tf.errors.OpError)
                     else str(error).strip().splitlines()[-1] if str(error).strip() else '')
            raise TowersError('the data loader failed: %s: %s'
                              % (type(error).__name__, cause)) from error
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
