"""The flags of the measuring commands: `towers bench`, `plan`, `explain` and `check`.

TensorFlow-free, as parsers.py, which adds them to its parser.
"""
from towers.cli.flags import device_flags, model_flags, precision_flags
from towers.config import TrainConfig
from towers.names import (
    ALL_REDUCE_BUCKET,
    CLUSTER_MODES,
    DATA_FORMATS,
    DEVICE_KINDS,
    INPUT_MODES,
    OPTIMIZERS,
    VARIABLE_UPDATES,
)


def bench_parser(commands):
    """towers bench: images/sec per tower count and input mode."""
    bench = commands.add_parser('bench', help='images/sec per tower count and input mode, on '
                                              'one global batch')
    model_flags(bench)
    bench.add_argument('--towers', default='1,2,4',
                       help='comma-separated tower counts (default: 1,2,4)')
    bench.add_argument('--input', default='synthetic',
                       help='comma-separated input modes to compare: feed, staging, dataset, '
                            'synthetic (default: synthetic)')
    bench.add_argument('--param-device', default='auto',
                       help='as for train (default: auto: the towers\' GPU where they are all '
                            'on one GPU, else /cpu:0)')
    bench.add_argument('--devices', default=None, choices=DEVICE_KINDS,
                       help='the towers\' kind: cpu (virtual CPU devices even where there are '
                            'GPUs) or gpu (default: GPUs where there are any, split into '
                            'logical GPUs for more towers than GPUs)')
    bench.add_argument('--batch-size', type=int, default=128,
                       help='global batch (default: 128)')
    bench.add_argument('--warmup', type=int, default=10, help='untimed steps (default: 10)')
    bench.add_argument('--window', type=int, default=50, help='timed steps (default: 50)')
    bench.add_argument('--trace', default=None, metavar='FILE.json',
                       help="trace one step of the first row after its warm-up (see train's)")
    bench.add_argument('--input-only', action='store_true',
                       help='with --dataset imagenet:DIR: time the training input alone (no '
                            'model), against a bare tf.data pipeline doing the same ops')
    bench.add_argument('--compare', action='store_true',
                       help='towers (each --variable-update and --input) against the textbook '
                            'recipe and Keras MirroredStrategy, with training GFLOP/s')
    bench.add_argument('--variable-update', default='parameter_server,replicated',
                       help='with --compare: comma-separated strategies to time '
                            '(default: parameter_server,replicated)')
    bench.add_argument('--xla', action='store_true',
                       help="XLA auto-clustering of every row's step (compiled), in each "
                            'precision; with --compare, a +xla row per precision')
    bench.add_argument('--optimizer', default=None, choices=OPTIMIZERS,
                       help="the step's optimizer (default: adam, train's, so that a row times "
                            "train's step; sgd as tf_cnn_benchmarks times it); not with "
                            '--compare, whose peers all step with sgd')
    bench.add_argument('--data-format', default=None, choices=DATA_FORMATS,
                       help="the towers' layout, as train's (default: NCHW on GPU towers, NHWC "
                            'on CPUs)')
    bench.add_argument('--deterministic', action='store_true',
                       help="every row with op determinism on and TF32 off, as train's "
                            '--deterministic: what bit-exact runs cost (time it against a '
                            'bench without)')
    bench.add_argument('--plot', default=None, metavar='FILE.png',
                       help='with --compare: draw images/sec against towers (needs matplotlib)')
    precision_flags(bench, several=True)
    cluster = bench.add_argument_group('across processes (towers launch on this machine)')
    cluster.add_argument('--cluster-mode', default=None, choices=tuple(CLUSTER_MODES),
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
    cluster.add_argument('--emulate-link', default=None, metavar='RATE,DELAY',
                         help='with --cluster-mode: run each cluster with every task on a host '
                              'of its own, its link shaped to RATE after DELAY (towers launch '
                              "--emulate-link; root), and hold the step and each task's bytes "
                              'against towers plan')
    cluster.add_argument('--all-reduce-bucket', default=ALL_REDUCE_BUCKET, metavar='SIZE',
                         help="with --cluster-mode collective: train's --all-reduce-bucket "
                              '(default: %s)' % ALL_REDUCE_BUCKET)
    return bench


def plan_parser(commands):
    """towers plan: predicted step time and efficiency over N workers."""
    plan = commands.add_parser('plan', help='predict step time, images/sec and efficiency on N '
                                            'workers from one step timed here and the bytes '
                                            'each cluster mode sends')
    model_flags(plan)
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
    plan.add_argument('--all-reduce-bucket', default=ALL_REDUCE_BUCKET, metavar='SIZE',
                      help="collective mode's all-reduce buckets, overlapped with the backward "
                           "pass, as train's --all-reduce-bucket; 0: after it (default: %s)"
                      % ALL_REDUCE_BUCKET)
    plan.add_argument('--threads', type=int, default=None,
                      help="the step timed here with this many intra- and inter-op threads, "
                           "as each task runs with train's --threads (default: TensorFlow's "
                           'choice; 1 with --verify)')
    plan.add_argument('--warmup', type=int, default=5,
                      help='untimed steps of the step timed here (default: 5)')
    plan.add_argument('--window', type=int, default=20,
                      help='timed steps of the step timed here, and with --verify of each run, '
                           "after train's %d of warm-up (default: 20)" % TrainConfig.warmup_steps)
    plan.add_argument('--verify', action='store_true',
                      help='then run each --cluster-mode at each --workers count here, every '
                           'task on a host of its own on links of --bandwidth and --latency '
                           '(towers launch --emulate-link; root), and print the step and each '
                           "task's bytes, measured against the plan's")
    plan.add_argument('--rounds', type=int, default=2,
                      help='with --verify: runs of each mode and worker count (default: 2)')
    plan.add_argument('--plot', default=None, metavar='FILE.png',
                      help='draw predicted efficiency against workers (needs matplotlib)')
    plan.add_argument('--json', action='store_true',
                      help='print the rows as JSON (with --verify: {"plan": rows, "verify": '
                           'rows})')
    precision_flags(plan)
    return plan


def explain_parser(commands):
    """towers explain: where each part of a step runs."""
    explain = commands.add_parser('explain', help='build the training graph, run one step and '
                                                  'say where each part ran: ops, FLOPs, '
                                                  'variables per device, bytes between them')
    model_flags(explain)
    device_flags(explain)
    explain.add_argument('--batch-size', type=int, default=100,
                         help='global batch (default: 100)')
    explain.add_argument('--variable-update', default='parameter_server',
                         choices=VARIABLE_UPDATES,
                         help='as for train (default: parameter_server)')
    explain.add_argument('--input', default=None,
                         choices=tuple(INPUT_MODES),
                         help='as for train (default: feed; staging and dataset with '
                              '--plan-only)')
    explain.add_argument('--optimizer', default='sgd', choices=OPTIMIZERS,
                         help='its slots are variables too (default: sgd)')
    explain.add_argument('--sync-bn', action='store_true', help='as for train')
    explain.add_argument('--accumulate', type=int, default=1, metavar='K',
                         help="as for train: each tower's K micro-batches in the step explained "
                              '(default: 1)')
    explain.add_argument('--data-format', default=None, choices=DATA_FORMATS,
                         help='as for train (default: NCHW on GPU towers, else NHWC)')
    precision_flags(explain)
    explain.add_argument('--workers', type=int, default=None,
                         help='explain in-graph replication over a cluster of this many worker '
                              'tasks (served by this process on 127.0.0.1), --towers on each')
    explain.add_argument('--ps', type=int, default=0,
                         help='with --workers: ps tasks holding the variables (default: 0, '
                              'the chief holds them)')
    planning = explain.add_argument_group('plan only: build the graph, run nothing')
    planning.add_argument('--plan-only', action='store_true',
                          help='where every op of a step would run, from the graph alone: '
                               'GPUs, clusters and NCCL planned on any machine, a CPU-only '
                               'TensorFlow included')
    planning.add_argument('--gpus-per-worker', type=int, default=0, metavar='G',
                          help='with --plan-only: plan each task (with --workers), or this '
                               'one process, with G GPUs; more towers than G split them into '
                               'logical GPUs (default: 0, virtual CPUs)')
    planning.add_argument('--cluster-mode', default='in-graph', choices=tuple(CLUSTER_MODES),
                          help='with --plan-only --workers: the mode to plan (default: '
                               'in-graph; without --plan-only explain runs in-graph only)')
    explain.add_argument('--json', action='store_true', help='the report as JSON')
    return explain


def check_parser(commands):
    """towers check: N towers against one device."""
    check = commands.add_parser('check', help='N towers against one device on the same batches: '
                                              'the largest gradient and variable differences')
    model_flags(check)
    check.add_argument('--towers', type=int, default=2, help='towers to compare (default: 2)')
    check.add_argument('--devices', default=None, choices=DEVICE_KINDS,
                       help='the towers\' kind: cpu (virtual CPU devices even where there are '
                            'GPUs) or gpu (default: GPUs where there are any, split into '
                            'logical GPUs for more towers than GPUs)')
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
    check.add_argument('--label-smoothing', type=float, default=0.0, metavar='EPS',
                       help="the loss's, as train's (default: 0)")
    check.add_argument('--accumulate', type=int, default=1, metavar='K',
                       help="each tower's slice in K micro-batches one after another, as "
                            "train's (default: 1); with --sync-bn against one device "
                            "accumulating the same micro-batches")
    check.add_argument('--average', default=None, metavar='MODULE:FUNCTION',
                       help='combine the towers\' gradients with your own function, '
                            'f(tower_grads, weights) or the tutorial\'s f(tower_grads), from a '
                            'module or a .py file; a difference names the first gradient off '
                            'and the likely mistake (examples/lab/)')
    check.add_argument('--split', default=None, metavar='MODULE:FUNCTION',
                       help='cut the batch for the towers with your own function, '
                            'f(images, labels, num_towers) -> one towers.slicing.TowerSlice '
                            'per tower; a cut that leaves an example out, counts one twice or '
                            'weighs the towers wrong is named before any step (examples/lab/)')
    precision_flags(check)
    return check
