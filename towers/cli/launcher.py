"""`towers launch`: every task of a cluster as a process of this machine.

With --start fork main.py imports TensorFlow once, quietly, and every task is
forked from there: a cluster of N tasks pays for one import instead of N (about
5 s of CPU each on a 2-core EPYC). With --start spawn each task is a new Python
process that imports its own, and the launcher never loads it. --start auto (the
default) forks on a host without GPUs and spawns on one with (forks_tasks).
"""
import argparse

from towers.cluster import emulate, launch
from towers.cluster.spec import ClusterError
from towers.names import CLUSTER_MODES


def forks_tasks(start, gpus=None):
    """Whether --start forks the tasks: fork, or auto on a host without GPUs (gpus: the
    host's GPU ids; None: launch.host_gpus()). On a GPU host auto spawns them: each fork of a
    process that imported TensorFlow starts CUDA itself, which is by the book (CUDA is not
    started by the import), but has not been run on a GPU here yet (.ci/gpu-checks.sh's
    gpu-tests step runs it)."""
    if start == 'auto':
        return not (launch.host_gpus() if gpus is None else gpus)
    return start == 'fork'


def run_launch(args, log, fork=None):
    """towers launch: every task of a cluster as a process of this machine.

    fork: main.py's main where this process imported TensorFlow to fork the tasks from
    (launch.launch's fork), else None."""
    command = args.task_command
    command = command[1:] if command[:1] == ['--'] else command
    if not command:
        raise ClusterError('towers launch needs the command every worker runs: towers launch '
                           '--workers 2 -- train ...')
    if args.workers < 1 or args.ps < 0:
        raise ClusterError('towers launch needs {workers} of at least 1 and {ps} of 0 or more')
    mode = CLUSTER_MODES[_train_flags(command).cluster_mode or 'in-graph']
    tasks = [('worker', i, launch.towers_command(*command),
              mode.one_graph and i > 0 and command[0] == 'train')
             for i in range(args.workers)]
    tasks += [('ps', i, launch.towers_command('server', *_server_flags(command)), True)
              for i in range(args.ps)]
    if args.evaluator:
        if command[0] != 'train' or '--logdir' not in command:
            raise ClusterError('{evaluator} evaluates the checkpoints of a train command with '
                               '--logdir: towers launch --evaluator --workers N -- train '
                               '--logdir DIR ...')
        tasks.append(('evaluator', 0, launch.towers_command(*command), False))
    if args.emulate_link is None:
        jobs = launch.local_cluster(args.workers, args.ps)
        return launch.launch(tasks, jobs, logs=args.logs, grace=args.grace, log=log,
                             gpus_per_worker=args.gpus_per_worker, fork=fork)
    rate, delay = emulate.parse_link(args.emulate_link)
    # The evaluator only reads the logdir: it stays outside the emulated network.
    hosted = [task for task in tasks if task[0] != 'evaluator']
    with emulate.EmulatedHosts(len(hosted), rate, delay) as hosts:
        log('towers launch: %d hosts on bridge %s, each link %s each way after %s, %s'
            % (len(hosted), hosts.bridge, args.emulate_link.split(',')[0],
               (args.emulate_link.split(',') + ['0'])[1], hosts.cores_text()))
        addresses = ['%s:%d' % (a, emulate.PORT) for a in hosts.addresses]
        jobs = {'worker': addresses[:args.workers]}
        if args.ps:
            jobs['ps'] = addresses[args.workers:]
        tasks = [task if task[0] == 'evaluator' else task + (hosts.host(i),)
                 for i, task in enumerate(tasks)]
        meter = emulate.LinkMeter(hosts, ['%s %d' % task[:2] for task in hosted])

        def observed(line):
            meter.observe(line)
            log(line)
        status = launch.launch(tasks, jobs, logs=args.logs, grace=args.grace, log=observed,
                               gpus_per_worker=args.gpus_per_worker, fork=fork)
        for line in meter.lines():
            log(line)
        return status


def _train_flags(command):
    """The few train flags the launcher reads: the mode, and what the servers need."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--cluster-mode', default=None)
    parser.add_argument('--threads', default=None)
    return parser.parse_known_args(command[1:])[0]


def _server_flags(command):
    threads = _train_flags(command).threads
    return ['--threads', threads] if threads else []
