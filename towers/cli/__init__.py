"""The `towers` command line.

  parsers.py    the parser, a subparser per command (TensorFlow-free); the flags of
                each family of commands in flags.py (shared), train_flags.py,
                tool_flags.py, saved_flags.py and cluster_flags.py
  config.py     the train flags as a TrainConfig; each setting's flag
  commands.py   models, devices, bench, check, explain, data convert
  train.py      towers train, and the signals that stop it cleanly
  saved.py      eval and export: what is done with a trained logdir
  cluster.py    towers server, and train on a cluster
  launcher.py   towers launch (TensorFlow-free: main.py runs it without TensorFlow)
  dataservice.py  towers data-service dispatcher|worker|bench
  main.py       main(): parse, run, and one line per error
"""
from towers.cli.main import main
from towers.cli.parsers import build_parser

__all__ = ['build_parser', 'main']
