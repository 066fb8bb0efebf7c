"""Which cluster a task is part of, and which task it is: TF_CONFIG, or --cluster FILE.

TF_CONFIG is the JSON that Kubernetes' TFJob and other launchers set:

  {"cluster": {"worker": ["host0:2222", "host1:2222"], "ps": ["host2:2222"]},
   "task": {"type": "worker", "index": 1}}

`--cluster FILE.json --task-type worker --task-index 1` says the same with the
cluster in a file. Worker 0 is the chief (it saves checkpoints and writes
events). TensorFlow-free: the launcher and the parser use it before
TensorFlow starts.
"""
import dataclasses
import json
import os
import re
import zlib

from towers.errors import TowersError

JOBS = ('worker', 'ps')
CHIEF = ('worker', 0)

_ADDRESS = re.compile(r'^(?P<host>[A-Za-z0-9_.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$')


class ClusterError(TowersError):
    """A cluster or task description no run can use."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The tasks of a cluster and the one this process is.

    Attributes:
      jobs: {'worker': (address, ...), 'ps': (...)}; 'ps' may be absent.
      task_type: 'worker' or 'ps'.
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
    def address(self):
        """host:port this task serves on."""
        return self.jobs[self.task_type][self.task_index]

    def as_dict(self):
        """The cluster as tf.compat.v1.train.ClusterSpec takes it."""
        return {job: list(addresses) for job, addresses in self.jobs.items()}

    def tf_config(self, task_type=None, task_index=None):
        """The TF_CONFIG text of a task of this cluster (by default this one)."""
        return json.dumps({'cluster': self.as_dict(),
                           'task': {'type': task_type or self.task_type,
                                    'index': self.task_index if task_index is None
                                    else task_index}})


def _check_jobs(cluster, where):
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError('%s has no "cluster": give {"cluster": {"worker": ["host:port", ...]}}'
                           % where)
    unknown = sorted(set(cluster) - set(JOBS))
    if unknown:
        raise ClusterError('%s names job(s) %s; towers runs the jobs %s (worker 0 is the chief)'
                           % (where, ', '.join(unknown), ', '.join(JOBS)))
    if not cluster.get('worker'):
        raise ClusterError('%s has no worker: its "cluster" needs "worker": ["host:port", ...]'
                           % where)
    jobs, seen = {}, {}
    for job in JOBS:
        addresses = cluster.get(job, [])
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
        if addresses:
            jobs[job] = tuple(addresses)
    return jobs


def _check_task(jobs, task_type, task_index, where):
    if task_type not in JOBS:
        raise ClusterError('%s: task type %r is not one of %s' % (where, task_type,
                                                                 ', '.join(JOBS)))
    if task_type not in jobs:
        raise ClusterError('%s: the task is a %s, but the cluster has no %s job'
                           % (where, task_type, task_type))
    if not isinstance(task_index, int) or isinstance(task_index, bool) \
            or not 0 <= task_index < len(jobs[task_type]):
        raise ClusterError('%s: task index %r is out of range: the cluster has %d %s task(s), '
                           '0 to %d' % (where, task_index, len(jobs[task_type]), task_type,
                                        len(jobs[task_type]) - 1))
    return Cluster(jobs, task_type, task_index)


def from_tf_config(text):
    """The Cluster of a TF_CONFIG text; ClusterError naming what is wrong."""
    try:
        config = json.loads(text)
    except ValueError as e:
        raise ClusterError('TF_CONFIG is not JSON (%s): set it to {"cluster": {...}, '
                           '"task": {"type": "worker", "index": K}}' % e) from None
    if not isinstance(config, dict):
        raise ClusterError('TF_CONFIG must be a JSON object, got %r' % (config,))
    jobs = _check_jobs(config.get('cluster'), 'TF_CONFIG')
    task = config.get('task')
    if not isinstance(task, dict) or 'type' not in task or 'index' not in task:
        raise ClusterError('TF_CONFIG has no task: add "task": {"type": "worker", "index": K}')
    return _check_task(jobs, task['type'], task['index'], 'TF_CONFIG')


def from_file(path, task_type, task_index):
    """The Cluster of a --cluster FILE.json (its "cluster", or the whole file) and a task."""
    try:
        with open(path, encoding='utf-8') as f:
            config = json.load(f)
    except OSError as e:
        raise ClusterError('cannot read {cluster} %s: %s', path, e.strerror) from None
    except ValueError as e:
        raise ClusterError('{cluster} %s is not JSON: %s', path, e) from None
    cluster = config.get('cluster', config) if isinstance(config, dict) else config
    jobs = _check_jobs(cluster, path)
    if task_type is None or task_index is None:
        raise ClusterError('{cluster} needs {task_type} and {task_index}: which task this is')
    return _check_task(jobs, task_type, task_index, path)


def resolve(cluster_file=None, task_type=None, task_index=None, environ=None):
    """This process's Cluster: from --cluster, else from $TF_CONFIG; None for neither.

    Raises:
      ClusterError: a description that cannot be used, or both given.
    """
    environ = os.environ if environ is None else environ
    if cluster_file:
        if environ.get('TF_CONFIG'):
            raise ClusterError('both TF_CONFIG and {cluster} say which cluster this is; '
                               'give one')
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
