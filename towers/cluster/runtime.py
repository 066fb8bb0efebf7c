"""A task's part in a cluster run: its Session on the cluster, and how a lost task is told.

ClusterRun is what the three modes share (each mode is a class of towers/cluster/modes.py):

  in-graph    the chief builds one graph whose towers run on every worker task
              (T per task), the variables on the ps tasks or the chief; only the
              chief runs a Session, the other tasks serve. N tasks x T towers
              train as one process with N*T towers on the same global batch.
  collective  every worker builds its own towers on its own devices and reads its
              share of each global batch; the workers meet in all-reduces
              (towers/cluster/collective.py); all take the same steps, and a stop
              asked of one is voted on, so that all stop after the same step.
  parameter-server
              the classic TF1 recipe: every worker builds its own graph under
              replica_device_setter, the variables on the ps tasks, one
              synchronous update per step (SyncReplicasOptimizer,
              towers/cluster/syncreplicas.py), the Session made by
              MonitoredTrainingSession on the chief.

Never a hang: before the first step every other task must answer (TCP, within
the timeout); every step has a timeout (--cluster-timeout, or a few times the
step time once it is known); and a step that fails on the cluster asks every
task at once, briefly, whether it is there, so the error names the lost ones.
"""
import contextlib
import statistics
import threading

import tensorflow as tf

from towers.cluster.server import start_server, wait_for_tasks
from towers.cluster.spec import ClusterError
from towers.cluster.syncreplicas import WITHOUT_A_WORKER
from towers.distribution import Run
from towers.errors import op_error_summary
from towers.session import prepare_session

tf1 = tf.compat.v1

# What TensorFlow raises when a step cannot reach a task, or waits on it too long.
LOST = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
        tf.errors.CancelledError, tf.errors.InternalError)

FIRST_STEPS_S = 300.0  # until the step time is known (placement, first compiles)
MIN_TIMEOUT_S = 30.0
STEP_TIMES = 5  # x the median step time: the default step timeout
PING_S = 5.0

# Sessions whose task was lost: never closed, never collected. Closing one (its
# __del__ too) waits forever on the lost task's cleanup; the process should end.
_ABANDONED = []


class LostTaskError(ClusterError):
    """A task of the cluster went away or froze; the message names it.

    The process's Session to the cluster cannot be closed any more: end the
    process (the command line does, with status 1).
    """


