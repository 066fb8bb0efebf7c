"""Which cluster a task is part of, and which task it is: TF_CONFIG, --cluster FILE, or SLURM.

TF_CONFIG is the JSON that Kubeflow's TFJob, TensorFlow's own launchers and
`towers launch` set:

  {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"], "ps": ["h3:2222"]},
   "task": {"type": "worker", "index": 1}, "environment": "cloud"}

towers runs two jobs, 'worker' and 'ps', and worker 0 is the chief (it saves
checkpoints and writes events). A `chief` job (or `master`, TFJob's old name
for it) of one task becomes worker 0 and the TF_CONFIG's workers 1..n, so
worker i is towers' worker i + 1: every task applies the same rule, so all
agree. An `evaluator` task is outside the training cluster, whether or not the
cluster lists it: its Cluster has task_type 'evaluator' and the training jobs.
Other keys (environment, rpc_layer, job) are ignored; a sparse cluster
(TFJob's enableDynamicWorker) is refused, for every task must know every other.

`--cluster FILE.json --task-type worker --task-index 1` says the same with the
cluster in a file, and `--cluster slurm` (or a step of srun of more than one
task, without TF_CONFIG) reads SLURM's variables (towers/cluster/slurm.py).

TensorFlow-free: the launcher and the parser use it before TensorFlow starts.
That is why TF_CONFIG is read by hand here and not by
tf.distribute.cluster_resolver.TFConfigClusterResolver, which would load
TensorFlow (tests/cluster/test_spec.py holds the two against each other).
"""
import dataclasses
import json
import os
import re
import zlib

from towers.cluster import slurm
from towers.errors import TowersError

JOBS = ('worker', 'ps')
CHIEF = ('worker', 0)
CHIEF_JOBS = ('chief', 'master')  # TensorFlow's and TFJob's name of a chief apart from workers
EVALUATOR = 'evaluator'
TASK_TYPES = JOBS + CHIEF_JOBS + (EVALUATOR,)

_ADDRESS = re.compile(r'^(?P<host>[A-Za-z0-9_.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$')


class ClusterError(TowersError):
    """A cluster or task description no run can use."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The tasks of a cluster and the one this process is.

    Attributes:
      jobs: {'worker': (address, ...), 'ps': (...)}; 'ps' may be absent.
      task_type: 'worker', 'ps', or 'evaluator' (outside the jobs: it trains nothing).
      task_index: this task's index in its job.
    """
    jobs: dict
    task_type: str
    task_index: int

    @property
    def num_workers(self):
        return len(self.jobs['worker'])

    @property
    def num_ps(self):
        return len(self.jobs.get('ps', ()))

    @property
    def is_chief(self):
        return (self.task_type, self.task_index) == CHIEF

    @property
    def is_evaluator(self):
        return self.task_type == EVALUATOR

    @property
    def address(self):
        """host:port this task serves on; None for the evaluator, which serves nothing."""
        addresses = self.jobs.get(self.task_type, ())
        return addresses[self.task_index] if self.task_index < len(addresses) else None

    def as_dict(self):
        """The cluster as tf.compat.v1.train.ClusterSpec takes it."""
        return {job: list(addresses) for job, addresses in self.jobs.items()}

    def tf_config(self, task_type=None, task_index=None):
        """The TF_CONFIG text of a task of this cluster (by default this one)."""
        return json.dumps({'cluster': self.as_dict(),
                           'task': {'type': task_type or self.task_type,
                                    'index': self.task_index if task_index is None
                                    else task_index}})


