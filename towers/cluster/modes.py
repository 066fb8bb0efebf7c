"""The cluster modes, one class each: where a task's graph goes, with what strategy, and what
its workers agree on. Each is a towers.distribution.Run (through ClusterRun).

  InGraph          the chief's: towers on every worker task, variables on the ps tasks
  Collective       a worker's: its own towers and copy, the workers' all-reduce
  ParameterServer  a worker's: replica_device_setter, SyncReplicasOptimizer

A mode also says which settings it refuses (check, on the TrainConfig) and which tasks only
serve (serves). Adding a mode is a class here and a line of MODES.
"""
import os

import tensorflow as tf

from towers.cluster.collective import FINGERPRINT_KEYS, AcrossWorkers, Collectives, bucket_bytes
from towers.cluster.launch import SHARED_GPUS
from towers.cluster.placement import in_graph_plan
from towers.cluster.runtime import FIRST_STEPS_S, ClusterRun
from towers.cluster.server import serve, server_config, task_device_indices, task_towers
from towers.cluster.spec import ClusterError, check_same, fingerprint
from towers.cluster.syncreplicas import (
    Readiness,
    SyncReplicas,
    monitored_session,
    ps_device_setter,
)
from towers.deviceplan import DevicePlan
from towers.devices import visible_gpus
from towers.names import ALL_REDUCE_BUCKET

tf1 = tf.compat.v1

UPDATE_WAIT_S = 3600.0


class InGraph(ClusterRun):
    """The chief's run of in-graph replication over the whole cluster: one graph, one
    Session, N tasks x T towers training as one process with N*T towers.

    towers_per_task: towers on each worker task (None: every GPU the chief sees, or one
    CPU); num_gpus: the GPUs each task has (None: as many as the chief sees; every task is
    started with as many, which the session checks).
    """

    name = 'in-graph'

    def __init__(self, cluster, towers_per_task=None, timeout=None, threads=None,
                 num_gpus=None, data_format=None, xla=False):
        if not cluster.is_chief:
            raise ClusterError('in-graph mode trains on the chief (worker 0) only; %s %d '
                               'serves: run `towers server` there' % (cluster.task_type,
                                                                      cluster.task_index))
        # The session's own timeout is a backstop for every run (init, evaluation).
        plan = in_graph_plan(cluster, towers_per_task, timeout=timeout or FIRST_STEPS_S,
                             threads=threads, num_gpus=num_gpus)
        super().__init__(cluster, plan.with_data_format(data_format).with_xla(xla), timeout)

    @classmethod
    def check(cls, config, cluster):
        super().check(config, cluster)
        _one_copy(cls.name, config, 'on the ps tasks (or the chief)')

    @classmethod
    def serves(cls, cluster):
        return not cluster.is_chief

    @classmethod
    def serve(cls, cluster, config, threads, num_gpus, log):
        log('in-graph mode: %s %d serves; worker 0 trains' % (cluster.task_type,
                                                              cluster.task_index))
        serve(cluster, server_config(cluster, config.towers or 1, threads, num_gpus=num_gpus),
              log=log)


