"""`towers server`, and how `towers train` joins a cluster (`towers launch`: launcher.py).

A cluster comes from TF_CONFIG, --cluster FILE --task-type T --task-index K, or
a SLURM step (--cluster slurm, or srun of more than one task). In in-graph mode
the chief (worker 0) trains and every other task serves; in collective and
parameter-server mode every worker trains, and in parameter-server mode the ps
tasks serve. Either way the same `towers train` command can run on every host
(as Kubernetes' TFJob and srun run one command everywhere): on a task that only
serves, it serves.
"""
from towers.cluster import modes
from towers.cluster.server import serve, server_config
from towers.cluster.spec import ClusterError, resolve


def cluster_of(args):
    """This process's Cluster from its flags, TF_CONFIG or SLURM's variables, or None."""
    return resolve(args.cluster, args.task_type, args.task_index,
                   ps_tasks=getattr(args, 'ps_tasks', None),
                   port_base=getattr(args, 'port_base', None))


def run_server(args, log):
    """towers server: this task's server until SIGTERM or SIGINT."""
    cluster = cluster_of(args)
    if cluster is None:
        raise ClusterError('towers server needs a cluster: set TF_CONFIG, or give {cluster} '
                           'FILE.json {task_type} and {task_index}')
    modes.not_the_evaluator(cluster)
    serve(cluster, server_config(cluster, args.towers, args.threads), log=log)

