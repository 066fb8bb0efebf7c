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
from towers.cluster.collective import bucket_bytes
from towers.cluster.server import serve, server_config
from towers.cluster.spec import ClusterError, resolve
from towers.devices import task_gpus
from towers.names import ALL_REDUCE_BUCKET


def cluster_of(args):
    """This process's Cluster from its flags, TF_CONFIG or SLURM's variables, or None."""
    return resolve(args.cluster, args.task_type, args.task_index,
                   ps_tasks=getattr(args, 'ps_tasks', None),
                   port_base=getattr(args, 'port_base', None))


def _not_the_evaluator(cluster):
    if cluster.is_evaluator:
        raise ClusterError('this task is the evaluator, outside the training cluster: it '
                           "serves nothing; run towers train there, with the chief's {logdir}")


def run_server(args, log):
    """towers server: this task's server until SIGTERM or SIGINT."""
    cluster = cluster_of(args)
    if cluster is None:
        raise ClusterError('towers server needs a cluster: set TF_CONFIG, or give {cluster} '
                           'FILE.json {task_type} and {task_index}')
    _not_the_evaluator(cluster)
    serve(cluster, server_config(cluster, args.towers, args.threads), log=log)


def cluster_run(args, cluster, log):
    """This task's ClusterRun of a train command, or None once a task that only serves is done."""
    _not_the_evaluator(cluster)
    mode = args.cluster_mode or 'in-graph'
    towers = args.towers  # None: every GPU the task sees, or one CPU
    num_gpus = task_gpus(args.devices)  # --devices cpu: virtual CPUs, on GPU hosts too
    if mode == 'collective':
        if cluster.num_ps:
            raise ClusterError('{cluster_mode} collective has no ps tasks: give the cluster '
                               'workers only, or use {cluster_mode} in-graph')
        if args.sync_bn:
            raise ClusterError('{sync_bn} pools batch norm over the towers of one process; '
                               '{cluster_mode} collective does not pool it across workers yet')
        if args.variable_update != 'parameter_server':
            raise ClusterError('{cluster_mode} collective keeps one copy of the variables per '
                               'worker: leave {variable_update} at parameter_server')
        bucket = args.all_reduce_bucket or ALL_REDUCE_BUCKET
        bucket_bytes(bucket, [])  # a bad size is refused before any server starts
        return modes.collective(cluster, towers, args.cluster_timeout, args.threads,
                                num_gpus=num_gpus, bucket=bucket)
    if args.all_reduce_bucket is not None:
        raise ClusterError('{all_reduce_bucket} sizes the all-reduce of {cluster_mode} '
                           'collective; %s mode has none' % mode)
    if mode == 'parameter-server':
        if args.ema is not None:
            raise ClusterError('{ema} is not kept in {cluster_mode} parameter-server yet: the '
                               "averages would follow every worker's push, not each update")
        if args.sync_bn:
            raise ClusterError('{sync_bn} pools batch norm over the towers of one process; '
                               '{cluster_mode} parameter-server does not pool it across '
                               'workers')
        if args.variable_update != 'parameter_server':
            raise ClusterError('{cluster_mode} parameter-server keeps one copy of the '
                               'variables on the ps tasks: leave {variable_update} at '
                               'parameter_server')
        if cluster.task_type == 'ps':  # the same command on every task: a ps task serves
            log('parameter-server mode: ps %d serves the variables' % cluster.task_index)
            serve(cluster, server_config(cluster, 1, args.threads, num_gpus=num_gpus), log=log)
            return None
        return modes.parameter_server(cluster, towers, args.cluster_timeout, args.threads,
                                      num_gpus=num_gpus)
    if args.variable_update != 'parameter_server':
        raise ClusterError('{cluster_mode} in-graph keeps one copy of the variables on the ps '
                           'tasks (or the chief): leave {variable_update} at parameter_server')
    if not cluster.is_chief:
        log('in-graph mode: %s %d serves; worker 0 trains' % (cluster.task_type,
                                                              cluster.task_index))
        serve(cluster, server_config(cluster, towers or 1, args.threads, num_gpus=num_gpus),
              log=log)
        return None
    return modes.in_graph(cluster, towers, args.cluster_timeout, args.threads,
                          num_gpus=num_gpus)