class Collective(ClusterRun):
    """A worker's run of collective training: its own towers, the workers' all-reduce; each
    worker reads its share of every global batch, all take the same steps, and a stop asked
    of one is voted on, so that all stop after the same step.

    On GPUs the worker's copy of the variables sits on its first GPU and the gradients are
    all-reduced there (NCCL, unless the launcher says that workers share a GPU: SHARED_GPUS);
    on CPUs, on its CPU. bucket: --all-reduce-bucket, the all-reduce's buckets, overlapped
    with the backward pass ('0': one pass after it).
    """

    name = 'collective'

    def __init__(self, cluster, towers_per_task=None, timeout=None, threads=None,
                 num_gpus=None, bucket='0', data_format=None, xla=False):
        if cluster.task_type != 'worker':
            raise ClusterError('collective mode has no ps tasks: every task is a worker')
        task, tower_devices, num_gpus = _own_towers(cluster, towers_per_task, num_gpus)
        config = server_config(cluster, len(tower_devices), threads,
                               timeout_ms=1000 * (timeout or FIRST_STEPS_S), num_gpus=num_gpus)
        config.device_filters.append('/job:worker')  # its own towers, and the others' pings
        if bucket_bytes(bucket, []) and threads:
            # A thread of its own for the buckets' all-reduces: with every inter-op thread
            # busy on the backward pass, a bucket ready early would wait for its end.
            config.inter_op_parallelism_threads = threads + 1
        host = task + '/device:CPU:0'
        plan = DevicePlan(tower_devices, variables=task + '/device:GPU:0' if num_gpus else host,
                          host=host, default_device=host, variable_update='collective',
                          config=config).with_data_format(data_format).with_xla(xla)
        # NCCL cannot all-reduce between two processes on one GPU: the ring can.
        collectives = Collectives(cluster.num_workers, timeout or FIRST_STEPS_S,
                                  nccl=os.environ.get(SHARED_GPUS) != '1')
        super().__init__(cluster, plan, timeout,
                         AcrossWorkers(plan, collectives, cluster.is_chief, bucket),
                         share=(cluster.task_index, cluster.num_workers))
        self._vote = self._fingerprint = self._fingerprints = None

    @classmethod
    def options(cls, config):
        return {'bucket': config.all_reduce_bucket or ALL_REDUCE_BUCKET}

    @classmethod
    def check(cls, config, cluster):  # its buckets are its own: not ClusterRun's refusal
        if cluster.num_ps:
            raise ClusterError('{cluster_mode} collective has no ps tasks: give the cluster '
                               'workers only, or use {cluster_mode} in-graph')
        if config.sync_bn:
            raise ClusterError('{sync_bn} pools batch norm over the towers of one process; '
                               '{cluster_mode} collective does not pool it across workers yet')
        if config.variable_update != 'parameter_server':
            raise ClusterError('{cluster_mode} collective keeps one copy of the variables per '
                               'worker: leave {variable_update} at parameter_server')
        bucket_bytes(cls.options(config)['bucket'], [])  # refused before any server starts

    def build_ops(self, host):
        """The pings; a stop vote and the fingerprint's all-reduces, on this task's host."""
        super().build_ops(host)
        collectives = self.strategy.collectives
        with tf.device(host), tf1.name_scope('cluster'):
            self._vote = tf1.placeholder(tf.float32, [], name='stop_vote')
            self.votes = collectives.all_reduce(tf.reshape(self._vote, [1]))[0]
            # Keys of their own: they meet even when the graphs differ elsewhere.
            self._fingerprint = tf1.placeholder(tf.int64, [None], name='fingerprint')
            self._fingerprints = [collectives.all_reduce(self._fingerprint, merge, key)
                                  for merge, key in zip(('Max', 'Min'), FINGERPRINT_KEYS)]

    def vote_feed(self, stop):
        return {self._vote: 1.0 if stop else 0.0}

    def check_agreement(self, sess):
        names, mine = fingerprint(self._settings)
        high, low = sess.run(self._fingerprints, {self._fingerprint: mine},
                             options=self.run_options())
        check_same(names, high, low)  # the workers agree where their Max equals their Min


