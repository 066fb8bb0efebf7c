"""A cluster from SLURM's variables: `towers train` as a task of an srun step, no TF_CONFIG.

srun starts every task of a step and tells each where it stands, in the
variables tf.distribute.cluster_resolver.SlurmClusterResolver reads:

  SLURM_PROCID               this task's rank, 0 to SLURM_STEP_NUM_TASKS - 1
  SLURM_STEP_NUM_TASKS       the step's tasks (SLURM_NTASKS where it is not set)
  SLURM_STEP_NODELIST        its nodes, compressed: node[1-3,5],gpu[01-04]
  SLURM_STEP_TASKS_PER_NODE  the tasks of each node, in the nodelist's order: 3(x2),2
  SLURM_LOCALID              the task's index among those of its node (checked, if set)

The ranks fill the nodes in the nodelist's order (srun's default block
distribution), and the task of local index i on node N serves on
N:port_base + i, as the resolver places them. The first `ps_tasks` ranks are
ps 0, 1, ..., the rest workers 0, 1, ... (worker 0, the chief, is rank
ps_tasks): the resolver's order too, which puts 'ps' before 'worker'.

TensorFlow's hostlist and tasks-per-node expanders are used as they are,
imported only when a step is read (they load TensorFlow, and
towers.cluster.spec, which imports this module, must not). The resolver
itself is not: it orders the nodes by name (n10 before n9, where srun's ranks
follow the nodelist), it must be told each node's GPUs (on a CPU node it finds
no nvidia-smi, or steps a range by zero GPUs per task), and it re-binds
CUDA_VISIBLE_DEVICES, which srun has bound already (--gpus-per-task) and towers
keeps: a task's towers are the GPUs it sees.
"""
SLURM = 'slurm'  # --cluster slurm
PORT_BASE = 8888  # SlurmClusterResolver's
_LAUNCH = 'start towers with srun (in an sbatch script or an salloc), which sets it for each task'


class SlurmError(ValueError):
    """A SLURM environment no cluster can be made of: one line, `{setting}` marking a flag."""


def in_step(environ):
    """Whether this process is a task of a SLURM step of more than one task (a one-task step
    is a plain run of one process)."""
    # srun sets SLURM_STEP_NUM_TASKS in each task it starts; the batch script's own shell
    # has SLURM_NTASKS (the allocation's) but is one process: it is no cluster by itself.
    if 'SLURM_PROCID' not in environ or 'SLURM_STEP_NUM_TASKS' not in environ:
        return False
    count = environ['SLURM_STEP_NUM_TASKS'].strip()
    return not count.isdigit() or int(count) > 1  # not a number: slurm_tasks names it


def _text(environ, name):
    if name not in environ:
        raise SlurmError('%s is not set: %s' % (name, _LAUNCH))
    return environ[name].strip()


def _number(environ, name):
    text = _text(environ, name)
    if not text.lstrip('-').isdigit():
        raise SlurmError('%s is %r, not a number: %s' % (name, text, _LAUNCH))
    return int(text)


def _expanders():
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver
    return slurm_cluster_resolver.expand_hostlist, slurm_cluster_resolver.expand_tasks_per_node


def expand_nodes(nodelist, name='SLURM_STEP_NODELIST'):
    """['node1', 'node2', 'gpu01', ...] of a SLURM hostlist such as node[1-2],gpu[01-04]."""
    expand_hostlist, _ = _expanders()
    try:
        hosts = expand_hostlist(nodelist)
    except ValueError:
        hosts = ['']
    if not hosts or '' in hosts:
        raise SlurmError('%s %r is not a SLURM nodelist: write it as node1,node[2-4,7],gpu[01-08]'
                         % (name, nodelist))
    twice = sorted({host for host in hosts if hosts.count(host) > 1})
    if twice:
        raise SlurmError('%s %r names node(s) %s twice: name each node once'
                         % (name, nodelist, ', '.join(twice)))
    return hosts


