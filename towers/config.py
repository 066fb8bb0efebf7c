"""TrainConfig: every setting of a training run, checked once, where it enters.

The command line builds one from its flags (towers/cli/config.py), a Python
user writes one by hand, and the Trainer takes it whole. A TrainConfig that
exists is valid: each field is checked when it is made (and again by
dataclasses.replace), by the one rule for that setting in RULES, which the
other commands' own flags (`towers eval --batch-size`) are checked by too.
Messages name the parameters (`batch_size`); the CLI spells them as flags.
"""
import dataclasses
import math
import numbers
import re

from towers.errors import SettingError
from towers.names import (
    AUGMENTATIONS,
    CLUSTER_MODES,
    DATA_FORMATS,
    DATA_SERVICE_MODES,
    DECAY_ON,
    INPUT_MODES,
    OPTIMIZERS,
    PRECISIONS,
    VARIABLE_UPDATES,
)


def _text(value):
    return '%s' % (value,)


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(value)


def _at_least(low, what='at least %d'):
    return (lambda v: _is_int(v) and v >= low), 'must be ' + (what % low if '%' in what else what)


def _optional(rule):
    check, text = rule
    return (lambda v: v is None or check(v)), text


def _one_of(names, optional=False):
    return (lambda v: v in names or (optional and v is None)), None, names


_POSITIVE = (lambda v: _is_number(v) and v > 0), 'must be positive'
_NON_NEGATIVE = (lambda v: _is_number(v) and v >= 0), 'must be 0 or more'

# setting -> (check(value) -> bool, what a valid value is); a third entry lists
# the names a choice takes.
RULES = {
    'batch_size': _at_least(1),
    'accumulate': _at_least(1),
    'steps': _optional(_at_least(1)),
    'epochs': _POSITIVE,
    'steps_per_epoch': _optional(_at_least(1)),
    'log_every': _at_least(1),
    'checkpoint_every': _at_least(0, '0 (off) or more'),
    'keep_checkpoints': _at_least(1),
    'eval_every': _at_least(0, '0 (off) or more epochs'),
    'warmup_steps': _at_least(0, '0 or more'),
    'weight_decay': _NON_NEGATIVE,
    'decay_on': _one_of(DECAY_ON),
    'label_smoothing': ((lambda v: _is_number(v) and 0 <= v < 1),
                        'must lie in [0, 1) (e.g. 0.1)'),
    'augment': _one_of(AUGMENTATIONS, optional=True),
    'clip_norm': _optional(_POSITIVE),
    'ema': ((lambda v: v is None or (_is_number(v) and 0 < v < 1)),
            'must lie between 0 and 1 (e.g. 0.999)'),
    'seed': _at_least(0, '0 or more'),
    'variable_update': _one_of(VARIABLE_UPDATES),
    'input': _one_of(INPUT_MODES),
    'optimizer': _one_of(OPTIMIZERS),
    'precision': _one_of(PRECISIONS),
    'data_format': _one_of(DATA_FORMATS, optional=True),
    'cluster_mode': _one_of(CLUSTER_MODES, optional=True),
    'cluster_timeout': _optional(_POSITIVE),
    'data_service_mode': _one_of(DATA_SERVICE_MODES),
    'xla': ((lambda v: isinstance(v, bool)), 'must be True or False'),
    'logical_gpus': ((lambda v: isinstance(v, bool)), 'must be True or False'),
}


def check(setting, value):
    """Raise SettingError unless value is valid for the setting; returns value.

    For the settings of RULES, also where they are a flag of another command.
    """
    rule = RULES[setting]
    if rule[0](value):
        return value
    if len(rule) == 3:
        raise SettingError('unknown {%s} %%r; choose one of: %s' % (setting, ', '.join(rule[2])),
                           value)
    raise SettingError('{%s} %s, got %%s' % (setting, rule[1]), _text(value))


DYNAMIC = 'dynamic'  # --loss-scale's default for fp16


def check_loss_scale(precision, loss_scale):
    """SettingError unless loss_scale fits the precision: None, 'dynamic' or a positive
    finite number, and anything but None only with fp16."""
    if loss_scale is None:
        return
    if precision != 'fp16':
        raise SettingError('{loss_scale} scales the float16 loss: use it with {precision} fp16 '
                           '(%s needs no loss scaling)', precision)
    if loss_scale != DYNAMIC and not (_is_number(loss_scale) and loss_scale > 0):
        raise SettingError('{loss_scale} must be a positive finite number or "dynamic", got %s',
                           '%g' % loss_scale if isinstance(loss_scale, float)
                           else _text(loss_scale))


