"""Parameter-server mode: the classic TF1 recipe, between-graph, synchronous.

Every worker builds its own graph under `replica_device_setter`: the variables
go to the ps tasks (each to the task with the fewest bytes so far, as the
estimator's GreedyLoadBalancingStrategy, gone from TensorFlow 2: the same on
every worker, since all build the same graph), every other op to the worker's
own devices. Each worker averages its own towers (weighted by share, as in one
process) and hands the result to `SyncReplicasOptimizer`, whose accumulators
on the ps tasks collect one gradient per worker for each step; the chief's
queue runner then applies their mean once and releases every worker into the
next step (no initial tokens: no worker ever computes a step on variables a
step old). So every step is one synchronous update, as one process on the
whole global batch.

Exact for any split of the batch: each worker pushes b_k * g_k (its share's
size times its mean gradient) and, beside it, a few numbers of its step
(b_k * loss, b_k * each metric, b_k, its stop vote) as the "gradient" of one
small variable of results; the accumulators take the mean over the workers
of each, and the update divides by the mean b_k: sum(b_k g_k) / B, the
one-device gradient. Weight decay and gradient processors (clipping by the
global norm, freezing) then act on that whole-batch gradient once, as in one
process. The same results give every worker the global batch's loss and
metrics, and the votes: a stop asked of one worker stops all after the same step.

Not tf_cnn_benchmarks' `parameter_server` across workers, where each worker
applies its own gradient to the shared variables as it comes (asynchronous:
N updates a step, each from a worker's share, on variables another worker may
just have changed): there N workers are not one device on N shares.
"""
import tensorflow as tf

from towers.cluster.spec import ClusterError, check_same, fingerprint
from towers.gradients import average_gradients, process_gradients, tower_update_ops
from towers.graph import weighted_loss, weighted_metrics
from towers.spread import LeastLoaded
from towers.variables import VariableStrategy

tf1 = tf.compat.v1

RESULTS_SCOPE = 'cluster'  # the results, ready flag and fingerprint: never in a checkpoint
POLL_S = 0.2  # how often a worker asks whether the chief has made the model ready


def ps_device_setter(cluster, task_index):
    """replica_device_setter for worker task_index: variables by bytes over the ps tasks,
    the ops no tower places on the worker's CPU (on a GPU host the placer would take a GPU)."""
    greedy = LeastLoaded(range(cluster.num_ps))  # op -> a ps task's index
    return tf1.train.replica_device_setter(
        cluster=tf1.train.ClusterSpec(cluster.jobs),
        worker_device='/job:worker/task:%d/device:CPU:0' % task_index, ps_strategy=greedy)


class SyncReplicas(VariableStrategy):
    """One copy of each variable on the ps tasks; one synchronous update per step.

    Args:
      plan: this worker's DevicePlan (its variables where the ps device setter puts them).
      num_workers: the workers whose gradients make each update.
      is_chief: whether this worker runs the update (the queue runner) and
        keeps tower 0's batch-norm statistics.
    Attributes (once the train op is built):
      optimizer: the SyncReplicasOptimizer (its hook starts the chief's queue runner).
      vote: a float placeholder, 1 when this worker asks to stop after the step.
      votes: the number of workers that voted to stop in the step just run.
    """

    name = 'parameter-server'

    def __init__(self, plan, num_workers, is_chief):
        super().__init__(plan)
        self.num_workers, self.is_chief = num_workers, is_chief
        self.optimizer = self.vote = self.votes = self._results = None

    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        """b_k * (this worker's average), and its step results -> the mean over the workers."""
        # The worker's own towers meet on its first tower's device: it pushes one sum of
        # each gradient to the ps, b_k * g_k, formed there too.
        worker_device = self.plan.towers[0]
        local = [(g, v) for g, v in average_gradients([t.grads_and_vars for t in towers],
                                                      [t.weight for t in towers], worker_device)
                 if g is not None]
        metrics = weighted_metrics(towers)
        with tf1.name_scope(RESULTS_SCOPE + '/'):  # one scope, however often opened
            count = tf.cast(tf.add_n([t.count for t in towers]), tf.float64)
            self.vote = tf1.placeholder_with_default(0.0, [], name='stop_vote')
            # float64: exact counts, and accuracies that print exact.
            results_now = tf.stack([tf.cast(weighted_loss(towers), tf.float64) * count]
                                   + [metrics[n] * count for n in sorted(metrics)]
                                   + [count, tf.cast(self.vote, tf.float64)])
            results = tf1.Variable(tf.zeros(results_now.shape, tf.float64), trainable=False,
                                   name='step_results')
        with tf.device(worker_device):
            share = tf.cast(count, tf.float32)
            pushed = [(tf.convert_to_tensor(g) * share, v) for g, v in local] + [
                (results_now, results)]
        update = _WholeBatchUpdate(optimizers[0], results, weight_decay, processors)
        self.optimizer = tf1.train.SyncReplicasOptimizer(update, self.num_workers)
        token = self.optimizer.apply_gradients(pushed, global_step=global_step)
        token = _own_token(token, global_step, count.device)
        # Read by the hook; not an error worth TensorFlow's report when a run fails first.
        self.optimizer.ready_for_local_init_op.mark_used()
        # Tower 0's statistics, as in one process: the chief's, once per step.
        updates = tower_update_ops(towers[0]) if self.is_chief else []
        train_op = tf.group(token, *updates, name='train_op')
        with tf.control_dependencies([train_op]):  # read once the update is done
            self._results = tf.identity(results.read_value())
        self.votes = self._results[-1] * self.num_workers
        return train_op, pushed[:-1]

    def step_results(self, loss, metrics, batch):
        """The global batch's loss, metrics and size, from the step's mean results."""
        names, results = sorted(metrics), self._results
        count = tf.maximum(results[-2], 1e-30)
        return (tf.cast(results[0] / count, tf.float32, name='loss'),
                {n: tf.identity(results[1 + i] / count, name=n) for i, n in enumerate(names)},
                tf.cast(tf.round(results[-2] * self.num_workers), tf.int32, name='batch'))

    def saved_variables(self):
        return {v.op.name: v for v in tf1.global_variables()
                if not v.op.name.startswith(RESULTS_SCOPE + '/')}

    def sync_op(self):
        return tf.no_op(name='sync_replicas')  # one copy: nothing to sync

    def hooks(self):
        """The SessionRunHooks of the MonitoredSession: the optimizer's set-up, no initial
        tokens (_SyncHook)."""
        return [_SyncHook(self.optimizer, self.is_chief)]


