"""`towers train`: the flags become a model, datasets and a TrainConfig; then the loop.

The order is what a user waiting on a bad flag wants: every setting is checked
(the TrainConfig, the devices) before any data is read; SIGINT and SIGTERM
stop after the current step, saved.
"""
import dataclasses
import math
import signal

import numpy as np

from towers import data, models
from towers.cli.cluster import cluster_of
from towers.cli.config import config_from_args
from towers.cli.datasets import (
    SYNTHETIC,
    check_image_size,
    dataset_info,
    image_side,
    load_dataset,
)
from towers.cluster.modes import cluster_run
from towers.deviceplan import local_plan
from towers.distribution import Run
from towers.errors import SettingError
from towers.model import ClassifierModel
from towers.names import FOLDERS, INPUT_MODES
from towers.recipes import published_line
from towers.tools.hardware import check_compute_capability, slow_warning
from towers.tools.trace import Trace, check_trace_step
from towers.trainer import train


def run_train(args, log):
    from_records = args.dataset.startswith(FOLDERS)
    cluster = cluster_of(args)
    # Checked before any data is read; the devices resolved once, here, into this process's
    # plan: the local run's, or (in a cluster) what its precision is checked on.
    config, callbacks, plan = settings(args, from_records, cluster)
    if cluster is not None and cluster.is_evaluator:
        return run_evaluator(args, config, plan, from_records, log)
    worker = False  # a worker but the chief: trains, keeps nothing
    if cluster is not None:
        worker, run = not cluster.is_chief, cluster_run(config, cluster, plan, log)
        if run is None:
            return  # this task served the chief's towers until it was stopped
        if worker:
            config, callbacks = dataclasses.replace(config, logdir=None, eval_every=0), []
    else:
        run = Run.local(config, plan)
    check_compute_capability(config.precision, plan.towers)
    warning = slow_warning(config.precision, plan.towers)
    if warning:  # a teacher may want loss scaling at work all the same: not an error
        log(warning)
    input_shape, num_classes, datasets = load_data(args, from_records, log)
    options = {} if args.dropout is None else {'dropout_rate': args.dropout}
    model_fn = models.build_model(args.model, input_shape, num_classes, **options)
    if worker:  # the chief evaluates
        datasets = data.Datasets(datasets.train, _empty(datasets.test), _empty(datasets.test))
    log('dataset %s: %d train, %d validation, %d test; model %s'
        % (args.dataset, datasets.train.num_examples, datasets.validation.num_examples,
           datasets.test.num_examples, args.model))
    with StopOnSignal() as stop:
        result = train(config, model_fn, datasets, input_shape, num_classes, log=log,
                       run_info={'model': args.model, 'model_options': options,
                                 'dataset': args.dataset, 'data_dir': args.data_dir},
                       stop_requested=stop.requested, callbacks=callbacks, run=run)
    if args.recipe and not result['stopped']:
        log(published_line(args.recipe, args.model, args.dataset, num_classes,
                           result['test_accuracy'], result['test_top5']))
    if result['stopped'] == 'SIGINT':
        raise KeyboardInterrupt  # saved and stopped; exit as an interrupted command does


def run_evaluator(args, config, plan, from_records, log):
    """An evaluator task: the chief's checkpoints evaluated as they come (towers/evaluator.py),
    on this task's plan, on the validation set the same flags hold back, else the test set."""
    from towers.evaluator import Evaluator, wait_for_run
    logdir = config.logdir
    if not logdir:
        raise SettingError("an evaluator task evaluates the chief's checkpoints: give it the "
                           "chief's {logdir} (a folder both can reach)")
    wait = args.cluster_timeout or EVALUATOR_WAIT_S
    run = wait_for_run(logdir, wait)
    _, _, datasets = load_data(args, from_records, log)
    split = ('validation' if datasets.validation.num_examples else 'test')
    model_fn = models.build_model(run['model'], run['input_shape'], run['num_classes'],
                                  **run.get('model_options', {}))
    log('evaluator: evaluating each checkpoint of %s on its %s set' % (logdir, split))
    evaluator = Evaluator(logdir, run, model_fn, (split, getattr(datasets, split)), plan,
                          config.batch_size, config.best_metric, log=log)
    try:
        evaluator.run_until_done(wait)
    finally:
        evaluator.close()


