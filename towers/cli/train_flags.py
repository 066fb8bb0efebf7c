"""The flags of `towers train`: what to train, on which devices, how, and what to keep.

TensorFlow-free; config.py turns them into a TrainConfig.
"""
from towers.cli.cluster_flags import cluster_train_flags
from towers.cli.flags import DEFAULT, device_flags, model_flags, precision_flags
from towers.cluster.dataservice import MODES as DATA_SERVICE_MODES
from towers.names import (
    AUGMENTATIONS,
    DATA_FORMATS,
    DECAY_ON,
    INPUT_MODES,
    OPTIMIZERS,
    VARIABLE_UPDATES,
)
from towers.recipes import RECIPES


def train_parser(commands):
    """towers train: what to train, on which devices, how, and what to keep."""
    train = commands.add_parser('train', help='train a model over the towers, then test it')
    model_flags(train)
    train.add_argument('--data-dir', default=None,
                       help='folder with the dataset files; default: the first of '
                            '$TOWERS_DATA_DIR/NAME, ~/.cache/towers/NAME, '
                            '/usr/share/datasets/NAME that has them (missing files are '
                            'downloaded)')
    train.add_argument('--validation-size', type=int, default=None,
                       help='training examples held out as validation (default: per dataset)')
    device_flags(train)
    _train_strategy_flags(train)
    _train_optimizer_flags(train)
    _train_run_flags(train)
    precision_flags(train)
    cluster_train_flags(train)
    _data_service_flags(train)
    return train


def _data_service_flags(train):
    """The tf.data service that runs the input pipeline (towers data-service)."""
    group = train.add_argument_group(
        'tf.data service (the input pipeline on machines of its own)',
        "the service's batch order follows its workers' timing: N towers do not equal one "
        "device, a resume restarts at its epoch's start (the partial epoch's batches are "
        "seen again), and the workers' cleaning is not counted")
    group.add_argument('--data-service', default=DEFAULT['data_service'], metavar='grpc://HOST:PORT',
                       help='send the pipeline of records:DIR, imagenet:DIR or tfds:DIR to '
                            'the workers of this `towers data-service dispatcher` (HOST:PORT '
                            'works too): they read the shards at the same path (a shared '
                            'filesystem), decode, crop, augment and batch; a dispatcher silent '
                            'for --cluster-timeout (default 60 s) stops the run')
    group.add_argument('--data-service-mode', default=DEFAULT['data_service_mode'],
                       choices=DATA_SERVICE_MODES,
                       help="parallel_epochs: every service worker makes whole passes of this "
                            "trainer's pipeline, each on a seed of its own; distributed_epoch: "
                            "the run's trainers share one job whose shard files the dispatcher "
                            'hands out one at a time, each example once per pass (default: '
                            '%(default)s)')
    group.add_argument('--data-service-job', default=DEFAULT['data_service_job'], metavar='NAME',
                       help="with distributed_epoch: the job the run's trainers share "
                            '(default: one named after --logdir)')


def _train_strategy_flags(train):
    """Variable strategy, batch norm and input flags."""
    train.add_argument('--variable-update', default=DEFAULT['variable_update'],
                       choices=VARIABLE_UPDATES,
                       help='parameter_server: one copy of the variables (on --param-device); '
                            'replicated: a copy per tower, gradients all-reduced, the same '
                            'update on every copy; independent: no synchronisation, for '
                            'benchmarks only (default: %(default)s)')
    train.add_argument('--allow-soft-placement', action='store_true',
                       default=DEFAULT['allow_soft_placement'],
                       help='train on when TensorFlow ran a tower op off its device (no '
                            'kernel for it there); default: the first step checks, and such a '
                            'move stops the run in one line')
    train.add_argument('--accumulate', type=int, default=DEFAULT['accumulate'], metavar='K',
                       help='each tower runs its slice of the batch as K micro-batches one '
                            'after another and the step applies their summed gradients once: '
                            'the update of the whole --batch-size in 1/K of the memory (batch '
                            "norm's statistics are each micro-batch's own); default: "
                            '%(default)s'),
    train.add_argument('--sync-bn', action='store_true', default=DEFAULT['sync_bn'],
                       help='batch norm over the whole global batch (moments all-reduced over '
                            'the towers) instead of each tower its own slice')
    train.add_argument('--input', default=None, choices=tuple(INPUT_MODES),
                       help='how batches reach the towers: feed (feed_dict, the reference), '
                            'staging (host queue + per-tower StagingArea), dataset (in-graph '
                            'tf.data), synthetic (random, benchmarks only); default: feed, '
                            'or dataset for records:DIR')
    train.add_argument('--augment', default=DEFAULT['augment'], choices=AUGMENTATIONS,
                       help="how training images are varied: inception (a random box of 5%%-100%% "
                            "of the area, aspect 3:4-4:3, resized, flipped: tf_cnn_benchmarks'), "
                            "pad-crop-flip (CIFAR's: zero-pad 4, crop back, flip), center (none); "
                            'evaluation takes the centre view (default: by the images\' size, '
                            'said in the first lines)')
    train.add_argument('--mean', default=DEFAULT['mean'],
                       help='with --input dataset: per-channel means subtracted after /255, '
                            'e.g. 0.4914,0.4822,0.4465 (needs --std)')
    train.add_argument('--std', default=DEFAULT['std'],
                       help='with --input dataset: per-channel standard deviations to divide by')
    train.add_argument('--num-workers', type=int, default=1,
                       help='with records:DIR: how many workers share the shards (default: 1)')
    train.add_argument('--worker-index', type=int, default=0,
                       help='with records:DIR: which share of the shards this run reads')
    train.add_argument('--skip-bad-shards', action='store_true',
                       help='with records:DIR or imagenet:DIR, skip (and count) shards that '
                            'fail their checksum or are cut short instead of stopping')
    train.add_argument('--skip-bad-images', action='store_true',
                       help='with imagenet:DIR, skip (name and count) a record whose image does '
                            'not decode or whose label is out of range, instead of stopping')


