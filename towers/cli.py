"""The `towers` command line: its flags, and the one-line errors.

train, eval, export, devices, bench, models, data convert; what each does is
in commands.py. TensorFlow is imported inside main(), after its C++ log level
is set, so that `towers --help` is instant and a run prints our lines rather
than TF's banner. Errors a user can fix become one line and exit status 1;
--debug shows the traceback instead.
"""
import argparse
import os
import sys

from towers.data import DEFAULT_DATASET  # data/ is numpy-only: --help stays instant

DEFAULT_MODEL = 'mnist_convnet'


def _device_flags(parser):
    group = parser.add_argument_group('devices')
    group.add_argument('--towers', type=int, default=None,
                       help='number of towers (default: every visible GPU, or 1 CPU); '
                            'without GPUs, N virtual CPU devices /cpu:0..N-1')
    group.add_argument('--devices', default=None,
                       help='explicit comma-separated tower devices, e.g. /gpu:0,/gpu:2')
    group.add_argument('--param-device', default='cpu',
                       help="where variables live: 'cpu' (/cpu:0, the classic tutorial), "
                            "'gpu' (the first tower's GPU), 'spread' (over the tower devices, "
                            "by size) or a device name (default: cpu)")


def _model_flags(parser):
    parser.add_argument('--model', default=DEFAULT_MODEL,
                        help='model name (default: %s); see `towers models`' % DEFAULT_MODEL)
    parser.add_argument('--dataset', default=DEFAULT_DATASET,
                        help='dataset name (default: %s, 5,000 real MNIST digits shipped '
                             'with towers), mnist, fashion_mnist, cifar10, or records:DIR '
                             '(shards from `towers data convert`)' % DEFAULT_DATASET)