def _listed(cluster, where):
    """{job: [address, ...]} of a cluster as given, each address checked; ClusterError else."""
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError('%s has no "cluster": give {"cluster": {"worker": ["host:port", ...]}}'
                           % where)
    unknown = sorted(set(cluster) - set(TASK_TYPES))
    if unknown:
        raise ClusterError('%s names job(s) %s; towers runs the jobs worker, ps (worker 0 is the '
                           'chief), a chief or master (then worker 0) and an evaluator'
                           % (where, ', '.join(unknown)))
    seen = {}
    for job in TASK_TYPES:
        addresses = cluster.get(job, [])
        if isinstance(addresses, dict):
            raise ClusterError('%s: job %s is sparse ({index: address}); towers needs every '
                               'task: "%s": ["host:port", ...]' % (where, job, job))
        if not isinstance(addresses, list):
            raise ClusterError('%s: job %s must list "host:port" addresses, got %r'
                               % (where, job, addresses))
        for index, address in enumerate(addresses):
            match = _ADDRESS.match(address) if isinstance(address, str) else None
            if not match or not 0 < int(match.group('port')) < 65536:
                raise ClusterError('%s: %s %d is %r, not a host:port address'
                                   % (where, job, index, address))
            if address in seen:
                raise ClusterError('%s: %s is both %s and %s %d' % (
                    where, address, '%s %d' % seen[address], job, index))
            seen[address] = (job, index)
    chiefs = [job for job in CHIEF_JOBS if cluster.get(job)]
    if len(chiefs) > 1:
        raise ClusterError('%s names both a chief and a master job: they are the same task, '
                           'the chief; keep one' % where)
    if chiefs and len(cluster[chiefs[0]]) != 1:
        raise ClusterError('%s: job %s lists %d addresses; a cluster has one chief: give it one '
                           '"host:port"' % (where, chiefs[0], len(cluster[chiefs[0]])))
    if not cluster.get('worker') and not chiefs:
        raise ClusterError('%s has no worker: its "cluster" needs "worker": ["host:port", ...]'
                           % where)
    return {job: cluster[job] for job in TASK_TYPES if cluster.get(job)}


def _jobs(listed):
    """towers' jobs of a listed cluster: the chief (if any) as worker 0, no evaluator."""
    chief = [a for job in CHIEF_JOBS for a in listed.get(job, [])]
    jobs = {'worker': tuple(chief + listed.get('worker', []))}
    if listed.get('ps'):
        jobs['ps'] = tuple(listed['ps'])
    return jobs


def _check_task(listed, task_type, task_index, where):
    """The Cluster of task (task_type, task_index) of a listed cluster, in towers' jobs."""
    if task_type not in TASK_TYPES:
        raise ClusterError('%s: task type %r is not one of %s' % (where, task_type,
                                                                 ', '.join(TASK_TYPES)))
    if task_type not in listed and task_type != EVALUATOR:
        raise ClusterError('%s: the task is a %s, but the cluster has no %s job'
                           % (where, task_type, task_type))
    count = len(listed.get(task_type, ()))
    if not isinstance(task_index, int) or isinstance(task_index, bool) or task_index < 0 \
            or (count and task_index >= count):
        if not count:  # an evaluator the cluster does not list
            raise ClusterError('%s: task index %r of the evaluator is not a number from 0'
                               % (where, task_index))
        raise ClusterError('%s: task index %r is out of range: the cluster has %d %s task(s), '
                           '0 to %d' % (where, task_index, count, task_type, count - 1))
    jobs = _jobs(listed)
    if task_type in CHIEF_JOBS:
        return Cluster(jobs, *CHIEF)
    if task_type == 'worker' and any(job in listed for job in CHIEF_JOBS):
        return Cluster(jobs, 'worker', task_index + 1)  # the chief is worker 0
    return Cluster(jobs, task_type, task_index)


def _refuse_sparse(config, where):
    if isinstance(config, dict) and 'sparseCluster' in config:
        raise ClusterError('%s has a "sparseCluster" (TFJob\'s enableDynamicWorker): towers needs '
                           'every task in "cluster"; set enableDynamicWorker: false' % where)


