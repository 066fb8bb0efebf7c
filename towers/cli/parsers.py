"""The flags of every `towers` command: one function per command's parser.

TensorFlow-free, so that `towers --help` is instant: the choices come from
towers/names.py, and towers.data is numpy-only. What each command does is in
commands.py, train.py, saved.py and cluster.py; the flags become a TrainConfig in
config.py; cluster_flags.py has the cluster commands' flags.
"""
import argparse

from towers.cli.cluster_flags import cluster_train_flags, launch_parser, server_parser
from towers.data import DEFAULT_DATASET
from towers.names import (
    CLUSTER_MODES,
    DEFAULT_MODEL,
    INPUT_MODES,
    OPTIMIZERS,
    PRECISIONS,
    VARIABLE_UPDATES,
)


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


def _precision_flags(parser, several=False):
    group = parser.add_argument_group('precision')
    if several:
        group.add_argument('--precision', default='fp32',
                           help='comma-separated precisions to time, each against the first: '
                                '%s (default: fp32)' % ', '.join(PRECISIONS))
    else:
        group.add_argument('--precision', default='fp32', choices=PRECISIONS,
                           help='what the towers compute in: fp32, or bf16 / fp16 over float32 '
                                'variables (the loss, softmax, batch-norm statistics and '
                                'gradients stay float32) (default: fp32)')
    group.add_argument('--loss-scale', default=None, metavar='S',
                       help='fp16 only: a fixed loss scale S (a power of two), or "dynamic" '
                            '(the default for fp16: from 32768, halved and the step skipped '
                            'when a gradient overflows, doubled after 2000 finite steps)')


def build_parser():
    """The `towers` argument parser: global flags, then a subparser per command."""
    parser = argparse.ArgumentParser(
        prog='towers', description='Graph-mode multi-tower data-parallel training (tf.compat.v1).')
    parser.add_argument('--debug', action='store_true', help='show tracebacks on errors')
    commands = parser.add_subparsers(dest='command', metavar='COMMAND')
    commands.required = True
    for add in (train_parser, devices_parser, bench_parser, explain_parser, check_parser,
                models_parser, eval_parser, export_parser, data_parser, server_parser,
                launch_parser, plan_parser):
        add(commands)
    return parser


def train_parser(commands):
    """towers train: what to train, on which devices, how, and what to keep."""
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
    _train_strategy_flags(train)
    _train_optimizer_flags(train)
    _train_run_flags(train)
    _precision_flags(train)
    cluster_train_flags(train)
    return train


