"""dataset: an in-graph tf.data pipeline (towers/data/pipeline.py).

Cleaning, normalisation, augmentation, shuffling and batching run in
TensorFlow's own threads, prefetched ahead of the step; the batch is split
over the towers on the host. Augmentation works on the global batch, drawn from (seed, the
batch's step), or, for a split on disk that shuffles itself (an ImageRecordSet), on each
record as it is decoded, drawn from (seed, its number in the run): either way before the
batch is cut, so N towers and a cluster's tasks see what one device sees.

On a cluster each task reads on its own host, so that no batch crosses the
network: with towers on several tasks (in-graph) every task runs its own copy
of the pipeline (the same seed, hence the same global batches) on its CPU and
keeps the rows of its own towers; a worker of a between-graph run (share) does
the same for its share. The rows are those split_batch gives the towers of one
process with every task's towers, so the cluster trains on what one process
would.

On GPU towers the batch is staged (as the staging input stages): each tower's
slice waits in a StagingArea on its GPU, put there while the step before it
computes, and bytes cross the bus as bytes (augmented as bytes), cast and normalised on the
GPU. Staged, the source
knows one step ahead when its data ends (the put of the batch after the last
finds none), so the last step is never cut short and no step runs half.
"""
import tensorflow as tf

from towers.data import pipeline
from towers.data.augment import CENTER, as_augmentation
from towers.deviceplan import device_kind
from towers.errors import SettingError
from towers.inputs.base import InputSource
from towers.inputs.staging import past_the_end, stage
from towers.names import INPUT_MODES
from towers.session import input_errors
from towers.slicing import split_batch

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
      shuffle_buffer, seed, mean, std: see towers.data.pipeline.make_pipeline.
      augment: None (none), a name of towers.names.AUGMENTATIONS or a
        towers.data.augment.Augmentation: how the pipeline augments each batch.
      source_augments: the source augments its records itself (augment then only says
        how, in the run's first lines).
      source_fn: optional callable(input_shape) -> (source dataset, init feed)
        replacing the arrays (e.g. TFRecord shards); see towers.data.pipeline.
      epoch_source_fn: optional callable(input_shape) -> None or (a function (epoch,
        records to pass over) -> that epoch's source, records an epoch), for a source that
        shuffles itself and can make any epoch alone (an ImageNet set): the pipeline then
        starts a resumed run at its batch without making those before it
        (towers.data.pipeline.epoch_pipeline).
      share: (index, count): this worker of a between-graph run keeps share
        `index` of every global batch, cut among `count` workers with as many
        towers each as it has; None for the whole batch.
      staged: put each tower's slice into a StagingArea on its device one step
        ahead; None stages on GPU towers only (on CPU towers the host's
        memory is the towers' memory: nothing to copy ahead).
    """

    name, tf_data, stages, has_images = INPUT_MODES['dataset']

    @classmethod
    def over(cls, dataset, sampler, batch_size, num_classes, seed=0, epochs=None, mean=None,
             std=None, share=None, augment=None):
        return cls(dataset.images, dataset.labels, num_classes, batch_size, seed=seed,
                   epochs=epochs, mean=mean, std=std, share=share, augment=augment)

    def __init__(self, images=None, labels=None, num_classes=10, batch_size=100,
                 pixel_scale=None, epochs=None, shuffle_buffer=10000, seed=0, augment=None,
                 mean=None, std=None, source_fn=None, share=None, staged=None,
                 epoch_source_fn=None, source_augments=False):
        if source_fn is None:
            def source_fn(input_shape):
                return pipeline.array_source(images, labels, input_shape)
            if pixel_scale is None:
                pixel_scale = 255.0 if images.dtype == 'uint8' else 1.0
        self._source_fn, self.pixel_scale = source_fn, pixel_scale or 1.0
        self._epoch_source_fn = epoch_source_fn
        self.share, self.staged = share, staged
        self.augmentation = as_augmentation(augment)
        piped = self.augmentation and not source_augments
        self.options = dict(num_classes=num_classes, batch_size=batch_size, epochs=epochs,
                            shuffle_buffer=shuffle_buffer, seed=seed,
                            augment=self.augmentation.name if piped else CENTER,
                            mean=mean, std=std)

    def build(self, input_shape, tower_devices):
        options = self._options(input_shape)
        staged = self.staged
        if staged is None:
            staged = device_kind(tower_devices) != 'CPU'
        self._pipelines, self._init_feed, self._more, self._puts = [], {}, [], []
        self._ended = False
        slices = self._host_slices(input_shape, tower_devices, options, staged)
        if not staged:
            return slices
        finish = pipeline.finisher(input_shape, self.pixel_scale, options['mean'],
                                   options['std'])
        self._puts, slices = stage(slices, tower_devices, finish)
        return slices

    def _options(self, input_shape):
        """The pipeline's options for input_shape, mean and std checked."""
        options = dict(self.options)
        for name in ('mean', 'std'):
            if options[name] is not None and len(options[name]) != input_shape[-1]:
                raise SettingError('{%s} needs one value per channel (%%d), got %%s' % name,
                                   input_shape[-1], list(options[name]))
        return options

    def _host_slices(self, input_shape, tower_devices, options, staged):
        """One TowerSlice per tower, read and split on the host (on each task's own)."""
        tasks = _by_task(tower_devices)
        if self.share is None and len(tasks) == 1:  # one process: the host reads
            with tf.device('/cpu:0'):
                return split_batch(*self._pipeline('/cpu:0', input_shape, options, staged),
                                   len(tower_devices))
        slices = []
        for k, (task, devices) in enumerate(tasks):  # in-graph: each task its copy
            index, count = self.share or (k, len(tasks))
            host = task + '/device:CPU:0' if task else '/cpu:0'
            # A scope per copy: each its own counts, on its own task.
            with tf.device(host), tf1.variable_scope('task_%d' % index):
                parts = (index * len(devices), (index + 1) * len(devices),
                         len(devices) * count)  # the towers' parts this copy keeps
                images, labels = self._pipeline(host, input_shape, options, staged, parts)
                everyone = split_batch(images, labels, len(devices) * count)
                mine = everyone[index * len(devices):(index + 1) * len(devices)]
                if self.share is not None:  # weights within this worker's share
                    total = tf.add_n([piece.count for piece in mine])
                    mine = [piece._replace(batch=total) for piece in mine]
            slices.extend(mine)
        return slices

    def _pipeline(self, host, input_shape, options, staged, parts=None):
        """(images, labels) of one copy of the pipeline, read on host.

        parts: (first, end, of): this copy keeps the rows of parts first..end-1 of each
        batch cut in `of` (see split_batch); a source that makes its epochs alone then
        decodes only those (the others stay zeros), not the whole global batch on every task.

        Staged, the images are the batch's flat pixels as the source has them,
        and an exhausted pipeline gives a one-row stand-in that no step trains
        on: self._more says whether the batch was real.
        """
        with tf.device(host), tf1.name_scope('pipeline'):
            # A resumed run skips the batches it already trained on; with a
            # seeded shuffle that continues the uninterrupted run's order.
            skip = tf1.placeholder_with_default(tf.constant(0, tf.int64), [], 'skip')
            by_epoch = self._epoch_source_fn and self._epoch_source_fn(input_shape)
            if by_epoch:  # starts at the batch, making none before it
                dataset, counts = pipeline.epoch_pipeline(
                    *by_epoch, input_shape, options['num_classes'], options['batch_size'],
                    start=skip, pixel_scale=self.pixel_scale, mean=options['mean'],
                    std=options['std'], epochs=options['epochs'], finish=not staged,
                    parts=parts)
                feed = {}
            else:
                source, feed = self._source_fn(input_shape)
                dataset, counts = pipeline.make_pipeline(
                    source, input_shape, pixel_scale=self.pixel_scale, finish=not staged,
                    start=skip, **options)
            iterator = tf1.data.make_initializable_iterator(dataset)
            if staged:
                batch = iterator.get_next_as_optional()
                more = batch.has_value()
                pixels, labels = dataset.element_spec
                stand_in = (tf.zeros([1] + pixels.shape[1:].as_list(), pixels.dtype),
                            tf.zeros([1], labels.dtype))
                images, labels = tf.cond(more, batch.get_value, lambda: stand_in)
                self._more.append(more)
            else:
                images, labels = iterator.get_next()
        self._pipelines.append((iterator, skip, counts))
        self._init_feed.update(feed)
        self.counts = self._pipelines[0][2]  # every copy reads and cleans alike
        return images, labels

    def start(self, sess, start_step, num_steps):
        self._num_steps, self._ended = num_steps, False
        for iterator, skip, _ in self._pipelines:
            sess.run(iterator.initializer, {**self._init_feed, skip: start_step})
        if self._puts and start_step < num_steps:
            with input_errors(start_step):  # prime: the first batch waits on every device
                self.fetched(sess.run(self._puts + self._more))

    def step(self, step):
        if not self._puts:
            return [], None
        past_the_end(step, self._num_steps)
        if self._ended:  # the put after the last batch found no more
            raise tf.errors.OutOfRangeError(None, None, 'the dataset input has ended')
        # The put of the next batch rides along with this step's compute.
        return (self._puts + self._more if step + 1 < self._num_steps else []), None

    def fetched(self, values):
        if values:
            self._ended = not all(values[len(self._puts):])

    def end_of_data(self):
        """The pipeline's last epoch ended: training stops there."""

    def cleaning(self, sess):
        read, dropped = sess.run(self.counts)
        return int(dropped), int(read)


def _by_task(tower_devices):
    """[(task, its tower devices)] in order: '/job:worker/task:1' for a cluster's
    devices, '' for the devices of one process."""
    tasks = {}
    for device in tower_devices:
        spec = tf.DeviceSpec.from_string(device)
        task = '/job:%s/task:%d' % (spec.job, spec.task or 0) if spec.job else ''
        tasks.setdefault(task, []).append(device)
    return list(tasks.items())
