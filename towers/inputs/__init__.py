"""Input sources: how each step's global batch reaches the towers.

Every source ends the same way, one TowerSlice per tower cut by split_batch,
so every mode trains the same model the same way. They differ in where the
copying happens, which is what decides whether the towers wait for data:

  feed       (feed.py) feed_dict from Python each step: the classic loop, the
             reference. The Python copy and the host-to-device copy sit on the
             step's critical path.
  staging    (staging.py) a host FIFOQueue filled by loader thread(s), then one
             StagingArea per tower on the tower's device (tf_cnn_benchmarks'
             design): step k computes on batch k while batch k+1 is copied.
  python     (python.py) batches from a Python data source, loaded by K worker
             processes or threads (towers/data/prefetch.py), then staged.
  synthetic  (synthetic.py) one random batch per tower, held on the tower's
             device: no input cost at all, the upper bound for benchmarks.
  dataset    (dataset.py) an in-graph tf.data pipeline (towers/data/pipeline.py):
             cleaning, normalisation, augmentation, shuffling and batching in
             TensorFlow's own threads, prefetched ahead of the step; with a
             tf.data service (dataservice.py), on the service's workers instead.

base.py says how the Session loop drives a source; make_input picks one by
its --input name (INPUTS: a mode is a class, which says how it is made and the facts of its
towers.names.InputMode), source_for the one a TrainConfig asks for, with the augmentation it
asks for or the one that fits the images (towers/data/augment.py), which every mode with
images applies to the global batch before it is cut per tower.
"""
import functools
import math

from towers.config import check
from towers.data.augment import CENTER, RANDOM, as_augmentation, choose
from towers.data.sampler import EpochSampler
from towers.errors import SettingError
from towers.inputs.base import InputSource
from towers.inputs.dataservice import DataServiceInput
from towers.inputs.dataset import DatasetInput
from towers.inputs.feed import FeedInput
from towers.inputs.python import PythonInput
from towers.inputs.staging import StagingInput
from towers.inputs.synthetic import SyntheticInput
from towers.names import INPUT_MODES

__all__ = ['INPUTS', 'INPUT_MODES', 'DataServiceInput', 'DatasetInput', 'FeedInput',
           'InputSource', 'PythonInput', 'StagingInput', 'SyntheticInput', 'check_augment',
           'make_input', 'source_for', 'train_augmentation']

# --input: each mode's InputSource class (its facts are its towers.names.INPUT_MODES entry's).
INPUTS = {source.name: source for source in (FeedInput, StagingInput, DatasetInput,
                                             SyntheticInput)}


def make_input(mode, dataset, sampler, batch_size, num_classes, seed=0, epochs=None, mean=None,
               std=None, share=None, augment=None):
    """The InputSource for an --input mode over an in-memory DataSet.

    Args:
      mode: one of INPUT_MODES.
      dataset: the training DataSet (images [N, H, W, C] float32, labels [N]),
        or a towers.data.records.RecordSet (dataset mode only).
      sampler: an EpochSampler over it (feed and staging follow its order).
      batch_size: the global batch.
      num_classes: for cleaning (dataset) and synthetic labels.
      seed: shuffle seed of the dataset pipeline.
      epochs: passes the dataset pipeline makes before it ends (None: forever).
      mean, std: per-channel normalisation of the dataset pipeline, or None.
      share: (index, count): a cluster worker reads only its share of each global
        batch, cut as split_batch cuts (synthetic: its share of a random batch).
      augment: how the training images are augmented: None (none), a name of
        towers.names.AUGMENTATIONS, or a towers.data.augment.Augmentation (source_for's:
        the one asked for, or the default for the images); synthetic input has no images
        to augment.
    """
    check('input', mode)
    augment = as_augmentation(augment)
    if hasattr(dataset, 'source'):  # records on disk (a RecordSet, an ImageNetSet)
        if not INPUTS[mode].tf_data:
            raise SettingError('records stream through {input} dataset, not %s', mode)
        source_fn, epoch_source_fn = dataset.source, getattr(dataset, 'epoch_source', None)
        if getattr(dataset, 'shuffled', False):  # it augments each record as it decodes it
            name = augment.name if augment else CENTER
            source_fn = functools.partial(source_fn, augment=name)
            epoch_source_fn = epoch_source_fn and functools.partial(epoch_source_fn,
                                                                    augment=name)
        return DatasetInput(num_classes=num_classes, batch_size=batch_size, seed=seed,
                            pixel_scale=255.0, source_fn=source_fn, epochs=epochs,
                            mean=mean, std=std, share=share, epoch_source_fn=epoch_source_fn,
                            augment=augment, **_done_by_the_set(dataset))
    return INPUTS[mode].over(dataset, sampler, batch_size, num_classes, seed=seed,
                             epochs=epochs, mean=mean, std=std, share=share, augment=augment)


