"""The names a run is configured by, in one TensorFlow-free module.

The command line offers them as choices before TensorFlow is imported
(`towers --help` stays instant); the library checks settings against the same
tuples, so a name is spelled once. As tf_cnn_benchmarks keeps its flag values
apart from the graph code.
"""
import typing

# --variable-update: where the variables live and how the towers' gradients meet
# (towers/variables.py).
VARIABLE_UPDATES = ('parameter_server', 'replicated', 'independent')


class InputMode(typing.NamedTuple):
    """An --input mode, and what the settings, the commands and the Trainer ask of it before
    its InputSource (towers/inputs/, the class of the same name) is built."""
    name: str
    # Its batches come from a tf.data pipeline: it normalises (--mean/--std), streams a split
    # on disk, runs on a tf.data service; its order is tf.data's, not the sampler's.
    tf_data: bool = False
    # A loader fills a StagingArea per tower ahead of the step.
    stages: bool = False
    # It reads the dataset's images (synthetic makes random ones: nothing to augment or load).
    has_images: bool = True

    @property
    def runs_ahead(self):
        """A loader or a pipeline makes batches ahead of the step (not for one step alone)."""
        return self.stages or self.tf_data


# --input: how each step's batch reaches the towers (towers/inputs/): name -> InputMode.
INPUT_MODES = {mode.name: mode for mode in (
    InputMode('feed'),
    InputMode('staging', stages=True),
    InputMode('dataset', tf_data=True),
    InputMode('synthetic', has_images=False))}

# --optimizer (towers/model.py make_optimizer).
OPTIMIZERS = ('sgd', 'momentum', 'adam', 'lars')

# --lr-schedule kinds (towers/schedules.py).
SCHEDULES = ('constant', 'piecewise', 'exponential', 'cosine', 'poly')

# --augment: how training images are varied (towers/data/augment.py); evaluation always takes
# the centre view.
AUGMENTATIONS = ('inception', 'pad-crop-flip', 'center')

# --decay-on: which trainable variables weight decay pulls toward 0 (towers/processors.py):
# the conv and dense kernels alone, everything but batch norm's beta and gamma (as
# tf_cnn_benchmarks), or every trainable variable.
DECAY_ON = ('weights', 'not-norms', 'all')

# --devices may name a kind instead of devices: the towers on that kind (towers/devices.py).
DEVICE_KINDS = ('cpu', 'gpu')

# --param-device spread: the variables over the tower devices (towers/devices.py).
SPREAD = 'spread'


class ClusterMode(typing.NamedTuple):
    """A --cluster-mode, and what the TensorFlow-free command line, the launcher and the
    planning tools ask of it (its Run is the class of towers/cluster/modes.py of that name)."""
    name: str
    # The chief builds one graph over every task and runs it; the other tasks only serve.
    one_graph: bool = False
    # Each worker keeps a copy of the variables and the workers all-reduce their gradients
    # (in buckets: --all-reduce-bucket); it has no ps tasks.
    copy_per_worker: bool = False
    # The variables live on ps tasks: it cannot train without one.
    needs_ps: bool = False


# --cluster-mode: how a cluster's tasks train together (towers/cluster/): name -> ClusterMode.
CLUSTER_MODES = {mode.name: mode for mode in (
    ClusterMode('in-graph', one_graph=True),
    ClusterMode('collective', copy_per_worker=True),
    ClusterMode('parameter-server', needs_ps=True))}

# --data-service-mode: how a tf.data service's workers share out a trainer's pipeline
# (towers/inputs/dataservice.py).
DATA_SERVICE_MODES = ('parallel_epochs', 'distributed_epoch')

# --precision: what the towers compute in (towers/precision.py); the variables stay float32.
PRECISIONS = ('fp32', 'bf16', 'fp16')

# --data-format: the layout of the towers' maps (towers/models/layout.py).
DATA_FORMATS = ('NHWC', 'NCHW')

# The TF_XLA_FLAGS flag without which TensorFlow's XLA auto-clustering (train --xla, bench
# --xla) leaves CPU devices alone; read when TensorFlow first needs it, in its first Session.
XLA_CPU_FLAG = '--tf_xla_cpu_global_jit'

DEFAULT_MODEL = 'mnist_convnet'

# The --dataset kinds that are folders of shards streamed from disk (DIR after the colon):
# `towers train` streams them, and the tf.data service's workers can read them too.
FOLDERS = ('records:', 'imagenet:', 'tfds:')

# What a training logdir holds (towers/checkpoints.py).
CHECKPOINT_NAME = 'model.ckpt'
RUN_FILE = 'run.json'
BEST_DIR = 'best'
BEST_FILE = 'best.json'
STATS_FILE = 'stats.jsonl'
LOCK_FILE = '.towers.lock'

# collective mode's all-reduce buckets, overlapped with the backward pass (train and plan
# --all-reduce-bucket): 'auto' cuts the gradients into about AUTO_BUCKETS buckets. Measured
# and planned (README, `towers plan`): resnet20 over two workers gains as much with 8
# buckets as with 16; ResNet-50 at 64 workers, where each bucket pays 2(N-1) latencies,
# plans 97% with 8 buckets against 49% with 256 kB ones (342 buckets).
ALL_REDUCE_BUCKET = 'auto'
AUTO_BUCKETS = 8
