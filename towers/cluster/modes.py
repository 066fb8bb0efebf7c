"""A task's ClusterRun for each --cluster-mode: where its graph goes, and with what strategy.

  in_graph          the chief's: towers on every worker task, variables on the ps tasks
  collective        a worker's: its own towers and copy, the workers' all-reduce
  parameter_server  a worker's: replica_device_setter, SyncReplicasOptimizer
"""
import os

from towers.cluster.collective import AcrossWorkers, Collectives, bucket_bytes
from towers.cluster.launch import SHARED_GPUS
from towers.cluster.placement import in_graph_plan
from towers.cluster.runtime import FIRST_STEPS_S, ClusterRun
from towers.cluster.server import server_config, task_device_indices, task_towers
from towers.cluster.spec import ClusterError
from towers.cluster.syncreplicas import SyncReplicas, ps_device_setter
from towers.deviceplan import DevicePlan
from towers.devices import visible_gpus

UPDATE_WAIT_S = 3600.0


def in_graph(cluster, towers_per_task=None, timeout=None, threads=None, num_gpus=None):
    """The chief's ClusterRun of in-graph replication over the whole cluster.

    towers_per_task: towers on each worker task (None: every GPU the chief sees,
    or one CPU); num_gpus: the GPUs each task has (None: as many as the chief
    sees; every task is started with as many, which the session checks).
    """
    if not cluster.is_chief:
        raise ClusterError('in-graph mode trains on the chief (worker 0) only; %s %d '
                           'serves: run `towers server` there' % (cluster.task_type,
                                                                  cluster.task_index))
    # The session's own timeout is a backstop for every run (init, evaluation).
    plan = in_graph_plan(cluster, towers_per_task, timeout=timeout or FIRST_STEPS_S,
                         threads=threads, num_gpus=num_gpus)
    return ClusterRun('in-graph', cluster, plan, timeout)


def collective(cluster, towers_per_task=None, timeout=None, threads=None, num_gpus=None,
               bucket='0'):
    """A worker's ClusterRun of collective training: its own towers, the workers' all-reduce.

    On GPUs the worker's copy of the variables sits on its first GPU and the
    gradients are all-reduced there (NCCL, unless the launcher says that workers share a
    GPU: SHARED_GPUS); on CPUs, on its CPU. bucket: --all-reduce-bucket, the all-reduce's
    buckets, overlapped with the backward pass ('0': one pass after it).
    """
    if cluster.task_type != 'worker':
        raise ClusterError('collective mode has no ps tasks: every task is a worker')
    task, tower_devices, num_gpus = _own_towers(cluster, towers_per_task, num_gpus)
    config = server_config(cluster, len(tower_devices), threads,
                           timeout_ms=1000 * (timeout or FIRST_STEPS_S), num_gpus=num_gpus)
    config.device_filters.append('/job:worker')  # its own towers, and the others' pings
    if bucket_bytes(bucket, []) and threads:
        # A thread of its own for the buckets' all-reduces: with every inter-op thread busy
        # on the backward pass, a bucket ready early would wait for its end.
        config.inter_op_parallelism_threads = threads + 1
    host = task + '/device:CPU:0'
    plan = DevicePlan(tower_devices, variables=task + '/device:GPU:0' if num_gpus else host,
                      host=host, default_device=host, variable_update='collective',
                      config=config)
    # NCCL cannot all-reduce between two processes on one GPU: the ring can.
    collectives = Collectives(cluster.num_workers, timeout or FIRST_STEPS_S,
                              nccl=os.environ.get(SHARED_GPUS) != '1')
    strategy = AcrossWorkers(plan, collectives, cluster.is_chief, bucket)
    return ClusterRun('collective', cluster, plan, timeout, strategy,
                      share=(cluster.task_index, cluster.num_workers))


def parameter_server(cluster, towers_per_task=None, timeout=None, threads=None, num_gpus=None):
    """A worker's ClusterRun of the classic recipe: replica_device_setter, SyncReplicas."""
    if cluster.task_type != 'worker':
        raise ClusterError('in parameter-server mode the ps tasks serve: run `towers server` '
                           'there')
    if not cluster.num_ps:
        raise ClusterError('{cluster_mode} parameter-server needs ps tasks: give the cluster '
                           'a "ps" job (towers launch --ps 1)')
    task, tower_devices, num_gpus = _own_towers(cluster, towers_per_task, num_gpus)
    # The chief's queue runner waits for every worker's gradient as long as the chief
    # evaluates or saves: a backstop of an hour, not the step's timeout (each step has
    # its own, and a stalled update then fails the steps waiting for it).
    config = server_config(cluster, len(tower_devices), threads,
                           timeout_ms=1000 * max(timeout or FIRST_STEPS_S, UPDATE_WAIT_S),
                           num_gpus=num_gpus)
    # The ps tasks and the workers (whose pings name a lost one); never another job.
    config.device_filters.extend(['/job:ps', '/job:worker'])
    # The variables go where the ps tasks' device setter puts them, as in the classic recipe.
    # Each tower reads the variables through the worker's CPU: one copy of each off the
    # network a step, whatever the tower count.
    plan = DevicePlan(tower_devices, variables=None,
                      default_device=ps_device_setter(cluster, cluster.task_index),
                      read_cache=task + '/device:CPU:0',
                      variable_update='parameter-server', config=config)
    strategy = SyncReplicas(plan, cluster.num_workers, cluster.is_chief)
    return ClusterRun('parameter-server', cluster, plan, timeout, strategy,
                      share=(cluster.task_index, cluster.num_workers))


def _own_towers(cluster, towers_per_task, num_gpus=None):
    """(this worker's task, its tower devices, its GPUs): a between-graph worker's towers,
    on its own GPUs where it sees any, else on its virtual CPUs."""
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    count, kind = task_towers(towers_per_task, num_gpus)
    task = '/job:worker/task:%d' % cluster.task_index
    return task, ['%s/device:%s:%d' % (task, kind, i)
                  for i in task_device_indices(count, kind, num_gpus)], num_gpus