def check_augment(config, source):
    """SettingError where config.augment does not apply to an input source of one's own (which
    varies its batches its own way); TrainConfig refuses it for an input mode without images."""
    if config.augment is not None:
        raise SettingError('{augment} varies the images of a dataset towers reads; an input '
                           'source of your own (%s) varies its own batches',
                           type(source).__name__)


def source_for(config, data, model, source=None, share=None):
    """(the InputSource a run trains from, its EpochSampler or None).

    Args:
      config: the run's TrainConfig (input, batch_size, seed, epochs, ...).
      data: its towers.data.Datasets; data.train is what the source reads.
      model: its ModelDesc (its num_classes, when it says one).
      source: an InputSource given instead (e.g. a PythonInput); it must say
        its steps_per_epoch unless the config does.
      share: (index, count): read only share `index` of `count` of each global
        batch (a cluster worker's, cut as split_batch cuts); None: all of it.
    """
    if source is not None:
        if not isinstance(source, InputSource):
            raise TypeError('source must be an InputSource, got %r' % (source,))
        if config.steps_per_epoch is None and not hasattr(source, 'steps_per_epoch'):
            raise SettingError('give {steps_per_epoch} for an input source without one')
        check_augment(config, source)
        return source, None
    train_set = data.train
    if config.batch_size > train_set.num_examples:
        raise SettingError('{batch_size} %d exceeds the %d training examples; use a smaller '
                           'batch', config.batch_size, train_set.num_examples)
    sampler = EpochSampler(train_set.num_examples, config.batch_size, seed=config.seed)
    # A dataset pipeline ends after the epochs asked for: when cleaning drops
    # records, its epochs are shorter than the sampler's.
    epochs = None if (config.steps or config.steps_per_epoch) else math.ceil(config.epochs)
    # (DataSet and RecordSet know their class count; a ModelDesc may say it too.)
    num_classes = getattr(model, 'num_classes', None) or train_set.num_classes
    augment = None if not INPUT_MODES[config.input].has_images else train_augmentation(
        config.augment, train_set, _image_shape(train_set, model))
    if share is not None:
        shortest = train_set.num_examples % config.batch_size or config.batch_size
        if shortest < share[1]:
            raise SettingError('{batch_size} %d leaves a batch of %d for %d workers: every '
                               'worker needs at least one example of each batch',
                               config.batch_size, shortest, share[1])
    if config.data_service is not None:
        return _service_input(config, train_set, num_classes, share,
                              config.steps_per_epoch or sampler.steps_per_epoch,
                              augment), sampler
    return make_input(config.input, train_set, sampler, config.batch_size, num_classes,
                      seed=config.seed, epochs=epochs, mean=config.mean,
                      std=config.std, share=share, augment=augment), sampler


def train_augmentation(name, train_set, input_shape):
    """The Augmentation a run asks for by name, or (None) the default for its training split's
    images of input_shape: none for imagenet-synthetic's random ones."""
    random = getattr(train_set, 'random_images', False)
    return choose(name, RANDOM if random else input_shape)


def _image_shape(train_set, model):
    """(H, W, C) of a training split: a split on disk's own, else (in memory) the model's,
    which its images are fed as."""
    shape = getattr(train_set, 'input_shape', None)
    return tuple(shape if shape is not None else model.input_shape)


def _service_input(config, train_set, num_classes, share, steps_per_epoch, augment=None):
    """The DataServiceInput of a run with config.data_service, over a split on disk."""
    if not hasattr(train_set, 'source'):
        raise SettingError('{data_service} sends a pipeline over shards on disk to its workers: '
                           'train on records:DIR, imagenet:DIR or tfds:DIR, not an in-memory '
                           'dataset')
    return DataServiceInput(train_set, config.data_service, config.data_service_mode,
                            steps_per_epoch, num_classes, config.batch_size, seed=config.seed,
                            mean=config.mean, std=config.std, job=config.data_service_job,
                            timeout=config.cluster_timeout, share=share, augment=augment,
                            **_done_by_the_set(train_set))


def _done_by_the_set(train_set):
    """The pipeline options a split on disk takes over: an image record set shuffles and
    augments its records itself (data/image_records.py), so the pipeline neither augments
    nor shuffles them again; {} for the others."""
    return dict(source_augments=True, shuffle_buffer=0) if getattr(
        train_set, 'shuffled', False) else {}
