"""In-graph replication: the chief builds one graph whose towers run on every task.

The classic TF1 "Distributed TensorFlow" recipe, on towers' own graph: the
same build_training_graph, the same average_gradients and one apply_gradients,
only with the towers on /job:worker/task:k/device:CPU:i (GPU:i) and the
variables on the ps tasks (or the chief). Only the chief runs a Session; the
other tasks serve (`towers server`). N tasks x T towers train exactly as one
process with N*T towers on the same global batch.

A task that dies or freezes must not hang the chief: every step runs with a
timeout (--cluster-timeout, by default a few times the step time once it is
known), and a step that fails on the cluster is answered by asking every
task, at once and briefly, whether it is there; the ones that do not answer
are named in the one-line error.
"""
import statistics
import threading

import tensorflow as tf

from towers.cluster.placement import in_graph_placement
from towers.cluster.server import start_server, wait_for_tasks
from towers.cluster.spec import ClusterError

tf1 = tf.compat.v1

# What TensorFlow raises when a step cannot reach a task, or waits on it too long.
LOST = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
        tf.errors.CancelledError, tf.errors.InternalError)

FIRST_STEPS_S = 300.0  # until the step time is known (placement, first compiles)
MIN_TIMEOUT_S = 30.0
STEP_TIMES = 5  # x the median step time: the default step timeout
PING_S = 5.0


class InGraph:
    """The chief's side of an in-graph cluster run.

    Args:
      cluster: the towers.cluster.spec.Cluster; this task must be the chief.
      towers_per_task: towers (virtual CPUs without GPUs) on each worker task.
      timeout: seconds a step may wait on another task; None: automatic.
      threads: intra- and inter-op threads of the chief's server.
    """

    mode = 'in-graph'

    def __init__(self, cluster, towers_per_task=1, timeout=None, threads=None):
        if not cluster.is_chief:
            raise ClusterError('in-graph mode trains on the chief (worker 0) only; %s %d '
                               'serves: run `towers server` there' % (cluster.task_type,
                                                                      cluster.task_index))
        self.cluster, self.timeout = cluster, timeout
        # A backstop for every run (init, evaluation): never a hang.
        self.placement = in_graph_placement(cluster, towers_per_task,
                                            timeout=timeout or FIRST_STEPS_S, threads=threads)
        self.server, self._seconds, self._pings, self._ping_feed = None, [], {}, None

    @property
    def tasks(self):
        """['worker 0', 'worker 1', 'ps 0', ...]: every task of the cluster."""
        return ['%s %d' % (job, i) for job in self.cluster.jobs
                for i in range(len(self.cluster.jobs[job]))]

    def start(self):
        """Start the chief's own server, wait for the other tasks; the Session target."""
        self.server = start_server(self.cluster, self.placement.config)
        wait_for_tasks(self.cluster, self.timeout or FIRST_STEPS_S)
        return self.server.target

    def build_pings(self):
        """One tiny op per task, in the default graph, to ask whether it answers."""
        self._ping_feed = tf1.placeholder(tf.float32, [], name='cluster_ping')
        for name in self.tasks:
            job, index = name.split()
            with tf.device('/job:%s/task:%s/device:CPU:0' % (job, index)):
                # Fed, so that no optimisation folds it onto the chief.
                self._pings[name] = tf.identity(self._ping_feed, name='ping_%s_%s' % (job, index))

    def check_devices(self, sess):
        """ClusterError unless every tower device exists: each task started with its towers."""
        have = {_short(d.name) for d in sess.list_devices()}
        missing = [d for d in self.placement.tower_devices if _short(d) not in have]
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

    def run_options(self, options=None):
        """options (or new RunOptions) with this step's timeout."""
        options = options or tf1.RunOptions()
        options.timeout_in_ms = int(1000 * self.step_timeout_s())
        return options

    def lost(self, sess):
        """The tasks that do not answer a ping within PING_S (all asked at once)."""
        answered = set()

        def ask(name):
            try:
                sess.run(self._pings[name], {self._ping_feed: 0.0},
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

    def failure(self, sess, error, step):
        """The one-line error for a step that failed on the cluster."""
        lost = self.lost(sess)
        what = ('lost %s (%s)' % (', '.join(lost), ', '.join(self._address(n) for n in lost))
                if lost else 'the cluster failed')
        why = ('the step did not finish within %.0f s' % self.step_timeout_s()
               if isinstance(error, tf.errors.DeadlineExceededError)
               else 'TensorFlow %s' % type(error).__name__)
        return ClusterError('%s at step %d (%s); stop the job and start it again to resume '
                            'from the newest checkpoint' % (what, step + 1, why))

    def _address(self, name):
        job, index = name.split()
        return self.cluster.jobs[job][int(index)]


def _short(device):
    """'/job:worker/replica:0/task:1/device:CPU:0' -> '/job:worker/task:1/device:CPU:0'."""
    spec = tf.DeviceSpec.from_string(device)
    return '/job:%s/task:%d/device:%s:%d' % (spec.job, spec.task, spec.device_type,
                                             spec.device_index)
