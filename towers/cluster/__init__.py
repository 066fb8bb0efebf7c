"""towers across processes and machines, on TensorFlow's own gRPC runtime.

  spec.py       which cluster and which task: TF_CONFIG, or --cluster FILE (TensorFlow-free)
  server.py     a task's tf.compat.v1.train.Server, its ConfigProto, `towers server`
  launch.py     every task of a cluster as a process of this machine (`towers launch`)
  placement.py  where a run's towers, variables and host ops go, in one process or a cluster
  ingraph.py    in-graph replication: the chief's graph over every task, a step timeout,
                and the lost task named
"""