def build_parser():
    parser = argparse.ArgumentParser(
        prog='towers', description='Graph-mode multi-tower data-parallel training (tf.compat.v1).')
    parser.add_argument('--debug', action='store_true', help='show tracebacks on errors')
    commands = parser.add_subparsers(dest='command', metavar='COMMAND')
    commands.required = True

    train = commands.add_parser('train', help='train a model over the towers, then test it')
    _model_flags(train)
    train.add_argument('--data-dir', default=None,
                       help='folder with the dataset files; default: the first of '
                            '$TOWERS_DATA_DIR/NAME, ~/.cache/towers/NAME, '
                            '/usr/share/datasets/NAME that has them (missing files are '
                            'downloaded)')
    train.add_argument('--validation-size', type=int, default=None,
                       help='training examples held out as validation (default: per dataset)')
    _device_flags(train)
    train.add_argument('--variable-update', default='parameter_server',
                       choices=['parameter_server', 'replicated', 'independent'],
                       help='parameter_server: one copy of the variables (on --param-device); '
                            'replicated: a copy per tower, gradients all-reduced, the same '
                            'update on every copy; independent: no synchronisation, for '
                            'benchmarks only (default: parameter_server)')
    train.add_argument('--sync-bn', action='store_true',
                       help='batch norm over the whole global batch (moments all-reduced over '
                            'the towers) instead of each tower its own slice')
    train.add_argument('--input', default=None,
                       choices=['feed', 'staging', 'dataset', 'synthetic'],
                       help='how batches reach the towers: feed (feed_dict, the reference), '
                            'staging (host queue + per-tower StagingArea), dataset (in-graph '
                            'tf.data), synthetic (random, benchmarks only); default: feed, '
                            'or dataset for records:DIR')
    train.add_argument('--mean', default=None,
                       help='with --input dataset: per-channel means subtracted after /255, '
                            'e.g. 0.4914,0.4822,0.4465 (needs --std)')
    train.add_argument('--std', default=None,
                       help='with --input dataset: per-channel standard deviations to divide by')
    train.add_argument('--num-workers', type=int, default=1,
                       help='with records:DIR: how many workers share the shards (default: 1)')
    train.add_argument('--worker-index', type=int, default=0,
                       help='with records:DIR: which share of the shards this run reads')
    train.add_argument('--skip-bad-shards', action='store_true',
                       help='with records:DIR, skip (and count) shards that fail their '
                            'checksum instead of stopping')
    train.add_argument('--batch-size', type=int, default=100,
                       help='global batch, split over the towers (default: 100)')
    train.add_argument('--epochs', type=float, default=10.0, help='epochs to train (default: 10)')
    train.add_argument('--steps', type=int, default=None, help='train this many steps instead')
    train.add_argument('--optimizer', default='adam', choices=['sgd', 'momentum', 'adam'],
                       help='(default: adam)')
    train.add_argument('--lr', type=float, default=1e-3, help='learning rate (default: 0.001)')
    train.add_argument('--lr-schedule', default='constant',
                       help='constant; piecewise:EPOCH=LR,... (e.g. piecewise:80=0.01,120=0.001); '
                            'exponential:FACTOR,EPOCHS (x FACTOR every EPOCHS epochs, e.g. '
                            'exponential:0.1,350 as the CIFAR-10 tutorial) (default: constant)')
    train.add_argument('--warmup-epochs', type=float, default=0.0,
                       help='ramp the learning rate up linearly over these epochs (default: 0)')
    train.add_argument('--momentum', type=float, default=0.9,
                       help='momentum for --optimizer momentum (default: 0.9)')
    train.add_argument('--weight-decay', type=float, default=0.0,
                       help='L2 weight decay on the weights (not biases), added once to the '
                            'averaged gradients (default: 0)')
    train.add_argument('--clip-norm', type=float, default=None,
                       help='clip the averaged gradients to this global norm')
    train.add_argument('--freeze', default=None, metavar='REGEX',
                       help='do not train the variables whose names match, e.g. "^conv1/"')
    train.add_argument('--ema', type=float, default=None, metavar='DECAY',
                       help='keep a moving average of the weights (e.g. 0.999) and evaluate and '
                            'export it, as the CIFAR-10 tutorial does')
    train.add_argument('--dropout', type=float, default=None,
                       help="dropout rate for models that have dropout (mnist_convnet: 0.5)")
    train.add_argument('--logdir', default=None,
                       help='checkpoint folder; a checkpoint already there is resumed')
    train.add_argument('--log-every', type=int, default=50, help='steps per log line (default: 50)')
    train.add_argument('--checkpoint-every', type=int, default=500,
                       help='steps per checkpoint with --logdir, besides each epoch end and the '
                            'end (default: 500; 0: only those)')
    train.add_argument('--keep-checkpoints', type=int, default=5,
                       help='newest checkpoints to keep (default: 5)')
    train.add_argument('--eval-every', type=int, default=1,
                       help='epochs between evaluations on the validation set (the test set '
                            'when there is none) (default: 1; 0: only the final test)')
    train.add_argument('--best-metric', default='accuracy',
                       help='with --logdir, keep the best checkpoint by this metric in '
                            'LOGDIR/best (default: accuracy; "loss" keeps the lowest)')
    train.add_argument('--no-tensorboard', action='store_true',
                       help='write no TensorBoard events in --logdir')
    train.add_argument('--histograms', action='store_true',
                       help='also write weight histograms to TensorBoard')
    train.add_argument('--trace', default=None, metavar='FILE.json',
                       help='write one step, fully traced, as a Chrome trace (Perfetto, '
                            'chrome://tracing) and print where the time went')
    train.add_argument('--trace-plot', default=None, metavar='FILE.png',
                       help='with --trace: also draw that step as a timeline, a row per device')
    train.add_argument('--trace-step', type=int, default=None,
                       help='the step --trace records (default: the first after warm-up)')
    train.add_argument('--quiet', action='store_true',
                       help='no progress bar: plain log lines, as when not on a terminal')
    train.add_argument('--seed', type=int, default=0, help='random seed (default: 0)')

    devices = commands.add_parser('devices', help='print the devices a run would use')
    _device_flags(devices)

    bench = commands.add_parser('bench', help='images/sec per tower count and input mode, on '
                                              'one global batch')
    _model_flags(bench)
    bench.add_argument('--towers', default='1,2,4',
                       help='comma-separated tower counts (default: 1,2,4)')
    bench.add_argument('--input', default='synthetic',
                       help='comma-separated input modes to compare: feed, staging, dataset, '
                            'synthetic (default: synthetic)')
    bench.add_argument('--param-device', default='cpu', help='as for train (default: cpu)')
    bench.add_argument('--batch-size', type=int, default=128,
                       help='global batch (default: 128)')
    bench.add_argument('--warmup', type=int, default=10, help='untimed steps (default: 10)')
    bench.add_argument('--window', type=int, default=50, help='timed steps (default: 50)')
    bench.add_argument('--trace', default=None, metavar='FILE.json',
                       help="trace one step of the first row after its warm-up (see train's)")
    bench.add_argument('--compare', action='store_true',
                       help='towers (each --variable-update and --input) against the textbook '
                            'recipe and Keras MirroredStrategy, with training GFLOP/s')
    bench.add_argument('--variable-update', default='parameter_server,replicated',
                       help='with --compare: comma-separated strategies to time '
                            '(default: parameter_server,replicated)')
    bench.add_argument('--xla', action='store_true',
                       help='with --compare: also time the first combination under XLA')
    bench.add_argument('--plot', default=None, metavar='FILE.png',
                       help='with --compare: draw images/sec against towers (needs matplotlib)')

    explain = commands.add_parser('explain', help='build the training graph, run one step and '
                                                  'say where each part ran: ops, FLOPs, '
                                                  'variables per device, bytes between them')
    _model_flags(explain)
    _device_flags(explain)
    explain.add_argument('--batch-size', type=int, default=100,
                         help='global batch (default: 100)')
    explain.add_argument('--variable-update', default='parameter_server',
                         choices=['parameter_server', 'replicated', 'independent'],
                         help='as for train (default: parameter_server)')
    explain.add_argument('--input', default=None, choices=['feed', 'synthetic'],
                         help='as for train (default: feed)')
    explain.add_argument('--optimizer', default='sgd', choices=['sgd', 'momentum', 'adam'],
                         help='its slots are variables too (default: sgd)')
    explain.add_argument('--sync-bn', action='store_true', help='as for train')
    explain.add_argument('--json', action='store_true', help='the report as JSON')

    check = commands.add_parser('check', help='N towers against one device on the same batches: '
                                              'the largest gradient and variable differences')
    _model_flags(check)
    check.add_argument('--towers', type=int, default=2, help='towers to compare (default: 2)')
    check.add_argument('--batch-size', type=int, default=100,
                       help='global batch (default: 100; 100 over 3 towers is 34/33/33)')
    check.add_argument('--steps', type=int, default=5, help='SGD steps (default: 5)')
    check.add_argument('--lr', type=float, default=0.01, help='learning rate (default: 0.01)')
    check.add_argument('--tolerance', type=float, default=1e-5,
                       help='largest difference allowed, relative to the largest gradient or '
                            'variable (default: 1e-05)')
    check.add_argument('--sync-bn', action='store_true',
                       help='pool batch-norm moments over the towers (models with batch norm '
                            'differ from one device without it)')

    commands.add_parser('models', help='list the models and datasets')

    evaluate = commands.add_parser('eval', help="test a trained run's checkpoint")
    evaluate.add_argument('--logdir', required=True, help='the folder `towers train` wrote')
    evaluate.add_argument('--checkpoint', default=None,
                          help='a checkpoint prefix (default: the newest in --logdir)')
    evaluate.add_argument('--best', action='store_true',
                          help='use the best checkpoint (LOGDIR/best) instead of the newest')
    evaluate.add_argument('--data-dir', default=None, help='where the dataset is (default: as '
                                                           'trained)')
    evaluate.add_argument('--batch-size', type=int, default=100,
                          help='global evaluation batch (default: 100)')
    _device_flags(evaluate)

    export = commands.add_parser('export', help='write a SavedModel of one tower')
    export.add_argument('--logdir', required=True, help='the folder `towers train` wrote')
    export.add_argument('--checkpoint', default=None,
                        help='a checkpoint prefix (default: the newest in --logdir)')
    export.add_argument('--best', action='store_true',
                        help='export the best checkpoint (LOGDIR/best) instead of the newest')
    export.add_argument('--out', required=True, help='the SavedModel folder to create')

    data_command = commands.add_parser('data', help='dataset tools')
    data_actions = data_command.add_subparsers(dest='action', metavar='ACTION')
    data_actions.required = True
    convert = data_actions.add_parser(
        'convert', help='write a dataset as TFRecord shards + manifest, for --dataset records:DIR')
    convert.add_argument('--dataset', default=DEFAULT_DATASET, help='dataset to convert')
    convert.add_argument('--data-dir', default=None, help='where its files are (as for train)')
    convert.add_argument('--shards', type=int, default=4, help='shards per split (default: 4)')
    convert.add_argument('--out', required=True, help='the records folder to create')
    return parser


