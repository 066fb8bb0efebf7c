"""The flags of the cluster commands (`towers server`, `towers launch`) and of train on one.

TensorFlow-free, as parsers.py, which adds them to its parser.
"""
import argparse

from towers.cli.flags import DEFAULT
from towers.cluster.spec import TASK_TYPES
from towers.names import ALL_REDUCE_BUCKET, CLUSTER_MODES


def cluster_train_flags(train):
    """towers train on a cluster: which one, in which mode, with what timeout."""
    cluster_flags(train)
    train.add_argument('--cluster-mode', default=DEFAULT['cluster_mode'],
                       choices=tuple(CLUSTER_MODES),
                       help='with a cluster (TF_CONFIG or --cluster): in-graph, the chief '
                            'builds one graph with towers on every worker task and the '
                            'variables on the ps tasks; collective, every worker its own '
                            'towers and a copy of the variables, gradients all-reduced over '
                            'the workers (default: in-graph)')
    train.add_argument('--all-reduce-bucket', default=DEFAULT['all_reduce_bucket'], metavar='SIZE',
                       help='collective mode: all-reduce the gradients in buckets of about SIZE '
                            '(e.g. 256kB, 4MB; auto: an eighth of them), last layer first, each '
                            'as soon as the backward pass has made it, so that the network '
                            'runs while the first layers still compute; 0: all of them after '
                            'the backward pass (default: %s)' % ALL_REDUCE_BUCKET)
    train.add_argument('--cluster-timeout', type=float, default=DEFAULT['cluster_timeout'],
                       metavar='SECONDS',
                       help='with a cluster: how long a step may wait on another task before '
                            'the run stops, naming it (default: 5 times the step time, at '
                            'least 30 s)')


def cluster_flags(parser):
    """Which cluster and which task, besides TF_CONFIG (towers/cluster/spec.py, slurm.py)."""
    group = parser.add_argument_group('cluster (default: $TF_CONFIG, if set; else a SLURM step '
                                      'of more than one task)')
    group.add_argument('--cluster', default=None, metavar='FILE.json|slurm',
                       help='the cluster: {"worker": ["host:port", ...], "ps": [...]} (a '
                            '"chief" or "master" is worker 0), or slurm: from the variables '
                            'srun sets for each task')
    group.add_argument('--task-type', default=None, choices=list(TASK_TYPES),
                       help='with --cluster FILE.json: which job this task is in (chief and '
                            'master: the chief; evaluator: outside the training cluster)')
    group.add_argument('--task-index', type=int, default=None,
                       help='with --cluster FILE.json: its index in that job (worker 0 is the '
                            'chief; default 0 for chief and evaluator)')
    group.add_argument('--ps-tasks', type=int, default=None, metavar='N',
                       help='in a SLURM step: the first N tasks are ps tasks, the rest workers '
                            '(default: 0)')
    group.add_argument('--port-base', type=int, default=None, metavar='PORT',
                       help="in a SLURM step: the port of each node's first task, the next "
                            'task PORT+1, and so on (default: 8888)')
    group.add_argument('--threads', type=int, default=DEFAULT['threads'],
                       help="intra- and inter-op threads of this task's server (default: "
                            "TensorFlow's choice)")


def server_parser(commands):
    """towers server: serve this task's devices until SIGTERM."""
    server = commands.add_parser('server', help="run this task's TensorFlow server until "
                                                'SIGTERM (a ps task, or a worker the chief '
                                                'places towers on)')
    cluster_flags(server)
    server.add_argument('--towers', type=int, default=1,
                        help='devices this task offers: its virtual CPUs without GPUs '
                             '(default: 1)')
    return server


def launch_parser(commands):
    """towers launch: every task of a cluster on this machine."""
    launch = commands.add_parser('launch', help='start every task of a cluster on this '
                                                'machine: towers launch --workers N -- train ...')
    launch.add_argument('--workers', type=int, required=True, help='worker tasks')
    launch.add_argument('--ps', type=int, default=0, help='parameter-server tasks (default: 0)')
    launch.add_argument('--evaluator', action='store_true',
                        help="also start an evaluator task: it evaluates each of the chief's "
                             'checkpoints as they come (the command needs --logdir); the job '
                             'ends when it has evaluated the last')
    launch.add_argument('--logs', default=None, metavar='DIR',
                        help='one log per task here (default: a new temporary folder)')
    launch.add_argument('--gpus-per-worker', type=int, default=None, metavar='G',
                        help="on a GPU host, each worker's share of its GPUs "
                             '(CUDA_VISIBLE_DEVICES; default: an even split; ps tasks get '
                             'none)')
    launch.add_argument('--grace', type=float, default=10.0,
                        help='seconds between SIGTERM and SIGKILL when the job is torn down '
                             '(default: 10)')
    launch.add_argument('--start', choices=('auto', 'fork', 'spawn'), default='auto',
                        help='how each task starts: fork (this process imports TensorFlow once '
                             'and forks every task from it), spawn (a new Python process each, '
                             'which imports its own), or auto (default: fork on a host without '
                             'GPUs, spawn on one with)')
    launch.add_argument('--emulate-link', default=None, metavar='RATE,DELAY',
                        help='run each task in its own network namespace on a bridge, every '
                             "host's link shaped with tc to RATE each way after DELAY, e.g. "
                             '200Mbit,0 or 1Gbit,1ms, each host on cores of its own where '
                             'there are enough (needs root and iproute2; a DELAY needs netem)')
    launch.add_argument('task_command', nargs=argparse.REMAINDER, metavar='-- COMMAND',
                        help='-- then the towers command every worker runs, e.g. train ...')
    return launch
