"""The `towers` command line.

  parsers.py    the flags, one function per command (TensorFlow-free)
  config.py     the train flags as a TrainConfig; each setting's flag
  commands.py   models, devices, bench, check, explain, data convert
  train.py      towers train, and the signals that stop it cleanly
  saved.py      eval and export: what is done with a trained logdir
  cluster.py    towers server, towers launch, and train on a cluster
  cluster_flags.py  their flags (TensorFlow-free)
  main.py       main(): parse, run, and one line per error
"""
from towers.cli.main import main
from towers.cli.parsers import build_parser

__all__ = ['build_parser', 'main']