# How long an evaluator waits for the chief's run.json without --cluster-timeout: the chief
# loads its data and builds its graph first.
EVALUATOR_WAIT_S = 600


def load_data(args, from_records, log):
    """(input_shape, num_classes, Datasets) of --dataset: records stream, others load."""
    if args.skip_bad_images and not args.dataset.startswith(('imagenet:', 'tfds:')):
        raise SettingError('{skip_bad_images} goes with imagenet:DIR or tfds:DIR, whose images '
                           'are decoded as they are read; not %s', args.dataset)
    if from_records:
        check_image_size(args)
        if args.input is not None and not INPUT_MODES[args.input].tf_data:
            raise SettingError('%sDIR streams from disk through {input} dataset; {input} %s '
                               'needs an in-memory dataset', args.dataset.split(':')[0] + ':',
                               args.input)
        load = (load_image_records if args.dataset.startswith(('imagenet:', 'tfds:'))
                else load_records)
        input_shape, num_classes, datasets, skipped = load(args)
        for shard, count, problem in skipped:
            log('skipped %s (%d records): %s' % (shard, count, problem))
        return input_shape, num_classes, datasets
    info = dataset_info(args)
    if args.validation_size is not None and args.dataset == SYNTHETIC:
        raise SettingError('{validation_size} holds out real examples; %s has none to hold '
                           'out', SYNTHETIC)
    if args.validation_size is not None and not 0 <= args.validation_size < info.num_train:
        raise SettingError('{validation_size} must be in [0, %d) for %s, got %d',
                           info.num_train, args.dataset, args.validation_size)
    models.build_model(args.model, info.input_shape, info.num_classes)  # a bad name: now
    datasets = load_dataset(args, info, data_dir=args.data_dir,
                            validation_size=args.validation_size, seed=args.seed)
    return info.input_shape, info.num_classes, datasets


def _empty(like):
    """An empty split of the images and classes of `like` (a DataSet or a split on disk)."""
    shape = like.images.shape[1:] if hasattr(like, 'images') else like.input_shape
    return data.DataSet(np.zeros((0,) + tuple(shape), np.uint8), np.zeros(0, np.int64),
                        num_classes=like.num_classes)


def settings(args, from_records, cluster=None):
    """(the TrainConfig of the flags, the callbacks they add, the DevicePlan of this process's
    devices, resolved once); SettingError for a bad one."""
    if cluster is None and args.cluster_mode:
        raise SettingError('{cluster_mode} needs a cluster: set TF_CONFIG, give {cluster} '
                           'FILE.json {task_type} and {task_index}, or start the tasks with srun')
    callbacks = trace_callbacks(args)
    plan = local_plan(args.towers, args.param_device, args.variable_update, args.devices,
                      logical_gpus=args.logical_gpus)
    # On a cluster the towers are per task: the chief places them (towers/cluster/).
    config = config_from_args(args, list(plan.towers) if cluster is None else args.towers,
                              plan.param_device(),
                              args.input or ('dataset' if from_records else 'feed'))
    if config.best_metric not in ('auto',) + ClassifierModel.METRICS:
        raise SettingError('{best_metric} %r is not a metric of this model; choose one of: %s',
                           config.best_metric, ', '.join(ClassifierModel.METRICS))
    return config, callbacks, plan


def trace_callbacks(args):
    """[Trace] for --trace (checked now, not after training), else []."""
    check_trace_step(args.trace_step)
    if args.trace_plot and not args.trace:
        raise SettingError('{trace_plot} goes with {trace}')
    return [Trace(args.trace, args.trace_step, args.trace_plot)] if args.trace else []


def load_records(args):
    """--dataset records:DIR: the train split stays on disk, the test split is read in."""
    from towers.data import records
    folder = args.dataset.split(':', 1)[1]
    train_set = records.RecordSet(folder, 'train', num_workers=args.num_workers,
                                  worker_index=args.worker_index,
                                  skip_bad_shards=args.skip_bad_shards)
    test_set, test_skipped = records_test_set(folder, train_set.num_classes,
                                              args.skip_bad_shards)
    empty = data.DataSet(test_set.images[:0], test_set.labels[:0],
                         num_classes=train_set.num_classes)
    datasets = data.Datasets(train_set, empty, test_set)
    skipped = train_set.skipped + test_skipped
    return train_set.input_shape, train_set.num_classes, datasets, skipped


