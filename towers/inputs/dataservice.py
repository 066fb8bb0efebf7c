"""data service: the dataset pipeline run on tf.data service workers, its batches read here.

`towers train --data-service HOST:PORT` sends the pipeline of `--input dataset` over shards
on disk (records:DIR, imagenet:DIR, tfds:DIR) to a `towers data-service dispatcher`: its
workers read the shards (the same paths: a filesystem they share with the trainers), decode,
crop, augment and batch; this trainer receives ready batches (bytes, normalised here).

  parallel_epochs    (ShardingPolicy.OFF) each trainer a job of its own, every service worker
                     whole passes of its pipeline. Each worker's passes are shuffled and
                     cropped on a seed of its own, drawn on the worker when its pass starts
                     (worker_seeded), so two workers do not hand out the same batches. An
                     epoch's steps are a pass's worth of examples from all of them: some seen
                     twice, some not at all.
  distributed_epoch  (ShardingPolicy.DYNAMIC) one job shared by the run's trainers (named by
                     --data-service-job or the logdir); the dispatcher hands out the shard
                     files one at a time, so every example is delivered once per pass across
                     all trainers (a worker lost mid-file loses the rest of that file for the
                     pass: at most once). Each worker batches its own files: a pass ends with
                     a short batch per worker.

What does not hold: the batch order follows the service workers' timing, so N towers do not
equal one device and a resume is not exact; a resumed run restarts at its epoch's start
(start step // steps per epoch): the batches of the partial epoch are seen again. Cleaning
runs on the workers, where this process cannot count it.

Faults: a service worker lost, the job goes on with the others, and a Watch
(towers/cluster/dataservice.py) says so in the run's log. The dispatcher lost (the workers'
batches may still flow, but no worker can be replaced, nor a split handed out), or no batch
for a step: the run stops within the timeout (--cluster-timeout, else 60 s), naming it.
"""
import warnings

import tensorflow as tf

from towers.cluster.dataservice import DEFAULT_TIMEOUT_S, Watch, dispatcher_workers
from towers.data import pipeline
from towers.data.augment import CENTER
from towers.errors import SettingError, TowersError
from towers.inputs.dataset import DatasetInput, _by_task
from towers.inputs.staging import stage
from towers.slicing import share_of, split_batch

tf1 = tf.compat.v1


def worker_seeded(build, seed, epoch):
    """build(seed) on a seed of its own each time the dataset is iterated where it runs.

    The seed mixes (seed, epoch) with a number drawn by a random op whose seeds are 0, which
    TensorFlow seeds from the OS when the op is made: on each tf.data service worker as its
    pass starts, whatever the trainer's graph seed (a seeded op would draw alike on every
    worker). Two workers share a seed once in 2^62 draws.

    Args:
      build: callable(seed: int64 scalar tensor) -> tf.data.Dataset.
      seed, epoch: int64 scalars (the run's seed, the epoch the pipeline starts at).
    """
    def draw(_):
        return tf.raw_ops.RandomUniformInt(
            shape=tf.constant([], tf.int32), minval=tf.constant(0, tf.int64),
            maxval=tf.constant(2 ** 62, tf.int64), seed=0, seed2=0)
    return tf.data.Dataset.from_tensors(tf.constant(0)).map(pipeline.as_written(draw)).flat_map(
        pipeline.as_written(lambda salt: build(mixed(seed, epoch, salt))))


def mixed(seed, epoch, salt=0):
    """An int64 seed of (seed, epoch), xor salt."""
    pair = tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.bitwise.bitwise_xor(tf.random.experimental.stateless_split(pair, 1)[0, 0],
                                  tf.cast(salt, tf.int64))


