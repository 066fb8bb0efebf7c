"""A task's TensorFlow gRPC server: its devices, its config, and `towers server`.

Every task of a cluster runs one tf.compat.v1.train.Server. A task that only
serves (a parameter server, or a worker whose towers the chief places in
in-graph mode) runs nothing else: `towers server` starts it and waits, and
SIGTERM or SIGINT ends it cleanly (status 0). The server's ConfigProto says
which devices the task has (its GPUs where it sees any, else virtual CPUs
standing in for them, as in one process) and where collective ops meet (worker
0 leads their groups).
"""
import errno
import signal
import socket
import time

import tensorflow as tf

from towers.cluster.launch import bind_error
from towers.cluster.spec import ClusterError
from towers.devices import (
    device_config,
    logical_gpu_devices,
    parse_device,
    split_for,
    visible_gpus,
)
from towers.errors import op_error_summary

tf1 = tf.compat.v1

GROUP_LEADER = '/job:worker/replica:0/task:0'


def task_towers(towers=None, num_gpus=None):
    """(towers, 'GPU' or 'CPU'): a task's towers on its GPUs where it sees any, else on
    virtual CPUs. towers None: every GPU it sees, or one CPU. More towers than GPUs split
    them into logical GPUs, as in one process (towers/devices.py)."""
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    if not num_gpus:
        return towers or 1, 'CPU'
    return towers or num_gpus, 'GPU'


def task_device_indices(towers, kind, num_gpus):
    """The device indices of a task's towers: 0..towers-1 of its CPUs, or its logical GPUs
    dealt out evenly over its GPUs (towers/devices.py logical_gpu_devices)."""
    if kind == 'CPU':
        return list(range(towers))
    return [parse_device(d)[1] for d in logical_gpu_devices(towers, num_gpus)]


def server_config(cluster, devices_per_task=1, threads=None, timeout_ms=None, num_gpus=None):
    """The ConfigProto of a task's server and sessions.

    Args:
      cluster: the towers.cluster.spec.Cluster.
      devices_per_task: virtual CPU devices this task has (without GPUs).
      threads: intra- and inter-op threads, or None for TensorFlow's choice.
      timeout_ms: operation_timeout_in_ms: an op waiting on a lost task fails
        after this long instead of forever; None for no limit.
      num_gpus: the GPUs the task sees (None asks TensorFlow): with any, they
        are its devices, beside one CPU, and their memory grows as it is used,
        so that several tasks of one host (a ps among them) share its GPUs; more
        devices_per_task than GPUs split them into logical GPUs.
    """
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    config = device_config(1 if num_gpus else max(1, devices_per_task))
    config.gpu_options.allow_growth = bool(num_gpus)
    if split_for(devices_per_task, num_gpus) > 1:
        config.gpu_options.experimental.num_virtual_devices_per_gpu = split_for(
            devices_per_task, num_gpus)
    if threads:
        config.intra_op_parallelism_threads = config.inter_op_parallelism_threads = threads
    if timeout_ms:
        config.operation_timeout_in_ms = int(timeout_ms)
    config.experimental.collective_group_leader = GROUP_LEADER
    # On CPU hosts idle pool threads sleep at once instead of spinning for work: where every
    # core computes, a spinning thread takes a core from the RPC and collective threads that
    # carry the gradients while the backward pass runs (measured: resnet20's overlapped
    # all-reduce step 0.180 -> 0.168 s on two emulated hosts of a core each). GPU hosts keep
    # TensorFlow's spinning, which hands their kernel launches from thread to thread sooner.
    config.experimental.disable_thread_spinning = not num_gpus
    return config


def check_port_free(address):
    """Raise ClusterError when this machine cannot listen on address's port (it is taken)."""
    host, _, port = address.rpartition(':')
    error = bind_error(port, ipv6=host.startswith('['))
    if error is not None and error.errno == errno.EADDRINUSE:
        raise ClusterError('port %s of %s is already taken on this machine: stop what '
                           'holds it, or give this task another port' % (port, address))
    if error is not None:
        raise ClusterError('cannot listen on %s: %s' % (address, error.strerror))


def wait_for_tasks(cluster, timeout, poll=0.2):
    """Wait until every other task of the cluster listens; ClusterError naming those that never do.

    A Session waits forever for a task that is not there, so the tasks are
    asked first, at the TCP level, for at most `timeout` seconds. A host whose
    name does not resolve yet (a pod whose DNS record comes late) is asked
    again like one that does not answer yet; the error tells the two apart.
    """
    waiting = {'%s %d' % (job, i): address for job, addresses in cluster.jobs.items()
               for i, address in enumerate(addresses)
               if (job, i) != (cluster.task_type, cluster.task_index)}
    resolved = set()  # the tasks whose host name resolved at least once
    deadline = time.monotonic() + timeout
    while waiting:
        for name, address in list(waiting.items()):
            host, _, port = address.rpartition(':')
            try:
                socket.create_connection((host.strip('[]'), int(port)), timeout=1).close()
                del waiting[name]
            except socket.gaierror:
                pass
            except OSError:
                resolved.add(name)
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(poll)
    if waiting:
        silent = ['%s (%s)' % (name, a) for name, a in waiting.items() if name in resolved]
        unknown = ['%s (%s)' % (name, a) for name, a in waiting.items() if name not in resolved]
        what = ['%s never answered' % ', '.join(silent)] if silent else []
        what += ['the host of %s never resolved' % ', '.join(unknown)] if unknown else []
        raise ClusterError('%s within %.0f s: start %s (towers server, or towers train with its '
                           'TF_CONFIG), or check the address%s' % (
                               ', and '.join(what), timeout,
                               'them' if len(waiting) > 1 else 'it',
                               'es' if len(waiting) > 1 else ''))


def start_server(cluster, config):
    """Start this task's tf.compat.v1.train.Server; ClusterError if it cannot serve."""
    check_port_free(cluster.address)
    try:
        return tf1.train.Server(tf1.train.ClusterSpec(cluster.as_dict()),
                                job_name=cluster.task_type, task_index=cluster.task_index,
                                config=config, start=True)
    except tf.errors.OpError as e:
        raise ClusterError('cannot start the server of %s %d on %s: %s' % (
            cluster.task_type, cluster.task_index, cluster.address, op_error_summary(e))) \
            from None


def serve(cluster, config, log=print, poll=0.2):
    """Run this task's server until SIGTERM or SIGINT; returns the exit status, 0."""
    stop = []
    previous = {s: signal.signal(s, lambda signum, frame: stop.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        start_server(cluster, config)
        # server_config lets GPU memory grow exactly where the task computes on its GPUs.
        gpus = visible_gpus() if config.gpu_options.allow_growth else 0
        log('serving %s %d on %s (%s); SIGTERM stops it'
            % (cluster.task_type, cluster.task_index, cluster.address,
               '%d GPU(s)' % gpus if gpus else '%d device(s)' % config.device_count['CPU']))
        # server.join() would block in C++, where no Python signal handler runs.
        while not stop:
            time.sleep(poll)
        log('%s: the server of %s %d stops' % (signal.Signals(stop[0]).name,
                                               cluster.task_type, cluster.task_index))
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