def _train_optimizer_flags(train):
    """The batch, the length and the optimisation."""
    train.add_argument('--recipe', default=None, choices=sorted(RECIPES),
                       help="a published recipe's optimizer, schedule, batch, decay, smoothing "
                            'and augmentation, each said with its source at the start; a flag '
                            'given by hand wins (he2016-cifar: the CIFAR ResNets of He et al.; '
                            "tf-cnn-benchmarks-resnet50; nvidia-resnet50-v1.5; "
                            "mlperf-resnet50-lars: MLPerf's ResNet-50 with LARS at batch 4096)")
    train.add_argument('--batch-size', type=int, default=DEFAULT['batch_size'],
                       help='global batch, split over the towers (default: %(default)s)')
    train.add_argument('--epochs', type=float, default=DEFAULT['epochs'],
                       help='epochs to train (default: %(default)g)')
    train.add_argument('--steps', type=int, default=DEFAULT['steps'],
                       help='train this many steps instead')
    train.add_argument('--optimizer', default=DEFAULT['optimizer'], choices=OPTIMIZERS,
                       help='lars: momentum on layer-wise trust-scaled gradients, for very '
                            'large batches (You et al. 2017), its weight decay its own '
                            '(default: %(default)s)')
    train.add_argument('--lr', type=float, default=DEFAULT['learning_rate'],
                       help='learning rate (default: %(default)g)')
    train.add_argument('--lr-schedule', default=DEFAULT['lr_schedule'],
                       help='constant; piecewise:EPOCH=LR,... (e.g. piecewise:80=0.01,120=0.001); '
                            'exponential:FACTOR,EPOCHS (x FACTOR every EPOCHS epochs, e.g. '
                            'exponential:0.1,350 as the CIFAR-10 tutorial); cosine[:EPOCHS] '
                            '(half a cosine down to 0 over EPOCHS, default the whole run, after '
                            'the warm-up); poly[:POWER[,END]] ((1-t)^POWER down to END over the '
                            'run after the warm-up, default 2 and 0) (default: %(default)s)')
    train.add_argument('--warmup-epochs', type=float, default=DEFAULT['warmup_epochs'],
                       help='ramp the learning rate up linearly over these epochs '
                            '(default: %(default)g)')
    train.add_argument('--momentum', type=float, default=DEFAULT['momentum'],
                       help='momentum for --optimizer momentum or lars (default: %(default)g)')
    train.add_argument('--weight-decay', type=float, default=DEFAULT['weight_decay'],
                       help='L2 weight decay, added once to the averaged gradients (with '
                            'lars, inside its trust ratio) (default: %(default)g)')
    train.add_argument('--decay-on', default=DEFAULT['decay_on'], choices=DECAY_ON,
                       help="what --weight-decay applies to: weights (conv and dense kernels; "
                            "not biases or batch norm), not-norms (all but batch norm's beta "
                            "and gamma, as tf_cnn_benchmarks), all (default: %(default)s)")
    train.add_argument('--label-smoothing', type=float, default=DEFAULT['label_smoothing'],
                       metavar='EPS', help='spread EPS of each target over all classes, e.g. '
                                           '0.1 (default: %(default)g)')
    train.add_argument('--clip-norm', type=float, default=DEFAULT['clip_norm'],
                       help='clip the averaged gradients to this global norm')
    train.add_argument('--freeze', default=DEFAULT['freeze'], metavar='REGEX',
                       help='do not train the variables whose names match, e.g. "^conv1/"')
    train.add_argument('--init-from', default=DEFAULT['init_from'], metavar='PATH',
                       help="fine-tuning: a new run whose model variables start from this "
                            "logdir's (or checkpoint's) where names and shapes match; the rest "
                            '(a new head) keep their initial values, and the first lines say '
                            'which (not a resume: step 0, its own optimizer slots)')
    train.add_argument('--init-map', action='append', default=DEFAULT['init_map'],
                       metavar='OLD=NEW',
                       help="rename the --init-from checkpoint's names first (a regex and its "
                            'replacement, e.g. "^resnet_v1_50/="; may repeat, the first that '
                            'matches renames)')
    train.add_argument('--ema', type=float, default=DEFAULT['ema'], metavar='DECAY',
                       help='keep a moving average of the weights (e.g. 0.999) and evaluate and '
                            'export it, as the CIFAR-10 tutorial does')
    train.add_argument('--dropout', type=float, default=None,
                       help="dropout rate for models that have dropout (mnist_convnet: 0.5)")