# The most memory an evaluation split is read into (as float32, as a DataSet holds it);
# a bigger one is streamed from disk at each evaluation.
EVAL_MEMORY = 2 ** 31


def load_image_records(args):
    """--dataset imagenet:DIR or tfds:DIR: the train split streams, the evaluation split (if
    any, and unless --eval-every 0) is read in at the evaluation view."""
    size = image_side(args)
    options = dict(skip_bad_shards=args.skip_bad_shards, skip_bad_images=args.skip_bad_images)
    train_set = open_split(args.dataset, 'train', size, seed=args.seed,
                           num_workers=args.num_workers, worker_index=args.worker_index,
                           **options)
    if args.image_size and train_set.schema.shape:
        raise SettingError('{image_size} goes with images of any size; %s\'s are all %s',
                           args.dataset, 'x'.join(map(str, train_set.input_shape)))
    test_set, skipped = _empty(train_set), []
    if args.eval_every != 0 and evaluation_split(args.dataset):
        test_set, skipped = image_test_set(args.dataset, size, train_set.num_classes,
                                           **options)
    empty = _empty(train_set)
    return (train_set.input_shape, train_set.num_classes,
            data.Datasets(train_set, empty, test_set), train_set.skipped + skipped)


def open_split(dataset, split, size, **options):
    """The data.image_records.ImageRecordSet of a split of imagenet:DIR or tfds:DIR."""
    from towers.data import image_records, tfds
    kind, folder = dataset.split(':', 1)
    if kind == 'tfds':
        return tfds.image_set(folder, split, size, **options)
    return image_records.ImageNetSet(folder, split, size, **options)


def evaluation_split(dataset):
    """The split of imagenet:DIR or tfds:DIR that evaluation reads, or None if it has none."""
    from towers.data import imagenet, tfds
    kind, folder = dataset.split(':', 1)
    if kind == 'tfds':
        return tfds.evaluation_split(tfds.read_info(folder))
    return 'validation' if imagenet.has_split(folder, 'validation') else None


def image_test_set(dataset, size, num_classes, **options):
    """The evaluation split of imagenet:DIR or tfds:DIR at the evaluation view: (split,
    skipped shards). In memory (a DataSet) up to EVAL_MEMORY, else streamed from disk at
    each evaluation (data.image_splits.StreamedSplit). options: skip_bad_shards,
    skip_bad_images."""
    from towers.data import image_splits
    split = evaluation_split(dataset)
    if split is None:
        raise SettingError('%s has no validation or test split to evaluate on', dataset)
    evaluation = open_split(dataset, split, size, **options)
    if evaluation.num_examples * math.prod(evaluation.input_shape) * 4 > EVAL_MEMORY:
        return image_splits.StreamedSplit(evaluation), evaluation.skipped
    images, labels = image_splits.read_all(evaluation)
    return data.DataSet(images, labels, num_classes=num_classes), evaluation.skipped


def records_test_set(folder, num_classes, skip_bad_shards=False):
    """The test split of a records folder, in memory: (DataSet, skipped shards)."""
    from towers.data import records
    test = records.RecordSet(folder, 'test', skip_bad_shards=skip_bad_shards)
    images, labels = records.read_all(test, test.input_shape)
    return data.DataSet(images, labels, num_classes=num_classes), test.skipped


class StopOnSignal:
    """SIGINT and SIGTERM ask training to stop after the current step and save.

    A second SIGINT interrupts at once. SIGTERM (a scheduler's polite stop)
    then ends the command with status 0; SIGINT with 130, as Ctrl-C does.
    """

    def __init__(self):
        self.signal_name, self._previous = None, {}

    def requested(self):
        return self.signal_name

    def _handle(self, signum, frame):
        if self.signal_name == 'SIGINT' and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def __enter__(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