def _import_tensorflow_quietly():
    """Import TensorFlow with its import-time C++ log lines dropped.

    TensorFlow 2.21 writes its oneDNN notice through absl before absl logging is
    initialised, where TF_CPP_MIN_LOG_LEVEL cannot reach it; only the file
    descriptor can. A Python error raised by the import still shows: stderr is
    restored before it propagates.
    """
    if 'tensorflow' in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, 'w') as devnull:
            os.dup2(devnull.fileno(), 2)
            import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main(argv=None):
    args = build_parser().parse_args(argv)
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    if getattr(args, 'xla', False) and 'tf_xla_cpu_global_jit' not in os.environ.get(
            'TF_XLA_FLAGS', ''):
        # On a CPU, TensorFlow clusters for XLA only with this flag, read once
        # when TensorFlow starts: it must be set before the import below.
        os.environ['TF_XLA_FLAGS'] = (os.environ.get('TF_XLA_FLAGS', '')
                                      + ' --tf_xla_cpu_global_jit').strip()
    try:
        if not args.debug:
            _import_tensorflow_quietly()
        import tensorflow  # noqa: F401
    except ImportError as e:
        print("towers: error: TensorFlow cannot be imported (%s); install it with "
              "pip install -e '.[cpu]' on a CPU-only machine or '.[gpu]' with GPUs" % e,
              file=sys.stderr)
        return 1
    from towers import data
    from towers import models
    from towers.errors import TowersError, op_error_summary
    if not args.debug:
        # TensorFlow's Python deprecation notices are for us, not for users.
        tensorflow.get_logger().setLevel('ERROR')

    def log(line):
        print(line, flush=True)

    try:
        from towers.commands import COMMANDS
        COMMANDS[args.command](args, log)
    except (TowersError, data.DataError, models.ModelError) as e:
        if args.debug:
            raise
        print('towers: error: %s' % e, file=sys.stderr)
        return 1
    except tensorflow.errors.OpError as e:
        # What only TensorFlow noticed (a disk that fills up, a device that
        # fails): its own message's first line, without the graph dump.
        if args.debug:
            raise
        print('towers: error: TensorFlow %s: %s (--debug shows where)'
              % (type(e).__name__, op_error_summary(e)), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('towers: interrupted', file=sys.stderr)
        return 130
    return 0