class ClusterRun(Run):
    """This task's side of a cluster run: a towers.distribution.Run whose Session is on the
    cluster. A mode (towers/cluster/modes.py) says where its graph goes and with what
    strategy, and what its workers agree on.

    Attributes (besides a Run's):
      cluster: the towers.cluster.spec.Cluster.
      timeout: --cluster-timeout in seconds, or None (a few step times).
    """

    # Whether each worker must also place each variable alike (one copy on the ps tasks).
    placement_agreed = False
    in_one_process = False

    def __init__(self, cluster, plan, timeout, strategy=None, share=None):
        super().__init__(plan, strategy)
        self.cluster, self.timeout, self.share = cluster, timeout, share
        self.server, self._seconds, self._pings, self._feed = None, [], {}, None
        self._settings = None

    @property
    def tasks(self):
        """['worker 0', 'worker 1', 'ps 0', ...]: every task of the cluster."""
        return ['%s %d' % (job, i) for job in self.cluster.jobs
                for i in range(len(self.cluster.jobs[job]))]

    @classmethod
    def check(cls, config, cluster):
        """ClusterError for a setting of the TrainConfig this mode cannot train with; here,
        what only a mode that all-reduces across workers takes (which overrides it)."""
        if config.all_reduce_bucket is not None:
            raise ClusterError('{all_reduce_bucket} sizes the all-reduce of {cluster_mode} '
                               'collective; %s mode has none' % cls.name)

    @classmethod
    def options(cls, config):
        """The mode's own keywords, from the TrainConfig."""
        del config
        return {}

    @classmethod
    def serves(cls, cluster):
        """Whether this task only serves the others (it builds no graph)."""
        del cluster
        return False

    @classmethod
    def serve(cls, cluster, config, threads, num_gpus, log):
        """Serve the cluster's graph until SIGTERM or SIGINT (a task that serves)."""
        raise NotImplementedError

    def start(self):
        """Start this task's server, wait for the others; the Session target."""
        self.server = start_server(self.cluster, self.plan.config)
        wait_for_tasks(self.cluster, self.timeout or FIRST_STEPS_S)
        return self.server.target

    @contextlib.contextmanager
    def session(self, built, load, steps_done):
        """A Session on the cluster, prepared (init, load, sync) and checked.

        Whatever fails while it is open (a step, an evaluation, a save, the
        restore), the tasks are asked whether they are there: a lost one
        becomes a LostTaskError naming it, and the Session is abandoned.

        Args:
          built: the TrainGraph; its plan's config is the Session's (this task's plan's, with
            the run's own settings: XLA).
          load: callable(sess) run after init and before the replicas sync.
          steps_done: callable() -> the steps done, for the message.
        """
        def agreed_then_loaded(sess):  # the workers agree before any collective runs
            self.check_agreement(sess)
            load(sess)
        monitored, sess = self._open(self.start(), built, agreed_then_loaded)
        try:
            with sess.as_default(), built.graph.as_default():
                self.check_devices(sess)
                self._prepare(sess, built, agreed_then_loaded)
                yield sess
        except Exception as error:
            lost = self.lost(sess)
            if not lost:
                _close(monitored, sess)
                raise
            _ABANDONED.append((monitored, sess))
            raise self.failure(error, lost, steps_done()) from None
        except BaseException:
            _close(monitored, sess)
            raise
        else:
            _close(monitored, sess)

    def _open(self, target, built, load):
        """(the MonitoredSession or None, the Session) on target, not yet prepared."""
        del load  # prepared by _prepare
        return None, tf1.Session(target, graph=built.graph, config=built.plan.config)

    def _prepare(self, sess, built, load):
        """Init, load(sess), sync: what a new Session runs before the first step."""
        prepare_session(sess, built, load)

    def build_ops(self, host):
        """In the default graph: a ping per task (a mode adds its own ops on host)."""
        del host
        self._feed = tf1.placeholder(tf.float32, [], name='cluster_ping')
        for name in self.tasks:
            job, index = name.split()
            with tf.device('/job:%s/task:%s/device:CPU:0' % (job, index)):
                # Fed, so that no optimisation folds it onto this task.
                self._pings[name] = tf.identity(self._feed, name='ping_%s_%s' % (job, index))

    def agree(self, trainer):
        """Keep what every worker must agree on: the trainer's model, variables, batch,
        seed, steps...; called once its graph holds every variable, before it is final."""
        self._settings = self.settings(trainer)

    def settings(self, trainer):
        """{name: value} of a Trainer's run that every worker must share."""
        where = (lambda v: v.device) if self.placement_agreed else (lambda v: '')
        with trainer.graph.graph.as_default():
            variables = sorted((v.op.name, v.shape.as_list(), where(v))
                               for v in tf1.global_variables())
        config = trainer.config
        return {'model': type(trainer.model).__name__, 'variables': variables,
                'batch_size': trainer.batch_size, 'seed': config.seed,
                'steps': trainer.num_steps, 'steps_per_epoch': trainer.steps_per_epoch,
                'learning_rate': config.schedule().describe(), 'ema': config.ema,
                'input': trainer.source.name, 'xla': config.xla,
                'all_reduce_bucket': str(getattr(self.strategy, 'bucket', '0')),
                'precision': repr(trainer.graph.precision)}  # 'dynamic' and None alike

    def check_agreement(self, sess):
        """ClusterError unless every worker runs with the same settings as this one (a mode
        whose workers build graphs of their own checks; in-graph's one graph agrees)."""

    def check_devices(self, sess):
        """ClusterError unless every tower device exists: each task started with its towers."""
        have = {_short(d.name) for d in sess.list_devices()}
        missing = [d for d in self.plan.towers if _short(d) not in have]
        if missing:
            raise ClusterError('the cluster lacks %s: start each worker with as many devices '
                               'as it has towers (towers server --towers N)'
                               % ', '.join(missing[:4]))

    def observe(self, seconds):
        """A finished step's time, for the default timeout."""
        self._seconds = (self._seconds + [seconds])[-50:]

    def step_timeout_s(self):
        if self.timeout:
            return self.timeout
        if len(self._seconds) < 3:
            return FIRST_STEPS_S
        return max(MIN_TIMEOUT_S, STEP_TIMES * statistics.median(self._seconds))

    def run_options(self, options=None, after_chief_work=False):
        """options (or new RunOptions) with this step's timeout.

        after_chief_work: the step follows an epoch end or a checkpoint, when the
        chief may evaluate and save while the others wait in the step's
        all-reduce: without --cluster-timeout it may take FIRST_STEPS_S.
        """
        options = options or tf1.RunOptions()
        seconds = (FIRST_STEPS_S if after_chief_work and not self.timeout
                   else self.step_timeout_s())
        options.timeout_in_ms = int(1000 * seconds)
        return options

    def lost(self, sess):
        """The tasks that do not answer a ping within PING_S (all asked at once)."""
        answered = set()

        def ask(name):
            try:
                sess.run(self._pings[name], {self._feed: 0.0},
                         options=tf1.RunOptions(timeout_in_ms=int(1000 * PING_S)))
                answered.add(name)
            except tf.errors.OpError:
                pass  # not answering is the answer
        threads = [threading.Thread(target=ask, args=(name,), daemon=True,
                                    name='towers-ping-' + name.replace(' ', '-'))
                   for name in self._pings]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(PING_S + 1)  # a frozen task's ping may never return
        return [name for name in self.tasks if name not in answered]

    def failure(self, error, lost, steps_done):
        """The one-line LostTaskError for what failed while tasks were lost."""
        cause = _op_error(error)
        if isinstance(cause, tf.errors.DeadlineExceededError):
            why = 'the step did not finish within %.0f s' % self.step_timeout_s()
        elif WITHOUT_A_WORKER in getattr(cause, 'message', ''):  # (cluster/syncreplicas.py)
            why = 'a step went on without its gradient and was stopped'
        elif isinstance(cause, tf.errors.OpError):
            why = 'TensorFlow %s' % type(cause).__name__
        else:
            why = op_error_summary(error) if hasattr(error, 'message') else str(error)
        return LostTaskError('lost %s (%s) after step %d (%s); stop the job and start it again '
                             'to resume from the newest checkpoint'
                             % (', '.join(lost), ', '.join(self._address(n) for n in lost),
                                steps_done, why))

    def _address(self, name):
        job, index = name.split()
        return self.cluster.jobs[job][int(index)]


def _op_error(error):
    """The TensorFlow error a TowersError was raised from (e.g. a closed queue read as the
    end of the data), or error itself."""
    cause = error
    while not isinstance(cause, tf.errors.OpError):
        cause = cause.__cause__ or cause.__context__
        if cause is None:
            return error
    return cause


def _close(monitored, sess):
    """Close the run's Session; a MonitoredSession's raw Session first.

    The chief's queue runner waits for a step no worker will take: closing
    the raw Session cancels that wait, so the thread ends (telling its
    Coordinator, which the MonitoredSession's close then joins) instead of
    outliving the close.
    """
    sess.close()
    if monitored is not None:
        try:
            monitored.close()
        except tf.errors.OpError:
            pass  # what the queue runner met: its wait cancelled above, or a lost task


def _short(device):
    """'/job:worker/replica:0/task:1/device:CPU:0' -> '/job:worker/task:1/device:CPU:0'."""
    spec = tf.DeviceSpec.from_string(device)
    return '/job:%s/task:%d/device:%s:%d' % (spec.job, spec.task, spec.device_type,
                                             spec.device_index)
