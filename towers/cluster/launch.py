"""`towers launch`: every task of a cluster as a process of this machine.

How the tests and the README run a cluster on one machine (on real machines
each host runs its own `towers train` with its TF_CONFIG). Each task gets a
free port on 127.0.0.1 and its TF_CONFIG; its output goes to a log of its own
and, prefixed `[worker 1]`, to ours. When any task fails, the whole job is
torn down (the others get a grace period to notice and say what they lost,
then SIGTERM, then SIGKILL) and the launcher exits with that task's status;
when every worker has finished, the tasks that only serve are stopped and the
launcher exits 0.

On a host with GPUs each worker gets its own share of them (CUDA_VISIBLE_DEVICES)
and a ps task none, and every task lets GPU memory grow as it is used
(TF_FORCE_GPU_ALLOW_GROWTH): left alone, each process would map every GPU's
memory and the second would fail. More workers than GPUs share them, as more
towers than GPUs do in one process: two workers on one GPU both see GPU 0, and
each is told so (SHARED_GPUS), since NCCL cannot all-reduce between two processes
on one GPU (collective mode then all-reduces through TensorFlow's ring). The
launcher never asks TensorFlow for devices: it reads the GPUs from
CUDA_VISIBLE_DEVICES where it is set, else from `nvidia-smi -L`.

How a task starts: by default its command runs as a new Python process, which
imports TensorFlow itself (about 5 s of CPU on a 2-core EPYC, the most of a small
task's start). Given `fork` (the CLI's main, from a launcher that has imported
TensorFlow once: towers/cli/launcher.py), a towers command runs in a fork of this
process instead, as multiprocessing's fork start does. Either way each task is a
process of its own, in its own session, with its own pid, environment, output
pipe and exit status. Importing TensorFlow touches no device (CUDA starts at a
task's first Session), so every fork still picks its own GPUs. A task on an
emulated host (emulate.Host) is forked into its network namespace and onto its
cores, or spawned there with `ip netns exec`. A command that is not a towers
command is always spawned.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from towers.cluster.forked import Forked, die_with_parent
from towers.cluster.spec import Cluster, ClusterError

# Set to '1' in the environment of workers that share a GPU with another worker.
SHARED_GPUS = 'TOWERS_SHARED_GPUS'


def free_ports(count, host='127.0.0.1'):
    """count distinct ports nothing listens on now (the kernel's choice of each)."""
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind((host, 0))
            sockets.append(probe)
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def bind_error(port, ipv6=False):
    """The OSError of binding port on every interface now, or None when it can be bound.

    As gRPC binds (SO_REUSEADDR): a port left in TIME_WAIT by a server just stopped is free
    to it, so it is free here too. What every towers server checks before it starts.
    """
    probe = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(('', int(port)))
    except OSError as e:
        return e
    finally:
        probe.close()
    return None


def local_cluster(workers, ps=0, host='127.0.0.1'):
    """{'worker': [host:port, ...], 'ps': [...]} on free ports of this machine."""
    ports = free_ports(workers + ps, host)
    jobs = {'worker': ['%s:%d' % (host, p) for p in ports[:workers]]}
    if ps:
        jobs['ps'] = ['%s:%d' % (host, p) for p in ports[workers:]]
    return jobs


def host_gpus(env=None):
    """The GPU ids this host's tasks may share: CUDA_VISIBLE_DEVICES's where it is set (so a
    scheduler's binding is kept), else those `nvidia-smi -L` lists, else none."""
    env = os.environ if env is None else env
    if 'CUDA_VISIBLE_DEVICES' in env:
        return [d.strip() for d in env['CUDA_VISIBLE_DEVICES'].split(',') if d.strip()]
    try:
        listed = subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True,
                                timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listed.returncode:
        return []
    return [str(i) for i, line in enumerate(line for line in listed.stdout.splitlines()
                                            if line.startswith('GPU '))]


def gpu_shares(gpus, workers, ps, gpus_per_worker=None):
    """{(task_type, index): the CUDA_VISIBLE_DEVICES of that task}: consecutive shares of
    the host's GPUs to the workers, none to the ps tasks; {} on a host without GPUs. More
    workers than GPUs (and no gpus_per_worker) share them, dealt out evenly: 3 workers on
    2 GPUs see 0, 0 and 1.

    Raises:
      ClusterError: the workers' shares do not fit in the GPUs there are.
    """
    if not gpus:
        return {}
    if gpus_per_worker is None and workers > len(gpus):
        shares = {('worker', k): gpus[k * len(gpus) // workers] for k in range(workers)}
        shares.update({('ps', k): '' for k in range(ps)})
        shares['evaluator', 0] = ''  # every GPU has its workers: the evaluator its CPU
        return shares
    per = len(gpus) // workers if gpus_per_worker is None else gpus_per_worker
    if per < 1 or per * workers > len(gpus):
        raise ClusterError('%d worker(s) x %s GPU(s) each do not fit in the %d GPU(s) of this '
                           'host (%s): ask for fewer {workers} or {gpus_per_worker}' % (
                               workers, per, len(gpus), ','.join(gpus)))
    shares = {('worker', k): ','.join(gpus[k * per:(k + 1) * per]) for k in range(workers)}
    shares.update({('ps', k): '' for k in range(ps)})  # a ps task computes on its CPU
    # An evaluator takes the GPUs the workers leave, else computes on its CPU: it never
    # takes a worker's memory.
    shares['evaluator', 0] = ','.join(gpus[per * workers:])
    return shares


def exit_status(returncode):
    """A child's status as a shell reports it: a signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Task:
    """One task's process, its log file, and the thread copying its output."""

    def __init__(self, task_type, index, argv, serves, env, log_path, emit, host=None):
        self.task_type, self.index, self.argv, self.serves = task_type, index, argv, serves
        self.host = host  # emulate.Host, or None: this machine as it is
        self.name = '%s %d' % (task_type, index)
        self.log_path, self._emit, self._env = log_path, emit, env
        self.process = self._thread = None
        self.reported = False  # its end was told

    def start(self, fork=None, inherited=()):
        """Start the process (before any copying thread: preexec_fn, fork and threads do not
        mix). fork: as launch's; inherited: the files of the tasks started before, which a
        fork closes."""
        self._log_file = open(self.log_path, 'wb')  # a folder that cannot hold it: an error now
        args = towers_args(self.argv)
        if fork is not None and args is not None:
            self.process = Forked(fork, args, self._env, list(inherited) + [self._log_file],
                                  self.host.enter if self.host else None)
            return
        # Its own process group, so that a teardown reaches the task's children too;
        # and SIGTERM when the launcher dies, so that no task outlives it.
        argv = self.host.command(self.argv) if self.host else self.argv
        self.process = subprocess.Popen(argv, env=self._env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, preexec_fn=die_with_parent)

    def files(self):
        """What a task forked after this one must close: its log and its output's pipe."""
        return [self._log_file] + ([self.process.stdout] if self.process else [])

    def copy_output(self):
        """Start the thread copying its output to its log and ours."""
        self._thread = threading.Thread(target=self._copy, args=(self._log_file,), daemon=True,
                                        name='towers-launch-%s-%d' % (self.task_type,
                                                                      self.index))
        self._thread.start()

    def _copy(self, log_file):
        with log_file:
            for line in self.process.stdout:
                log_file.write(line)
                log_file.flush()
                try:
                    self._emit('[%s] %s' % (self.name,
                                            line.decode(errors='replace').rstrip('\n')))
                except OSError:
                    pass  # our output went away: the log still has it, and the pipe drains

    def signal(self, signum):
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass  # it ended meanwhile

    def finish(self):
        """Wait for the output copy to end (the process has exited); where no copy started
        (a later task failed to start), close the log."""
        if self._thread is not None:
            self._thread.join(timeout=5)
        else:
            self._log_file.close()


def launch(tasks, jobs, logs=None, grace=10.0, log=print, poll=0.1, gpus=None,
           gpus_per_worker=None, fork=None):
    """Run the tasks until the workers finish or one task fails; returns the exit status.

    Args:
      tasks: [(task_type, index, argv, serves[, host])]; each argv is run with the
        TF_CONFIG of that task of `jobs`, on its host where one is given (an
        emulate.Host). The job waits for the tasks that do
        not only serve; those that do (`towers server`: ps tasks, and workers
        in in-graph mode) are stopped once the others are done.
      jobs: {'worker': [address, ...], 'ps': [...]}.
      logs: the folder for one log per task (made if needed; None: a new
        temporary folder, named in the output).
      grace: seconds between SIGTERM and SIGKILL in a teardown.
      gpus: the host's GPU ids to share out (None: host_gpus()).
      gpus_per_worker: each worker's share (None: an even split).
      fork: None (every task a new process), or `towers`' main (ARGS -> status): a
        towers command then runs in a fork of this process, which has imported
        TensorFlow, so that no task imports it again (the module's docstring).
    """
    shares = gpu_shares(host_gpus() if gpus is None else gpus, len(jobs['worker']),
                        len(jobs.get('ps', ())), gpus_per_worker)
    logs = logs or tempfile.mkdtemp(prefix='towers-launch-')
    os.makedirs(logs, exist_ok=True)
    lock = threading.Lock()

    def emit(line):
        with lock:
            log(line)

    running = []
    workers = [shares[key] for key in shares if key[0] == 'worker']
    shared = len(set(workers)) < len(workers)
    for task_type, index, argv, serves, *host in tasks:
        env = dict(os.environ, TF_CONFIG=Cluster(jobs, task_type, index).tf_config())
        env.pop(SHARED_GPUS, None)
        if shares:
            env.update(CUDA_VISIBLE_DEVICES=shares[task_type, index],
                       TF_FORCE_GPU_ALLOW_GROWTH='true')
        if shared and task_type == 'worker':
            env[SHARED_GPUS] = '1'
        running.append(Task(task_type, index, argv, serves, env,
                            os.path.join(logs, '%s-%d.log' % (task_type, index)), emit,
                            *host))
    emit('towers launch: %d task(s) on %s%s; logs in %s'
         % (len(running), ', '.join(a for addresses in jobs.values() for a in addresses),
            ' and an evaluator' if any(t.task_type == 'evaluator' for t in running) else '',
            logs))
    if shares:
        emit('towers launch: GPUs %s%s' % ('; '.join(
            '%s %d: %s' % (t.task_type, t.index, shares[t.task_type, t.index] or 'none')
            for t in running), ' (workers share GPUs: their collectives take the ring, not '
                               'NCCL)' if shared else ''))
    interrupted = []
    previous = {s: signal.signal(s, lambda signum, frame: interrupted.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        started = []
        for task in running:
            task.start(fork, [f for t in started for f in t.files()])
            started.append(task)
        for task in running:
            task.copy_output()
        emit('towers launch: %s' % ', '.join('%s is pid %d' % (t.name, t.process.pid)
                                              for t in running))
        status = _watch(running, interrupted, poll, emit)
        if status and not interrupted:
            # The others notice a lost task themselves (and say which): let them.
            _wait_for([t for t in running if not t.serves], grace)
            for task in running:
                code = task.process.poll()
                if code is not None and not task.reported:
                    emit('towers launch: %s ended with status %d' % (task.name,
                                                                     exit_status(code)))
    finally:
        _teardown(running, grace)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status


def _watch(running, interrupted, poll, emit):
    """Wait for the end: every worker done (0), a task failing, or a signal to us."""
    while True:
        if interrupted:
            name = signal.Signals(interrupted[0]).name
            emit('towers launch: %s; stopping all %d task(s)' % (name, len(running)))
            return 128 + interrupted[0]
        # Tasks ended since the last look: a killed one first, the cause of the others'.
        for task in sorted(running, key=lambda t: (t.process.poll() or 0) >= 0):
            code = task.process.poll()
            if code is None or (code == 0 and not task.serves):
                continue
            others = [t for t in running if t.process.poll() is None]
            task.reported = True
            emit('towers launch: %s %s; stopping the other %d task(s)' % (
                task.name, 'was killed by %s' % signal.Signals(-code).name if code < 0
                else 'ended early' if code == 0 else 'exited with status %d' % code,
                len(others)))
            return exit_status(code) or 1
        if all(t.process.poll() == 0 for t in running if not t.serves):
            emit('towers launch: every training task finished')
            return 0
        time.sleep(poll)


def _wait_for(tasks, seconds):
    """Wait up to `seconds` for the tasks to end on their own."""
    deadline = time.monotonic() + seconds
    for task in tasks:
        try:
            task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return


def _teardown(running, grace):
    """SIGTERM every task still running, SIGKILL what is left after grace seconds."""
    for task in running:
        if task.process is not None:
            task.signal(signal.SIGTERM)
            task.signal(signal.SIGCONT)  # a stopped (frozen) task handles it once continued
    deadline = time.monotonic() + grace
    for task in running:
        if task.process is None:
            continue
        try:
            task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            task.signal(signal.SIGKILL)
            task.process.wait()
        task.finish()


def towers_command(*args):
    """argv running `python -m towers ARGS` with this interpreter."""
    return [sys.executable, '-m', 'towers'] + list(args)


def towers_args(argv):
    """ARGS of an argv towers_command made, else None."""
    prefix = towers_command()
    return list(argv[len(prefix):]) if list(argv[:len(prefix)]) == prefix else None
