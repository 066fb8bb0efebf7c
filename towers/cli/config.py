"""From flags to settings, and from settings back to flags.

`config_from_args` is the one place the train flags become a TrainConfig
(which checks them, once). `flag` says how the command line spells a setting,
so that an error the library words with parameter names (`batch_size must
be at least 1`) reaches a CLI user with the flag to change (`--batch-size
must be at least 1`).
"""
import functools
import hashlib
import os

from towers.cli.parsers import build_parser
from towers.config import TrainConfig
from towers.data.synthetic import NAME as SYNTHETIC
from towers.errors import SettingError
from towers.names import FOLDERS

# Settings whose flag is not '--' + the name with dashes.
FLAGS = {
    'learning_rate': '--lr',
    'tensorboard': '--no-tensorboard',
    'timed_steps': '--window',  # towers bench
    'warmup_steps': '--warmup',  # towers bench
    'dropout_rate': '--dropout',
    'logical_gpus': '--no-logical-gpus',
}


@functools.lru_cache(maxsize=None)
def _all_flags():
    """Every option string of every command."""
    flags, parsers = set(), [build_parser()]
    while parsers:
        for action in parsers.pop()._actions:
            flags.update(action.option_strings)
            if isinstance(action.choices, dict):  # a command's subparsers
                parsers.extend(action.choices.values())
    return frozenset(flags)


def flag(setting):
    """The flag of a setting: 'batch_size' -> '--batch-size', 'learning_rate' -> '--lr'.

    A setting no command has a flag for (a Python API parameter) keeps its name.
    """
    name = FLAGS.get(setting, '--' + setting.replace('_', '-'))
    return name if name in _all_flags() else setting


def config_from_args(args, tower_devices, param_device, input_mode):
    """The TrainConfig of `towers train`'s flags.

    Args:
      args: the parsed train flags.
      tower_devices, param_device: the devices they resolved to (on a cluster, the
        towers per task, a count).
      input_mode: the --input mode (its default depends on the dataset).
    Raises:
      SettingError: a flag's value no run can use.
    """
    check_xla_determinism(args)
    return TrainConfig(
        towers=tuple(tower_devices) if isinstance(tower_devices, list) else tower_devices,
        devices=args.devices, param_device=param_device, logical_gpus=args.logical_gpus,
        threads=args.threads,
        cluster_mode=args.cluster_mode,
        cluster_timeout=args.cluster_timeout, all_reduce_bucket=args.all_reduce_bucket,
        variable_update=args.variable_update, sync_bn=args.sync_bn, input=input_mode,
        allow_soft_placement=args.allow_soft_placement, data_format=args.data_format,
        batch_size=args.batch_size, accumulate=args.accumulate,
        steps_per_epoch=synthetic_epoch(args),
        seed=args.seed, mean=float_list(args.mean, 'mean'),
        std=float_list(args.std, 'std'), epochs=args.epochs, steps=args.steps,
        optimizer=args.optimizer, learning_rate=args.lr, lr_schedule=args.lr_schedule,
        warmup_epochs=args.warmup_epochs, momentum=args.momentum,
        weight_decay=args.weight_decay, decay_on=args.decay_on,
        label_smoothing=args.label_smoothing, augment=args.augment,
        clip_norm=args.clip_norm, freeze=args.freeze, init_from=args.init_from,
        init_map=args.init_map,
        ema=args.ema, logdir=args.logdir, checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints, eval_every=args.eval_every,
        best_metric=args.best_metric, tensorboard=args.tensorboard,
        histograms=args.histograms, log_every=args.log_every, quiet=args.quiet,
        precision=args.precision, loss_scale=loss_scale(args.loss_scale), xla=args.xla,
        **data_service_settings(args))


def check_xla_determinism(args):
    """SettingError for --xla with --deterministic (train's and bench's): under op determinism
    TensorFlow's XLA has no max-pool gradient, so the step would run uncompiled."""
    if args.xla and args.deterministic:
        raise SettingError("{xla} and {deterministic} do not go together: under op determinism "
                           "TensorFlow's XLA has no max-pool gradient and the step would run "
                           'uncompiled: drop one')


# ImageNet's training images (ILSVRC-2012): what an epoch of imagenet-synthetic counts, as
# tf_cnn_benchmarks counts its synthetic epochs.
IMAGENET_TRAIN_IMAGES = 1281167


def synthetic_epoch(args):
    """The steps of an epoch: None (the data's own), or for imagenet-synthetic an ImageNet
    epoch's. Its few hundred images in memory would otherwise make an epoch of two steps, and
    a run with --logdir would write a checkpoint every two steps."""
    if args.dataset != SYNTHETIC:
        return None
    return -(-IMAGENET_TRAIN_IMAGES // args.batch_size) if args.batch_size > 0 else None


def data_service_settings(args):
    """The data_service settings of train's flags: the dispatcher, the mode and the job."""
    if args.data_service is None:
        if args.data_service_job is not None:
            raise SettingError('{data_service_job} goes with {data_service}')
        return {}
    if args.deterministic:
        raise SettingError("{deterministic} promises the same numbers from the same run; the "
                           "batches of {data_service} come in its workers' order: drop one")
    if not args.dataset.startswith(FOLDERS):
        raise SettingError('{data_service} sends a pipeline over shards on disk to its workers: '
                           'give {dataset} records:DIR, imagenet:DIR or tfds:DIR; %s is held '
                           'in memory', args.dataset)
    job = args.data_service_job
    if job is not None and args.data_service_mode != 'distributed_epoch':
        raise SettingError('{data_service_job} names the job the trainers of {data_service_mode} '
                           'distributed_epoch share; with %s each trainer has its own',
                           args.data_service_mode)
    if job is None and args.logdir and args.data_service_mode == 'distributed_epoch':
        # Every trainer of the run gives the same --logdir: the same job.
        job = 'towers-%s' % hashlib.sha1(os.path.abspath(args.logdir).encode()).hexdigest()[:12]
    return dict(data_service=args.data_service, data_service_mode=args.data_service_mode,
                data_service_job=job)


def loss_scale(text):
    """--loss-scale: None, 'dynamic' or a number (TrainConfig checks its range)."""
    if text is None or text == 'dynamic':
        return text
    try:
        return float(text)
    except ValueError:
        raise SettingError('{loss_scale} must be a positive finite number or "dynamic", got %r',
                           text) from None


def float_list(text, setting):
    """'0.5,0.5,0.5' -> [0.5, 0.5, 0.5]; None stays None."""
    if text is None:
        return None
    try:
        return [float(v) for v in text.split(',')]
    except ValueError:
        raise SettingError('{%s} wants comma-separated numbers like 0.5,0.5,0.5, got %%r'
                           % setting, text) from None


def int_list(text, setting):
    """'1,2,4' -> [1, 2, 4], every one at least 1."""
    try:
        values = [int(v) for v in text.split(',') if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SettingError('{%s} wants positive integers like 1,2,4, got %%r' % setting, text)
    return values


def name_list(text, setting, names):
    """'a,b' -> ['a', 'b'], each one of names."""
    chosen = [n.strip() for n in text.split(',') if n.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown or not chosen:
        raise SettingError('{%s} wants some of %s, got %%r' % (setting, ','.join(names)), text)
    return chosen