class ParameterServer(ClusterRun):
    """A worker's run of the classic recipe: replica_device_setter, one synchronous
    update per step (SyncReplicasOptimizer, towers/cluster/syncreplicas.py), the Session
    made by MonitoredTrainingSession on the chief."""

    name = 'parameter-server'
    finalizes_graph = False  # the MonitoredSession finalizes it, once its hooks have built
    placement_agreed = True  # one copy on the ps tasks: every worker places each alike

    def __init__(self, cluster, towers_per_task=None, timeout=None, threads=None,
                 num_gpus=None, data_format=None, xla=False):
        if cluster.task_type != 'worker':
            raise ClusterError('in parameter-server mode the ps tasks serve: run `towers '
                               'server` there')
        if not cluster.num_ps:
            raise ClusterError('{cluster_mode} parameter-server needs ps tasks: give the '
                               'cluster a "ps" job (towers launch --ps 1)')
        task, tower_devices, num_gpus = _own_towers(cluster, towers_per_task, num_gpus)
        # The chief's queue runner waits for every worker's gradient as long as the chief
        # evaluates or saves: a backstop of an hour, not the step's timeout (each step has
        # its own, and a stalled update then fails the steps waiting for it).
        config = server_config(cluster, len(tower_devices), threads,
                               timeout_ms=1000 * max(timeout or FIRST_STEPS_S, UPDATE_WAIT_S),
                               num_gpus=num_gpus)
        # The ps tasks and the workers (whose pings name a lost one); never another job.
        config.device_filters.extend(['/job:ps', '/job:worker'])
        # The variables go where the ps tasks' device setter puts them, as in the classic
        # recipe. Each tower reads the variables through the worker's CPU: one copy of each
        # off the network a step, whatever the tower count.
        plan = DevicePlan(tower_devices, variables=None,
                          default_device=ps_device_setter(cluster, cluster.task_index),
                          read_cache=task + '/device:CPU:0', config=config
                          ).with_data_format(data_format).with_xla(xla)
        super().__init__(cluster, plan, timeout,
                         SyncReplicas(plan, cluster.num_workers, cluster.is_chief),
                         share=(cluster.task_index, cluster.num_workers))
        self._readiness = None

    @classmethod
    def check(cls, config, cluster):
        super().check(config, cluster)
        if config.ema is not None:
            raise ClusterError('{ema} is not kept in {cluster_mode} parameter-server yet: the '
                               "averages would follow every worker's push, not each update")
        if config.sync_bn:
            raise ClusterError('{sync_bn} pools batch norm over the towers of one process; '
                               '{cluster_mode} parameter-server does not pool it across '
                               'workers')
        _one_copy(cls.name, config, 'on the ps tasks')

    @classmethod
    def serves(cls, cluster):
        return cluster.task_type == 'ps'  # the same command on every task: a ps task serves

    @classmethod
    def serve(cls, cluster, config, threads, num_gpus, log):
        log('parameter-server mode: ps %d serves the variables' % cluster.task_index)
        serve(cluster, server_config(cluster, 1, threads, num_gpus=num_gpus), log=log)

    def build_ops(self, host):
        super().build_ops(host)
        self.votes = self.strategy.votes  # the workers' votes, pushed with their gradients

    def vote_feed(self, stop):
        return {self.strategy.vote: 1.0 if stop else 0.0}

    def agree(self, trainer):
        super().agree(trainer)
        self._readiness = Readiness(self._settings)

    def check_agreement(self, sess):
        if not self.cluster.is_chief:  # the chief's settings are the fingerprint
            self._readiness.check(sess)

    def _open(self, target, built, load):
        with built.graph.as_default():
            return monitored_session(target, built, built.plan.config, self.strategy,
                                     self._readiness, load, self.timeout or FIRST_STEPS_S)

    def _prepare(self, sess, built, load):
        if not self.cluster.is_chief:
            load(sess)  # the chief's ran in its MonitoredTrainingSession


MODES = {mode.name: mode for mode in (InGraph, Collective, ParameterServer)}  # CLUSTER_MODES


def not_the_evaluator(cluster):
    """ClusterError on the evaluator's task: it is outside the cluster that trains."""
    if cluster.is_evaluator:
        raise ClusterError('this task is the evaluator, outside the training cluster: it '
                           "serves nothing; run towers train there, with the chief's {logdir}")


def cluster_run(config, cluster, plan, log=print):
    """This task's run of config.cluster_mode (None: in-graph), or None once a task that only
    serves has served until it was stopped; ClusterError for a setting the mode refuses.

    plan: this process's DevicePlan, its devices resolved once: where they are CPUs
    (--devices cpu, or a host without GPUs) the tasks' towers go on virtual CPUs, on GPU
    hosts too; else on as many GPUs as this task sees. Each task runs config.threads inter-op
    threads (None: TensorFlow's).
    """
    not_the_evaluator(cluster)
    threads, num_gpus = config.threads, 0 if plan.on_cpus() else None
    mode = MODES[config.cluster_mode or InGraph.name]
    mode.check(config, cluster)
    if mode.serves(cluster):
        mode.serve(cluster, config, threads, num_gpus, log)
        return None
    return mode(cluster, config.towers, config.cluster_timeout, threads, num_gpus,
                data_format=config.data_format, xla=config.xla, **mode.options(config))


def _one_copy(mode, config, where):
    if config.variable_update != 'parameter_server':
        raise ClusterError('{cluster_mode} %s keeps one copy of the variables %s: leave '
                           '{variable_update} at parameter_server' % (mode, where))


def _own_towers(cluster, towers_per_task, num_gpus=None):
    """(this worker's task, its tower devices, its GPUs): a between-graph worker's towers,
    on its own GPUs where it sees any, else on its virtual CPUs."""
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    count, kind = task_towers(towers_per_task, num_gpus)
    task = '/job:worker/task:%d' % cluster.task_index
    return task, ['%s/device:%s:%d' % (task, kind, i)
                  for i in task_device_indices(count, kind, num_gpus)], num_gpus