def expand_counts(text, name='SLURM_STEP_TASKS_PER_NODE'):
    """[3, 3, 2] of a SLURM tasks-per-node list such as 3(x2),2."""
    _, expand_tasks_per_node = _expanders()
    try:
        counts = expand_tasks_per_node(text)
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise SlurmError('%s %r is not a list of tasks per node: write it as 3(x2),2 (3 tasks on '
                         'each of 2 nodes, then 2), every count 1 or more' % (name, text))
    return counts


def slurm_tasks(environ, ps_tasks=None, port_base=None):
    """({'worker': addresses, 'ps': addresses}, task_type, task_index) of this task of a step.

    Args:
      environ: the variables (os.environ, or a recorded step's).
      ps_tasks: the first ps_tasks ranks are ps tasks (None: 0).
      port_base: the port of each node's first task (None: 8888, the resolver's).

    Raises:
      SlurmError: a variable missing or malformed, the variables contradicting each
        other, or flags that do not fit the step; naming what to fix.
    """
    ps_tasks = 0 if ps_tasks is None else ps_tasks
    port_base = PORT_BASE if port_base is None else port_base
    count_name = 'SLURM_STEP_NUM_TASKS' if 'SLURM_STEP_NUM_TASKS' in environ else 'SLURM_NTASKS'
    rank, num_tasks = _number(environ, 'SLURM_PROCID'), _number(environ, count_name)
    nodelist = _text(environ, 'SLURM_STEP_NODELIST')
    per_node = _text(environ, 'SLURM_STEP_TASKS_PER_NODE')
    hosts, counts = expand_nodes(nodelist), expand_counts(per_node)
    if len(hosts) != len(counts):
        raise SlurmError('SLURM_STEP_NODELIST %r names %d node(s), but SLURM_STEP_TASKS_PER_NODE '
                         '%r counts the tasks of %d: both must be of the same srun step'
                         % (nodelist, len(hosts), per_node, len(counts)))
    if sum(counts) != num_tasks:
        raise SlurmError('SLURM_STEP_TASKS_PER_NODE %r places %d task(s), but %s is %d: both must '
                         'be of the same srun step' % (per_node, sum(counts), count_name,
                                                       num_tasks))
    if not 0 <= rank < num_tasks:
        raise SlurmError('SLURM_PROCID %d is out of range: the step has %d task(s), 0 to %d'
                         % (rank, num_tasks, num_tasks - 1))
    if not 0 <= ps_tasks < num_tasks:
        raise SlurmError('{ps_tasks} %d leaves no worker among the %d task(s) of the SLURM step: '
                         'give 0 to %d' % (ps_tasks, num_tasks, num_tasks - 1))
    if not 0 < port_base <= 65536 - max(counts):
        raise SlurmError('{port_base} %d does not fit: the %d task(s) of a node would take ports '
                         '%d to %d; give one from 1 to %d' % (
                             port_base, max(counts), port_base, port_base + max(counts) - 1,
                             65536 - max(counts)))
    places = [(host, local) for host, count in zip(hosts, counts) for local in range(count)]
    if 'SLURM_LOCALID' in environ and _number(environ, 'SLURM_LOCALID') != places[rank][1]:
        raise SlurmError('SLURM_LOCALID is %s, but task %d of a block distribution is task %d of '
                         'node %s: start srun with --distribution=block (its default), which '
                         "towers' ports follow" % (environ['SLURM_LOCALID'].strip(), rank,
                                                   places[rank][1], places[rank][0]))
    addresses = ['%s:%d' % (host, port_base + local) for host, local in places]
    jobs = {'worker': addresses[ps_tasks:]}
    if ps_tasks:
        jobs['ps'] = addresses[:ps_tasks]
    task = ('ps', rank) if rank < ps_tasks else ('worker', rank - ps_tasks)
    return (jobs,) + task
