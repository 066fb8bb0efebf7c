"""The device plan of a task in a cluster, and the Session target that runs it.

The same DevicePlan as one process (towers/deviceplan.py), with fully
qualified devices. For in-graph replication (the chief builds one graph for
the whole cluster) that is:

  towers     T per worker task, /job:worker/task:k/device:CPU:i (or GPU:i)
  variables  spread by bytes over the ps tasks, or on the chief's CPU
  host ops   the chief, /job:worker/task:0 completes every device without a job
  session    grpc://<the chief's address>, filtered to the cluster's jobs, and
             with an operation timeout so that a lost task fails the step
             instead of hanging it

A between-graph worker (collective, parameter-server) plans only its own
towers: towers/cluster/modes.py.
"""
from towers.cluster.server import server_config, task_device_indices, task_towers
from towers.deviceplan import make_plan
from towers.devices import visible_gpus


def cluster_tower_devices(cluster, towers_per_task, kind='CPU', num_gpus=0):
    """T devices on each worker task, worker-major: tower k*T + i is task k's i-th device
    (task_device_indices: its logical GPUs where T exceeds its num_gpus GPUs)."""
    return ['/job:worker/task:%d/device:%s:%d' % (task, kind, i)
            for task in range(cluster.num_workers)
            for i in task_device_indices(towers_per_task, kind, num_gpus)]


def in_graph_plan(cluster, towers_per_task=None, timeout=None, threads=None, num_gpus=None):
    """The chief's plan for in-graph replication over the whole cluster.

    Args:
      cluster: the towers.cluster.spec.Cluster (this task must be the chief).
      towers_per_task: towers on each worker task: its GPUs where the chief sees
        any (None: all of them), else its virtual CPUs (None: one).
      timeout: seconds after which an op waiting on another task fails.
      num_gpus: the GPUs of each task; None: as many as this task sees (the
        workers are alike; a session on a task without them says so).
    """
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    towers_per_task, kind = task_towers(towers_per_task, num_gpus)
    tower_devices = cluster_tower_devices(cluster, towers_per_task, kind, num_gpus)
    ps = ['/job:ps/task:%d/device:CPU:0' % i for i in range(cluster.num_ps)]
    param = (ps if len(ps) > 1 else ps[0]) if ps else '/job:worker/task:0/device:CPU:0'
    config = server_config(cluster, towers_per_task, threads,
                           timeout_ms=timeout and 1000 * timeout, num_gpus=num_gpus)
    # Only the cluster's own jobs: a session never waits on a task it does not use.
    config.device_filters.extend('/job:%s' % job for job in cluster.jobs)
    # The chief's CPU completes every device without a job, and takes the ops no scope
    # places (the placer would take a GPU on a GPU host).
    return make_plan(tower_devices, param, default_device='/job:worker/task:0/device:CPU:0',
                     config=config)