def _train_strategy_flags(train):
    """Variable strategy, batch norm and input flags."""
    train.add_argument('--variable-update', default='parameter_server', choices=VARIABLE_UPDATES,
                       help='parameter_server: one copy of the variables (on --param-device); '
                            'replicated: a copy per tower, gradients all-reduced, the same '
                            'update on every copy; independent: no synchronisation, for '
                            'benchmarks only (default: parameter_server)')
    train.add_argument('--sync-bn', action='store_true',
                       help='batch norm over the whole global batch (moments all-reduced over '
                            'the towers) instead of each tower its own slice')
    train.add_argument('--input', default=None, choices=INPUT_MODES,
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


def _train_optimizer_flags(train):
    """The batch, the length and the optimisation."""
    train.add_argument('--batch-size', type=int, default=100,
                       help='global batch, split over the towers (default: 100)')
    train.add_argument('--epochs', type=float, default=10.0, help='epochs to train (default: 10)')
    train.add_argument('--steps', type=int, default=None, help='train this many steps instead')
    train.add_argument('--optimizer', default='adam', choices=OPTIMIZERS,
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


def _train_run_flags(train):
    """What the run keeps and says: logdir, checkpoints, evaluation, logs."""
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


def devices_parser(commands):
    """towers devices: the devices a run would use."""
    devices = commands.add_parser('devices', help='print the devices a run would use')
    _device_flags(devices)
    return devices


def bench_parser(commands):
    """towers bench: images/sec per tower count and input mode."""
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
    _precision_flags(bench, several=True)
    cluster = bench.add_argument_group('across processes (towers launch on this machine)')
    cluster.add_argument('--cluster-mode', default=None, choices=CLUSTER_MODES,
                         help='time clusters of --workers local processes in this mode, each '
                              'against one process with the same towers (--towers per task)')
    cluster.add_argument('--workers', default='1,2',
                         help='with --cluster-mode: comma-separated worker counts (default: 1,2)')
    cluster.add_argument('--ps', type=int, default=None,
                         help='with --cluster-mode: ps tasks (default: 1 for parameter-server, '
                              'else 0)')
    cluster.add_argument('--rounds', type=int, default=3,
                         help='with --cluster-mode: runs of every configuration, in turns '
                              '(default: 3)')
    cluster.add_argument('--threads', type=int, default=None,
                         help="with --cluster-mode: each run's intra- and inter-op threads")
    return bench


def plan_parser(commands):
    """towers plan: predicted step time and efficiency over N workers."""
    plan = commands.add_parser('plan', help='predict step time, images/sec and efficiency on N '
                                            'workers from one step timed here and the bytes '
                                            'each cluster mode sends')
    _model_flags(plan)
    plan.add_argument('--workers', default='1,2,4,8,16,32,64',
                      help='comma-separated worker counts (default: 1,2,4,8,16,32,64)')
    plan.add_argument('--devices-per-worker', type=int, default=1, metavar='G',
                      help='towers (devices) per worker (default: 1)')
    plan.add_argument('--batch-size', type=int, default=128,
                      help="each worker's batch: the global batch is N times it, as the "
                           "anchors scale (default: 128)")
    plan.add_argument('--cluster-mode', default='collective,parameter-server',
                      help='comma-separated modes: in-graph, collective, parameter-server '
                           '(default: collective,parameter-server)')
    plan.add_argument('--ps', default='1',
                      help='ps tasks (parameter-server, in-graph): a count, or "workers" for '
                           'one per worker as tf_cnn_benchmarks runs them (default: 1)')
    plan.add_argument('--bandwidth', default='25Gbit',
                      help="each host's link, each way: e.g. 10Gbit, 25Gbit, 100Mbit, 1GB "
                           '(default: 25Gbit)')
    plan.add_argument('--latency', default='10us',
                      help='one-way latency of a link: e.g. 10us, 1ms, 0 (default: 10us)')
    plan.add_argument('--device-flops', default=None, metavar='X',
                      help="the target device's sustained FLOP/s (e.g. 4.5T): the compute is "
                           "one tower's FLOPs over it instead of a step timed here")
    plan.add_argument('--step-seconds', type=float, default=None, metavar='T',
                      help="one worker's step measured elsewhere (e.g. from a published "
                           'single-device images/sec): the compute, instead of timing one here')
    plan.add_argument('--gradient-bytes', default=None, metavar='S',
                      help="a model's gradient bytes when it is not one of towers' models "
                           "(e.g. 102.2MB, ResNet-50's 25.6M float32 parameters), spread "
                           'evenly over the ps tasks; goes with --step-seconds')
    plan.add_argument('--warmup', type=int, default=5,
                      help='untimed steps of the step timed here (default: 5)')
    plan.add_argument('--window', type=int, default=20,
                      help='timed steps of the step timed here (default: 20)')
    plan.add_argument('--plot', default=None, metavar='FILE.png',
                      help='draw predicted efficiency against workers (needs matplotlib)')
    plan.add_argument('--json', action='store_true', help='print the rows as JSON')
    _precision_flags(plan)
    return plan


def explain_parser(commands):
    """towers explain: where each part of a step runs."""
    explain = commands.add_parser('explain', help='build the training graph, run one step and '
                                                  'say where each part ran: ops, FLOPs, '
                                                  'variables per device, bytes between them')
    _model_flags(explain)
    _device_flags(explain)
    explain.add_argument('--batch-size', type=int, default=100,
                         help='global batch (default: 100)')
    explain.add_argument('--variable-update', default='parameter_server',
                         choices=VARIABLE_UPDATES,
                         help='as for train (default: parameter_server)')
    explain.add_argument('--input', default=None, choices=['feed', 'synthetic'],
                         help='as for train (default: feed)')
    explain.add_argument('--optimizer', default='sgd', choices=OPTIMIZERS,
                         help='its slots are variables too (default: sgd)')
    explain.add_argument('--sync-bn', action='store_true', help='as for train')
    _precision_flags(explain)
    explain.add_argument('--workers', type=int, default=None,
                         help='explain in-graph replication over a cluster of this many worker '
                              'tasks (served by this process on 127.0.0.1), --towers on each')
    explain.add_argument('--ps', type=int, default=0,
                         help='with --workers: ps tasks holding the variables (default: 0, '
                              'the chief holds them)')
    explain.add_argument('--json', action='store_true', help='the report as JSON')
    return explain


def check_parser(commands):
    """towers check: N towers against one device."""
    check = commands.add_parser('check', help='N towers against one device on the same batches: '
                                              'the largest gradient and variable differences')
    _model_flags(check)
    check.add_argument('--towers', type=int, default=2, help='towers to compare (default: 2)')
    check.add_argument('--batch-size', type=int, default=100,
                       help='global batch (default: 100; 100 over 3 towers is 34/33/33)')
    check.add_argument('--steps', type=int, default=5, help='SGD steps (default: 5)')
    check.add_argument('--lr', type=float, default=0.001, help='learning rate (default: 0.001)')
    check.add_argument('--tolerance', type=float, default=None,
                       help='largest difference allowed, relative to the largest gradient or '
                            'variable (default: 1e-05 in fp32, 0.125 in bf16, 0.0156 in fp16: '
                            '32 roundings of its mantissa)')
    check.add_argument('--sync-bn', action='store_true',
                       help='pool batch-norm moments over the towers (models with batch norm '
                            'differ from one device without it)')
    _precision_flags(check)
    return check


def models_parser(commands):
    """towers models: the model and dataset names."""
    return commands.add_parser('models', help='list the models and datasets')


def _saved_run_flags(parser, verb):
    """Which trained run, and which of its checkpoints (eval and export)."""
    parser.add_argument('--logdir', required=True, help='the folder `towers train` wrote')
    parser.add_argument('--checkpoint', default=None,
                        help='a checkpoint prefix (default: the newest in --logdir)')
    parser.add_argument('--best', action='store_true',
                        help='%s the best checkpoint (LOGDIR/best) instead of the newest' % verb)


def eval_parser(commands):
    """towers eval: a trained run's checkpoint on the test set."""
    evaluate = commands.add_parser('eval', help="test a trained run's checkpoint")
    _saved_run_flags(evaluate, 'use')
    evaluate.add_argument('--data-dir', default=None, help='where the dataset is (default: as '
                                                           'trained)')
    evaluate.add_argument('--batch-size', type=int, default=100,
                          help='global evaluation batch (default: 100)')
    evaluate.add_argument('--precision', default=None, choices=PRECISIONS,
                          help='compute in this precision (default: the one it trained in; '
                               'its weights are float32 whatever it was)')
    _device_flags(evaluate)
    return evaluate


def export_parser(commands):
    """towers export: a SavedModel of one tower."""
    export = commands.add_parser('export', help='write a SavedModel of one tower')
    _saved_run_flags(export, 'export')
    export.add_argument('--out', required=True, help='the SavedModel folder to create')
    return export


def data_parser(commands):
    """towers data convert: a dataset as TFRecord shards."""
    data_command = commands.add_parser('data', help='dataset tools')
    data_actions = data_command.add_subparsers(dest='action', metavar='ACTION')
    data_actions.required = True
    convert = data_actions.add_parser(
        'convert', help='write a dataset as TFRecord shards + manifest, for --dataset records:DIR')
    convert.add_argument('--dataset', default=DEFAULT_DATASET, help='dataset to convert')
    convert.add_argument('--data-dir', default=None, help='where its files are (as for train)')
    convert.add_argument('--shards', type=int, default=4, help='shards per split (default: 4)')
    convert.add_argument('--out', required=True, help='the records folder to create')
    return data_command
