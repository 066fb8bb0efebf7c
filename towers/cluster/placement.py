"""Where a run's towers, variables and host ops go, and the Session target that runs them.

In one process: towers on /gpu:i or virtual /cpu:i, the variables on
--param-device, host ops on /cpu:0, an in-process Session. In a cluster the
same graph is built with fully qualified devices. For in-graph replication
(the chief builds one graph for the whole cluster) that is:

  towers     T per worker task, /job:worker/task:k/device:CPU:i (or GPU:i)
  variables  spread by bytes over the ps tasks, or on the chief's CPU
  host ops   the chief, /job:worker/task:0 completes every device without a job
  session    grpc://<the chief's address>, filtered to the cluster's jobs, and
             with an operation timeout so that a lost task fails the step
             instead of hanging it
"""
import collections

import tensorflow as tf

from towers.cluster.server import server_config
from towers.devices import resolve_devices, resolve_param_device, session_config

tf1 = tf.compat.v1

Placement = collections.namedtuple(
    'Placement', ['tower_devices', 'param_device', 'default_device', 'config'])
Placement.__doc__ = """Everything a Trainer needs to know about where its graph runs.

  tower_devices: one device per tower.
  param_device: a device, 'spread', or a list of devices to spread the
    variables over by bytes (the ps tasks).
  default_device: what completes every device of the graph (the chief's
    task in a cluster), or None.
  config: the Session's ConfigProto (its target is this task's server in a
    cluster: towers/cluster/runtime.py).
"""


def local_placement(towers=None, param_device=None):
    """The towers and variables of one process (towers: a count, device names, or None)."""
    tower_devices = (list(towers) if isinstance(towers, (list, tuple))
                     else resolve_devices(towers))
    param = resolve_param_device(param_device, tower_devices)
    return Placement(tower_devices, param, None, session_config(tower_devices, param))


def cluster_tower_devices(cluster, towers_per_task, kind='CPU'):
    """T devices on each worker task, worker-major: tower k*T + i is task k's device i."""
    return ['/job:worker/task:%d/device:%s:%d' % (task, kind, i)
            for task in range(cluster.num_workers) for i in range(towers_per_task)]


def in_graph_placement(cluster, towers_per_task=1, timeout=None, threads=None):
    """The chief's placement for in-graph replication over the whole cluster.

    Args:
      cluster: the towers.cluster.spec.Cluster (this task must be the chief).
      towers_per_task: towers on each worker task (its virtual CPUs without GPUs).
      timeout: seconds after which an op waiting on another task fails.
    """
    tower_devices = cluster_tower_devices(cluster, towers_per_task)
    ps = ['/job:ps/task:%d/device:CPU:0' % i for i in range(cluster.num_ps)]
    param = (ps if len(ps) > 1 else ps[0]) if ps else '/job:worker/task:0/device:CPU:0'
    config = server_config(cluster, towers_per_task, threads,
                           timeout_ms=timeout and 1000 * timeout)
    # Only the cluster's own jobs: a session never waits on a task it does not use.
    config.device_filters.extend('/job:%s' % job for job in cluster.jobs)
    return Placement(tower_devices, param, '/job:worker/task:0', config)