# The mark of a step that went on without a worker's gradient (see _own_token).
WITHOUT_A_WORKER = 'a step went on without a worker'


def _own_token(token, global_step, device):
    """The step's token op, failing unless the update it waited for took this worker's push.

    SyncReplicasOptimizer hands out its tokens from one queue, N after each update. A
    worker lost between its push and its take leaves its token there, and the next worker
    to ask takes it: that worker then runs on without the update having happened, and its
    next push makes the one after from two gradients of its own (a step of half the batch,
    twice). A fresh token always follows an update that counted this worker's gradient, so
    the global step has moved past the one this worker saw after its previous step; a
    token left behind by another has not: the step fails (and the lost worker is named).
    """
    with tf1.device(device), tf1.name_scope(RESULTS_SCOPE + '/'):
        seen = tf1.get_local_variable('seen_global_step', shape=[], dtype=global_step.dtype,
                                      initializer=tf.constant_initializer(-1),
                                      use_resource=True)
        with tf.control_dependencies([token]):
            now = tf.identity(global_step)
            moved = tf.debugging.Assert(tf.greater(now, seen.read_value()), [
                '%s: it took a token another worker left, after step' % WITHOUT_A_WORKER,
                now])
            with tf.control_dependencies([moved]):
                return tf.group(token, seen.assign(now), name='own_token')


class _SyncHook(tf1.train.SessionRunHook):
    """SyncReplicasOptimizer's hook (make_session_run_hook), with no initial tokens and a
    queue runner that never closes the token queue.

    The optimizer's own queue runner closes the queue when its update fails (a ps
    lost, a timeout): every waiting step would then read it as the end of the
    data, and a run with the dataset input would end quietly short. With the
    queue left open those steps time out instead, and the lost task is named.
    """

    def __init__(self, optimizer, is_chief):
        self.optimizer, self.is_chief, self.runner = optimizer, is_chief, None

    def begin(self):
        self.ready = self.optimizer.ready_for_local_init_op
        if self.is_chief:
            self.init = self.optimizer.chief_init_op
            theirs = self.optimizer.get_chief_queue_runner()
            self.runner = tf1.train.QueueRunner(
                theirs.queue, theirs.enqueue_ops, close_op=tf.no_op(), cancel_op=tf.no_op(),
                queue_closed_exception_types=(tf.errors.OutOfRangeError,
                                              tf.errors.CancelledError))
        else:
            self.init = self.optimizer.local_step_init_op

    def after_create_session(self, session, coord):
        missing = session.run(self.ready)
        if len(missing):
            raise ClusterError('the variables %s are not initialized: start every worker with '
                               'the same flags' % ', '.join(m.decode() for m in missing[:3]))
        session.run(self.init)
        if self.runner is not None:
            self.runner.create_threads(session, coord=coord, daemon=True, start=True)


class _WholeBatchUpdate:
    """The optimizer SyncReplicasOptimizer wraps: it gets the workers' mean of each pushed
    value, divides by the mean share to make the whole batch's gradient, decays and
    processes it once, and keeps the step's results.

    Duck-typed as the tf1 Optimizer SyncReplicasOptimizer calls (apply_gradients,
    compute_gradients and the slot accessors).
    """

    def __init__(self, optimizer, results, weight_decay, processors):
        self._opt, self._results = optimizer, results
        self._decay, self._processors = weight_decay, processors

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        pairs = list(grads_and_vars)
        mean = next(g for g, v in pairs if v is self._results)
        share = tf.cast(tf.maximum(mean[-2], 1e-30), tf.float32)  # the mean b_k = B / N
        grads = []
        for g, v in pairs:
            if v is not self._results and g is not None:
                with tf1.colocate_with(v):  # on the variable's ps, not the step's
                    grads.append((g / share, v))
        grads = process_gradients(grads, self._decay, self._processors)
        keep = tf1.assign(self._results, mean)
        with tf.control_dependencies([keep]):
            return self._opt.apply_gradients(grads, global_step=global_step, name=name)

    def compute_gradients(self, *args, **kwargs):
        return self._opt.compute_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._opt.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._opt.get_slot_names(*args, **kwargs)

    def variables(self):
        return self._opt.variables()