def from_tf_config(text):
    """The Cluster of a TF_CONFIG text; ClusterError naming what is wrong."""
    try:
        config = json.loads(text)
    except ValueError as e:
        raise ClusterError('TF_CONFIG is not JSON (%s): set it to {"cluster": {...}, '
                           '"task": {"type": "worker", "index": K}}' % e) from None
    if not isinstance(config, dict):
        raise ClusterError('TF_CONFIG must be a JSON object, got %r' % (config,))
    _refuse_sparse(config, 'TF_CONFIG')
    listed = _listed(config.get('cluster'), 'TF_CONFIG')
    task = config.get('task')
    if not isinstance(task, dict) or 'type' not in task or 'index' not in task:
        raise ClusterError('TF_CONFIG has no task: add "task": {"type": "worker", "index": K}')
    return _check_task(listed, task['type'], task['index'], 'TF_CONFIG')


def from_file(path, task_type, task_index):
    """The Cluster of a --cluster FILE.json (its "cluster", or the whole file) and a task."""
    try:
        with open(path, encoding='utf-8') as f:
            config = json.load(f)
    except OSError as e:
        raise ClusterError('cannot read {cluster} %s: %s', path, e.strerror) from None
    except ValueError as e:
        raise ClusterError('{cluster} %s is not JSON: %s', path, e) from None
    _refuse_sparse(config, path)
    cluster = config.get('cluster', config) if isinstance(config, dict) else config
    listed = _listed(cluster, path)
    if task_index is None and task_type in CHIEF_JOBS + (EVALUATOR,):
        task_index = 0  # there is one
    if task_type is None or task_index is None:
        raise ClusterError('{cluster} needs {task_type} and {task_index}: which task this is')
    return _check_task(listed, task_type, task_index, path)


def from_slurm(environ, ps_tasks=None, port_base=None):
    """The Cluster of this task of a SLURM step (towers/cluster/slurm.py)."""
    try:
        jobs, task_type, task_index = slurm.slurm_tasks(environ, ps_tasks, port_base)
    except slurm.SlurmError as e:
        raise ClusterError(str(e)) from None
    listed = _listed({job: list(addresses) for job, addresses in jobs.items()},
                     'the SLURM step')
    return _check_task(listed, task_type, task_index, 'the SLURM step')


def resolve(cluster_file=None, task_type=None, task_index=None, environ=None, ps_tasks=None,
            port_base=None):
    """This process's Cluster: from --cluster FILE or slurm, else $TF_CONFIG, else a SLURM
    step of more than one task; None for none of them.

    Raises:
      ClusterError: a description that cannot be used, two given, or flags without theirs.
    """
    environ = os.environ if environ is None else environ
    if cluster_file and environ.get('TF_CONFIG'):
        raise ClusterError('both TF_CONFIG and {cluster} say which cluster this is; give one')
    if cluster_file == slurm.SLURM or (not cluster_file and not environ.get('TF_CONFIG')
                                       and slurm.in_step(environ)):
        if task_type is not None or task_index is not None:
            raise ClusterError('{task_type} and {task_index} go with {cluster} FILE.json; in a '
                               'SLURM step each task is told which it is (SLURM_PROCID)')
        return from_slurm(environ, ps_tasks, port_base)
    if ps_tasks is not None or port_base is not None:
        raise ClusterError('{ps_tasks} and {port_base} go with a SLURM step (srun, or {cluster} '
                           'slurm)')
    if cluster_file:
        return from_file(cluster_file, task_type, task_index)
    if task_type is not None or task_index is not None:
        raise ClusterError('{task_type} and {task_index} go with {cluster}')
    text = environ.get('TF_CONFIG')
    return from_tf_config(text) if text else None


def fingerprint(settings):
    """(sorted names, a crc32 per name) of the settings every worker must share."""
    names = sorted(settings)
    return names, [zlib.crc32(repr(settings[n]).encode()) for n in names]


def check_same(names, mine, theirs):
    """ClusterError naming the settings where this worker's crc differs from theirs."""
    differ = [n for n, a, b in zip(names, mine, theirs) if a != b]
    if differ:
        raise ClusterError('the workers were started with different %s: start every '
                           'worker with the same flags' % ', '.join(differ))
