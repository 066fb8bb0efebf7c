"""The names a run is configured by, in one TensorFlow-free module.

The command line offers them as choices before TensorFlow is imported
(`towers --help` stays instant); the library checks settings against the same
tuples, so a name is spelled once. As tf_cnn_benchmarks keeps its flag values
apart from the graph code.
"""

# --variable-update: where the variables live and how the towers' gradients meet
# (towers/variables.py).
VARIABLE_UPDATES = ('parameter_server', 'replicated', 'independent')

# --input: how each step's batch reaches the towers (towers/inputs/).
INPUT_MODES = ('feed', 'staging', 'dataset', 'synthetic')

# --optimizer (towers/model.py make_optimizer).
OPTIMIZERS = ('sgd', 'momentum', 'adam')

# --lr-schedule kinds (towers/schedules.py).
SCHEDULES = ('constant', 'piecewise', 'exponential')

# --param-device spread: the variables over the tower devices (towers/devices.py).
SPREAD = 'spread'

# --cluster-mode: how a cluster's tasks train together (towers/cluster/).
CLUSTER_MODES = ('in-graph', 'collective', 'parameter-server')

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