class Readiness:
    """What a worker waits for before its first step, and the run's fingerprint.

    The chief initializes (or restores) the variables and, once its queue
    runner is started, sets a flag on the ps tasks; the other workers wait for
    that flag, not merely for initialized variables (a restore comes after the
    init). The fingerprint variable holds the chief's settings, as its
    initializer made them: each worker compares its own.

    Build it in the default graph after every other variable, on every worker alike.
    """

    def __init__(self, settings):
        self.names, self.mine = fingerprint(settings)
        with tf1.name_scope(RESULTS_SCOPE + '/'):
            self.flag = tf1.Variable(False, trainable=False, name='chief_ready')
            self.fingerprint = tf1.Variable(tf.constant(self.mine, tf.int64), trainable=False,
                                            name='fingerprint')
            self.set_flag = tf1.assign(self.flag, True)
            initialized = tf1.is_variable_initialized(self.flag)
            ready = tf.cond(initialized, self.flag.read_value, lambda: tf.constant(False))
            # Only the flag: a worker built with other variables is then told so by
            # the fingerprint, instead of waiting for variables no chief will make.
            self.worker_ready_op = tf.boolean_mask(
                tf.constant(['the chief (worker 0) has not started']),
                tf.reshape(tf.logical_not(ready), [1]))

    def check(self, sess):
        """ClusterError unless this worker's settings are the chief's."""
        check_same(self.names, self.mine, sess.run(self.fingerprint))


class _SetFlag(tf1.train.SessionRunHook):
    """The chief's last hook: the model is ready, the queue runner started."""

    def __init__(self, op):
        self.op = op

    def after_create_session(self, session, coord):
        session.run(self.op)


class _WorkerSession(tf1.train.SessionCreator):
    """A worker's Session once the chief has made the model ready.

    As MonitoredTrainingSession's WorkerSessionCreator, but asking every
    POLL_S instead of every 30 s, and for the chief's flag.
    """

    def __init__(self, scaffold, master, config, wait_s, readiness):
        self.scaffold, self.master, self.config, self.wait_s = scaffold, master, config, wait_s
        self.readiness = readiness

    def create_session(self):
        self.scaffold.finalize()
        manager = tf1.train.SessionManager(
            local_init_op=self.scaffold.local_init_op, ready_op=self.scaffold.ready_op,
            ready_for_local_init_op=self.scaffold.ready_op, graph=tf1.get_default_graph(),
            recovery_wait_secs=POLL_S)
        try:
            sess = manager.wait_for_session(self.master, config=self.config,
                                            max_wait_secs=self.wait_s)
        except tf.errors.DeadlineExceededError:
            raise ClusterError('the chief (worker 0) did not make the model ready within %.0f s: '
                               'start it, or give it longer with {cluster_timeout}'
                               % self.wait_s) from None
        self.readiness.check(sess)  # before the hooks read this worker's variables
        return sess


def monitored_session(target, built, config, strategy, readiness, load, wait_s):
    """(the MonitoredSession of this worker, its raw Session), in built's graph.

    The chief's is MonitoredTrainingSession's: it runs init_op, then load
    (the restore), then the optimizer's hook (the accumulators' step, the
    queue runner) and sets the ready flag. No checkpoint or summary hooks: the
    Trainer's callbacks keep those. The steps run on the raw Session, so that
    a lost task is reported (towers/cluster/runtime.py) instead of
    MonitoredSession's recovery, which would close the Session (waiting on the
    lost task forever) and make a new one.
    """
    hooks = strategy.hooks()
    if strategy.is_chief:
        scaffold = tf1.train.Scaffold(init_op=built.init_op, saver=built.saver,
                                      init_fn=lambda scaffold, sess: load(sess))
        monitored = tf1.train.MonitoredTrainingSession(
            master=target, is_chief=True, scaffold=scaffold,
            hooks=hooks + [_SetFlag(readiness.set_flag)], config=config,
            save_checkpoint_secs=None, save_checkpoint_steps=None, save_summaries_steps=None,
            save_summaries_secs=None, log_step_count_steps=None, stop_grace_period_secs=1)
    else:
        scaffold = tf1.train.Scaffold(saver=built.saver, ready_op=readiness.worker_ready_op)
        monitored = tf1.train.MonitoredSession(
            session_creator=_WorkerSession(scaffold, target, config, wait_s, readiness),
            hooks=hooks,
            stop_grace_period_secs=1)
    raw = monitored.run_step_fn(lambda step_context: step_context.session)
    return monitored, raw