def service_pipeline(train_set, input_shape, num_classes, batch_size, mode, seed=0, epoch=0,
                     augment=None, shuffle_buffer=10000, epochs=None):
    """The dataset a tf.data service worker runs: (pixels [b, H*W*C] uint8, labels [b] int64).

    Pixels are normalised on the trainer (data.pipeline.finisher). The records are cleaned
    (not counted), batched and augmented as make_pipeline does; a set that shuffles and
    augments itself (an ImageRecordSet) does so on this pipeline's seed.

    Args:
      train_set: a RecordSet or ImageRecordSet (a split on disk).
      mode: parallel_epochs (each pass on a seed drawn on the worker, see worker_seeded) or
        distributed_epoch (the shard files first, for the dispatcher to hand out).
      seed: the run's seed (an int); epoch: the epoch it starts at (int64, maybe a tensor).
      augment: the augmentation's name (data/augment.py), drawn from the pass's seed; None:
        none (a set that augments itself: the default for its images).
      epochs: passes (None: forever, the run ending at its step count).
    """
    shuffled = getattr(train_set, 'shuffled', False)

    def build(pass_seed):
        source, _ = (train_set.source(input_shape, seed=pass_seed, augment=augment) if shuffled
                     else train_set.source(input_shape))
        dataset, _ = pipeline.make_pipeline(
            source, input_shape, num_classes, batch_size,
            augment=CENTER if shuffled or augment is None else augment,
            shuffle_buffer=0 if shuffled else shuffle_buffer, seed=seed, shuffle_seed=pass_seed,
            epochs=epochs, finish=False, counted=False)
        return dataset
    if mode == 'parallel_epochs':
        return worker_seeded(build, seed, epoch)
    return build(mixed(seed, epoch))


def distributed(dataset, service, mode, job_name=''):
    """The trainer's side of dataset run by the tf.data service at service (grpc://HOST:PORT).

    job_name: a string tensor, fed at the iterator's initialisation (the epoch is in it), or
    '' for a job of this iterator's own. TensorFlow's public from_dataset_id takes only a
    Python string; its own distribute() goes through _from_dataset_id, which takes a tensor.
    """
    from tensorflow.python.data.experimental.ops import data_service_ops
    with warnings.catch_warnings():  # that graph mode reads a dataset's options as it was
        warnings.filterwarnings('ignore', 'To make it possible to preserve tf.data options')
        dataset_id = tf.data.experimental.service.register_dataset(service, dataset)
    return data_service_ops._from_dataset_id(mode, service, dataset_id, dataset.element_spec,
                                             job_name=job_name)