# Trainer keywords of before the TrainConfig, and the setting each became.
RENAMED = {'max_epoch': 'epochs', 'max_steps': 'steps', 'ema_decay': 'ema',
           'tower_devices': 'towers', 'input': 'input (a mode) or source (an InputSource)'}

# The settings that describe the ClassifierModel towers.train builds.
CLASSIFIER_SETTINGS = ('optimizer', 'momentum', 'weight_decay', 'decay_on', 'label_smoothing',
                       'clip_norm', 'freeze')


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What to train on, how long, and what to keep; checked when made.

    The length is `steps` when given, else `epochs` (fractions allowed), an
    epoch being `steps_per_epoch` steps (default: ceil(N / batch_size), the
    last batch short). batch_size is the *global* batch, sliced over the
    towers. optimizer, momentum, weight_decay, clip_norm and freeze describe
    the ClassifierModel that `towers.train` builds; a ModelDesc of one's own
    says them itself (its optimizer(), weight_decay(), gradient_processors()).
    """
    # Devices and variables (towers/devices.py, towers/variables.py).
    towers: object = None  # a tower count (per task in a cluster), device names, or None:
    # every GPU, else one CPU
    devices: str = None  # with a count: the devices by name ('/gpu:0,/gpu:2') or a kind ('cpu':
    # virtual CPU devices, on a GPU machine too; 'gpu')
    # Where the shared variables live: 'auto' (the towers' GPU where they are all on one GPU,
    # else /cpu:0), 'cpu' (/cpu:0, as None), 'gpu', 'spread' or a device name.
    param_device: str = 'auto'
    # More towers than GPUs split each GPU into logical GPUs (towers/devices.py); False
    # refuses instead.
    logical_gpus: bool = True
    variable_update: str = 'parameter_server'
    sync_bn: bool = False
    allow_soft_placement: bool = False  # a tower op TensorFlow moved off its device: go on
    data_format: str = None  # the maps' layout, 'NHWC' or 'NCHW'; None: NCHW on GPU towers
    # What the towers compute in (towers/precision.py): 'fp32', 'bf16' or 'fp16' over float32
    # variables; fp16's loss scale: None or 'dynamic' (the default), or a fixed number.
    precision: str = 'fp32'
    loss_scale: object = None
    # XLA's auto-clustering of the training step (the Session's global_jit_level ON_1), as
    # tf_cnn_benchmarks' --xla. On CPU towers TensorFlow clusters only when TF_XLA_FLAGS holds
    # --tf_xla_cpu_global_jit before its first Session (`towers train --xla` sets it).
    xla: bool = False
    # The data (towers/inputs/).
    input: str = 'feed'
    batch_size: int = 100
    # Towers in time: each tower's slice in this many micro-batches, one after another in a
    # step, their gradients summed before the one apply (towers/tower.py micro_slices).
    accumulate: int = 1
    seed: int = 0  # graph seed and data order, saved with every checkpoint
    mean: tuple = None  # per-channel normalisation, --input dataset only
    std: tuple = None
    # How training images are varied: 'inception', 'pad-crop-flip' or 'center' (none); None:
    # by the images' size (towers/data/augment.py). Evaluation takes the centre view.
    augment: str = None
    # How long.
    epochs: float = 10.0
    steps: int = None
    steps_per_epoch: int = None
    # The optimisation (towers/model.py, towers/processors.py, towers/schedules.py).
    optimizer: str = 'adam'
    learning_rate: object = 1e-3  # the base rate, or a towers.schedules.LearningRate
    lr_schedule: str = 'constant'
    warmup_epochs: float = 0.0
    momentum: float = 0.9
    weight_decay: float = 0.0
    decay_on: str = 'weights'  # what weight decay pulls toward 0: towers/names.py DECAY_ON
    label_smoothing: float = 0.0  # the targets' mass spread evenly over the classes
    clip_norm: float = None
    freeze: str = None  # regex of variables not to train
    ema: float = None  # decay of the weights' moving average, used to evaluate and export
    # Fine-tuning (towers/initfrom.py): a new run's model variables from this logdir or
    # checkpoint where names and shapes match, its names renamed by 'OLD=NEW' regex rules.
    init_from: str = None
    init_map: tuple = None
    # What the run keeps and says (towers/callbacks/).
    logdir: str = None
    checkpoint_every: int = 500
    keep_checkpoints: int = 5
    eval_every: int = 1  # epochs; 0: only the final test
    best_metric: str = 'auto'  # accuracy when the model has it, else loss
    tensorboard: bool = True
    histograms: bool = False
    log_every: int = 50
    quiet: bool = False
    warmup_steps: int = 10  # steps left out of images/sec
    # Across processes (towers/cluster/): how the tasks train together, and how long a
    # step may wait on another task before the run stops, naming it (None: a few times
    # the step time, once it is known).
    cluster_mode: str = None
    cluster_timeout: float = None
    threads: int = None  # each task's intra- and inter-op threads (None: TensorFlow's)
    all_reduce_bucket: str = None  # collective mode's buckets: a size like '4MB', 'auto', '0'
    # The tf.data service (towers/inputs/dataservice.py): its dispatcher's HOST:PORT (None:
    # the pipeline runs here), how its workers share the pipeline out, and the name of the job
    # a distributed_epoch run's trainers share (None: each trainer its own).
    data_service: str = None
    data_service_mode: str = 'parallel_epochs'
    data_service_job: str = None

    def __post_init__(self):
        for name in ('towers', 'mean', 'std', 'init_map'):
            value = getattr(self, name)
            if isinstance(value, list):  # a frozen config holds tuples
                object.__setattr__(self, name, tuple(value))
        if self.data_service is not None:
            object.__setattr__(self, 'data_service',
                               parse_address(self.data_service, 'data_service'))
        for setting in RULES:
            check(setting, getattr(self, setting))
        self._check_pairs()
        check_loss_scale(self.precision, self.loss_scale)
        self.schedule()  # the schedule's own one-line errors
        if self.freeze is not None:
            check_pattern(self.freeze, '{freeze}')
        if self.init_map and self.init_from is None:
            raise SettingError('{init_map} renames the names of {init_from}\'s checkpoint: give '
                               '{init_from} too')

    def _check_pairs(self):
        if (self.mean is None) != (self.std is None):
            raise SettingError('{mean} and {std} go together')
        if self.mean is not None and not INPUT_MODES[self.input].tf_data:
            raise SettingError('{mean}/{std} normalise in the tf.data pipeline: use them with '
                               '{input} dataset')
        if self.std is not None and not all(_is_number(s) and s > 0 for s in self.std):
            raise SettingError('{std} values must be positive, got %s', list(self.std))
        if self.augment is not None and not INPUT_MODES[self.input].has_images:
            raise SettingError('{augment} varies the training images; {input} %s has none '
                               '(one random batch, for benchmarks)', self.input)
        if self.data_service is not None and not INPUT_MODES[self.input].tf_data:
            raise SettingError('{data_service} runs the tf.data pipeline of {input} dataset on '
                               'its workers; not {input} %s', self.input)

    @classmethod
    def from_keywords(cls, **settings):
        """A TrainConfig of keywords (the Trainer's), naming a keyword of before it."""
        for old, new in RENAMED.items():
            if old in settings and not (old == 'input' and isinstance(settings[old], str)):
                raise TypeError('the Trainer setting %s is now %s' % (old, new))
        return cls(**settings)

    def schedule(self):
        """The towers.schedules.LearningRate this run follows."""
        from towers.schedules import LearningRate
        if isinstance(self.learning_rate, LearningRate):
            if self.lr_schedule != 'constant' or self.warmup_epochs:
                raise SettingError('{learning_rate} is a LearningRate, which holds its own '
                                   'schedule and warm-up: leave {lr_schedule} and '
                                   '{warmup_epochs} unset')
            return self.learning_rate
        return LearningRate.parse(self.learning_rate, self.lr_schedule, self.warmup_epochs)


def parse_address(text, setting):
    """'HOST:PORT' of 'HOST:PORT' or 'grpc://HOST:PORT' (a tf.data service dispatcher's);
    SettingError naming the setting, e.g. 'data_service'."""
    address = text[len('grpc://'):] if text.startswith('grpc://') else text
    host, _, port = address.rpartition(':')
    if '://' in address or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingError('{%s} wants HOST:PORT or grpc://HOST:PORT (the dispatcher of '
                           '`towers data-service dispatcher`), got %%r' % setting, text)
    return '%s:%d' % (host, int(port))


def check_pattern(pattern, what):
    """Compile a user's regex, or say which setting holds a bad one.

    Args:
      what: the setting as a message names it, e.g. '{freeze}'.
    """
    try:
        return re.compile(pattern)
    except re.error as e:
        raise SettingError('%s %%r is not a valid regular expression: %%s' % what,
                           pattern, e) from None
