"""towers across processes and machines, on TensorFlow's own gRPC runtime.

  spec.py        which cluster and which task: TF_CONFIG (TFJob's chief/master/evaluator
                 too), or --cluster FILE (TensorFlow-free)
  slurm.py       the cluster of a SLURM step, from the variables srun sets
  dataservice.py the tf.data service's servers (`towers data-service`) and the watch on them
  server.py      a task's tf.compat.v1.train.Server, its ConfigProto, `towers server`
  launch.py      every task of a cluster as a process of this machine (`towers launch`)
  placement.py   the device plan of a task in a cluster (in-graph: the whole cluster's)
  collective.py  the workers' all-reduce: packed gradients, the chief's values broadcast
  syncreplicas.py  parameter-server mode: SyncReplicasOptimizer's exact update, the sessions
  runtime.py     a task's part in a cluster run: step timeouts, the lost task named, the
                 stop vote and the workers' fingerprint
  modes.py       the cluster modes, a class each (a towers.distribution.Run)
"""