class DataServiceInput(DatasetInput):
    """DatasetInput's pipeline over a split on disk, run by a tf.data service.

    Each step's batch is taken from the service in a run of its own before the step, bounded
    by the timeout, into a StagingArea per tower (towers/inputs/staging.py) that the step reads.

    Args:
      train_set: a RecordSet or ImageRecordSet.
      service: the dispatcher's HOST:PORT.
      mode: parallel_epochs or distributed_epoch.
      steps_per_epoch: the run's, for the epoch a resume restarts at.
      job: the name of the run's shared job (distributed_epoch), or None: one per trainer.
      timeout: seconds the dispatcher may be silent, or a step wait for its batch; None: 60.
      num_classes, batch_size, seed, mean, std, augment, shuffle_buffer, share,
      source_augments: as DatasetInput's.
    """

    def __init__(self, train_set, service, mode, steps_per_epoch, num_classes, batch_size,
                 seed=0, mean=None, std=None, job=None, timeout=None, share=None,
                 augment=None, shuffle_buffer=10000, source_augments=False):
        super().__init__(num_classes=num_classes, batch_size=batch_size, pixel_scale=255.0,
                         seed=seed, mean=mean, std=std, augment=augment, share=share,
                         shuffle_buffer=shuffle_buffer, source_fn=train_set.source,
                         source_augments=source_augments)
        if mode == 'distributed_epoch' and share is not None:
            if job is None:
                raise SettingError('{data_service_mode} distributed_epoch shares one job among '
                                   "the run's trainers: give each the same {logdir} or "
                                   '{data_service_job}')
            if batch_size % share[1]:
                raise SettingError('{batch_size} %d does not split evenly over %d workers: '
                                   "distributed_epoch's shared job hands every trainer batches "
                                   'of one size', batch_size, share[1])
        self.train_set, self.address, self.mode = train_set, service, mode
        self.epoch_steps, self.job = steps_per_epoch, job
        self.timeout = timeout or DEFAULT_TIMEOUT_S
        self._log, self._sess, self.watch = print, None, None

    def build(self, input_shape, tower_devices):
        options = self._options(input_shape)
        batch = options['batch_size']
        if self.share is not None:
            batch = share_of(batch, self.share[1], self.share[0])[1]
        task = _by_task(tower_devices)[0][0]
        with tf.device(task + '/device:CPU:0' if task else '/cpu:0'), \
                tf1.name_scope('data_service'):
            self._epoch = tf1.placeholder_with_default(tf.constant(0, tf.int64), [], 'epoch')
            self._job = tf1.placeholder_with_default('', [], 'job_name')
            augment = self.augmentation.name if self.augmentation else CENTER
            dataset = service_pipeline(self.train_set, input_shape, options['num_classes'],
                                       batch, self.mode, options['seed'], self._epoch,
                                       augment, options['shuffle_buffer'])
            self._iterator = tf1.data.make_initializable_iterator(
                distributed(dataset, 'grpc://' + self.address, self.mode, self._job))
            pixels, labels = self._iterator.get_next()
            slices = split_batch(pixels, labels, len(tower_devices))
        finish = pipeline.finisher(input_shape, self.pixel_scale, options['mean'],
                                   options['std'])
        self._puts, slices = stage(slices, tower_devices, finish)
        return slices

    def announce(self, log):
        self._log = log
        if self.mode == 'parallel_epochs':
            how = ('parallel_epochs: every service worker makes whole passes of this '
                   "trainer's pipeline, each on a seed of its own")
        else:
            how = ('distributed_epoch: job %s, its shard files handed out one at a time, each '
                   'example once per pass across the trainers' % (self.job or 'of this trainer'))
        log('input: the tf.data service at grpc://%s, %s' % (self.address, how))
        log('the batch order follows the service workers\' timing: N towers do not equal one '
            "device, and a resume restarts at its epoch's start; the workers' cleaning is not "
            'counted')
        super().announce(log)

    def start(self, sess, start_step, num_steps):
        self._sess, epoch = sess, start_step // self.epoch_steps
        if start_step % self.epoch_steps:
            self._log('data service: resumed at step %d, the service starts epoch %d afresh: '
                      'its first %d batches are seen again' % (
                          start_step, epoch, start_step - epoch * self.epoch_steps))
        self.watch = Watch(self.address, self._log)
        if not self.watch.look():  # (which names the workers there now)
            raise TowersError('the tf.data service dispatcher %s does not answer; start '
                              '`towers data-service dispatcher` there, or fix {data_service}'
                              % self.address)
        # (Initialising registers the pipeline with the dispatcher, which TensorFlow retries
        # for an hour, deaf to the timeout, when the dispatcher is gone: hence the look.)
        job = '%s-epoch-%d' % (self.job, epoch) if self.job else ''
        sess.run(self._iterator.initializer, {self._epoch: epoch, self._job: job})
        self.watch.start()

    def step(self, step):
        silent = self.watch.silent_for()
        if silent > self.timeout:
            raise self._lost(step, silent)
        try:  # (while the dispatcher is silent, only until its time is up)
            self._sess.run(self._puts, options=tf1.RunOptions(
                timeout_in_ms=max(100, int(1000 * (self.timeout - silent)))))
        except tf.errors.DeadlineExceededError:
            silent = self.watch.silent_for()
            if silent or dispatcher_workers(self.address) is None:
                raise self._lost(step, max(silent, self.timeout)) from None
            raise TowersError('no batch from the tf.data service within %.0f s ({cluster_timeout})'
                              ' for step %d: its dispatcher %s answers, %s; start workers with '
                              '`towers data-service worker --dispatcher %s`'
                              % (self.timeout, step, self.address, self.watch.count(),
                                 self.address)) from None
        return [], None

    def _lost(self, step, silent):
        return TowersError('lost the tf.data service dispatcher %s: silent for %.0f s '
                           '({cluster_timeout} %.0f s) at step %d; start it and its workers '
                           'again, then resume the run' % (self.address, silent, self.timeout,
                                                            step))

    def stop(self, sess):
        if self.watch is not None:
            self.watch.stop()

    def cleaning(self, sess):
        self._log("cleaning: the records the data service's workers dropped are not counted")
        return None
