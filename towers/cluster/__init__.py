"""towers across processes and machines, on TensorFlow's own gRPC runtime.

  spec.py     which cluster and which task: TF_CONFIG, or --cluster FILE (TensorFlow-free)
  server.py   a task's tf.compat.v1.train.Server, its ConfigProto, `towers server`
  launch.py   every task of a cluster as a process of this machine (`towers launch`)
"""