def _train_run_flags(train):
    """What the run keeps and says: logdir, checkpoints, evaluation, logs."""
    train.add_argument('--logdir', default=DEFAULT['logdir'],
                       help='checkpoint folder; a checkpoint already there is resumed')
    train.add_argument('--log-every', type=int, default=DEFAULT['log_every'],
                       help='steps per log line (default: %(default)s)')
    train.add_argument('--checkpoint-every', type=int, default=DEFAULT['checkpoint_every'],
                       help='steps per checkpoint with --logdir, besides each epoch end and the '
                            'end (default: %(default)s; 0: only those)')
    train.add_argument('--keep-checkpoints', type=int, default=DEFAULT['keep_checkpoints'],
                       help='newest checkpoints to keep (default: %(default)s)')
    train.add_argument('--eval-every', type=int, default=DEFAULT['eval_every'],
                       help='epochs between evaluations on the validation set (the test set '
                            'when there is none) (default: %(default)s; 0: only the final test)')
    train.add_argument('--best-metric', default=DEFAULT['best_metric'],
                       help='with --logdir, keep the best checkpoint by this metric in '
                            'LOGDIR/best: accuracy, loss (the lowest is kept) or another metric '
                            'of the model (default: %(default)s: accuracy where the model has '
                            'it, else loss)')
    train.add_argument('--no-tensorboard', action='store_false', dest='tensorboard',
                       default=DEFAULT['tensorboard'],
                       help='write no TensorBoard events in --logdir')
    train.add_argument('--histograms', action='store_true', default=DEFAULT['histograms'],
                       help='also write weight histograms to TensorBoard')
    train.add_argument('--trace', default=None, metavar='FILE.json',
                       help='write one step, fully traced, as a Chrome trace (Perfetto, '
                            'chrome://tracing) and print where the time went')
    train.add_argument('--trace-plot', default=None, metavar='FILE.png',
                       help='with --trace: also draw that step as a timeline, a row per device')
    train.add_argument('--trace-step', type=int, default=None,
                       help='the step --trace records (default: the first after warm-up)')
    train.add_argument('--quiet', action='store_true', default=DEFAULT['quiet'],
                       help='no progress bar: plain log lines, as when not on a terminal')
    train.add_argument('--seed', type=int, default=DEFAULT['seed'],
                       help='random seed (default: %(default)s)')
    train.add_argument('--data-format', default=DEFAULT['data_format'], choices=DATA_FORMATS,
                       help="the layout of the towers' maps: NCHW (channels first, what "
                            "cuDNN's float32 kernels prefer) or NHWC; the variables and "
                            'checkpoints are the same in both (default: NCHW on GPU towers, '
                            'else NHWC)')
    train.add_argument('--deterministic', action='store_true',
                       help='op determinism on and TF32 off (on GPUs from Ampere float32 '
                            'convs and matmuls run in TF32 by default): the same run gives the '
                            'same numbers, N towers equal one device to float32 precision')
    train.add_argument('--xla', action='store_true', default=DEFAULT['xla'],
                       help="XLA auto-clustering of the training step (the Session's "
                            "global_jit_level ON_1, as tf_cnn_benchmarks' --xla): TensorFlow "
                            'compiles clusters of ops into fused kernels; on CPU towers it also '
                            'sets TF_XLA_FLAGS=--tf_xla_cpu_global_jit, without which TensorFlow '
                            'clusters nothing on CPUs (GPU towers: only the GPUs are clustered)')
