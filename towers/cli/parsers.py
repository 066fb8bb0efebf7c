"""The `towers` parser: a subparser per command, each command's flags from its family's module.

TensorFlow-free, so that `towers --help` is instant: the choices come from
towers/names.py, and towers.data is numpy-only. The flags, by family:
  flags.py          what several commands share (devices, model, precision)
  train_flags.py    towers train
  tool_flags.py     bench, plan, explain, check
  saved_flags.py    eval, export
  cluster_flags.py  server, launch, and train's cluster flags
and here the small ones (devices, models, data convert, data-service). What each command
does is in commands.py, train.py, saved.py and cluster.py; the train flags
become a TrainConfig in config.py.
"""
import argparse

from towers.cli.cluster_flags import launch_parser, server_parser
from towers.cli.flags import device_flags
from towers.cli.saved_flags import eval_parser, export_parser
from towers.cli.tool_flags import bench_parser, check_parser, explain_parser, plan_parser
from towers.cli.train_flags import train_parser
from towers.data import DEFAULT_DATASET


def build_parser():
    """The `towers` argument parser: global flags, then a subparser per command."""
    parser = argparse.ArgumentParser(
        prog='towers', description='Graph-mode multi-tower data-parallel training (tf.compat.v1).')
    parser.add_argument('--debug', action='store_true', help='show tracebacks on errors')
    commands = parser.add_subparsers(dest='command', metavar='COMMAND')
    commands.required = True
    for add in (train_parser, devices_parser, bench_parser, explain_parser, check_parser,
                models_parser, eval_parser, export_parser, data_parser, server_parser,
                launch_parser, plan_parser, data_service_parser):
        add(commands)
    return parser


def devices_parser(commands):
    """towers devices: the devices a run would use."""
    devices = commands.add_parser('devices', help='print the devices a run would use')
    device_flags(devices)
    return devices


def models_parser(commands):
    """towers models: the model and dataset names."""
    parser = commands.add_parser('models', help='list the models (each with its input, '
                                                'parameters and FLOPs) and the datasets')
    parser.add_argument('names', nargs='*', metavar='NAME',
                        help='only these models (default: every one; counting them all '
                             'builds each graph, some 12 s)')
    return parser


def data_parser(commands):
    """towers data convert: a dataset as TFRecord shards."""
    data_command = commands.add_parser('data', help='dataset tools')
    data_actions = data_command.add_subparsers(dest='action', metavar='ACTION')
    data_actions.required = True
    convert = data_actions.add_parser(
        'convert', help='write a dataset as TFRecord shards + manifest, for --dataset records:DIR')
    convert.add_argument('--dataset', default=DEFAULT_DATASET, help='dataset to convert')
    convert.add_argument('--from-folder', default=None, metavar='DIR',
                         help='instead of --dataset: a folder of class subfolders of JPEG/PNG '
                              'images (as ImageFolder reads), written as ImageNet-format '
                              'shards for --dataset imagenet:OUT')
    convert.add_argument('--validation-folder', default=None, metavar='DIR',
                         help='with --from-folder: the validation images, the same classes')
    convert.add_argument('--workers', type=int, default=None,
                         help='with --from-folder: processes writing shards (default: the CPU '
                              'count, at most 8)')
    convert.add_argument('--skip-bad-images', action='store_true',
                         help='with --from-folder: leave out (and name) files that do not '
                              'decode instead of stopping')
    convert.add_argument('--data-dir', default=None, help='where its files are (as for train)')
    convert.add_argument('--shards', type=int, default=4, help='shards per split (default: 4)')
    convert.add_argument('--out', required=True, help='the records folder to create')
    return data_command


def data_service_parser(commands):
    """towers data-service dispatcher|worker|bench: the tf.data service of --data-service."""
    service = commands.add_parser(
        'data-service', help="run the tf.data service that `train --data-service` sends its "
                             'input pipeline to (until SIGTERM or SIGINT)')
    actions = service.add_subparsers(dest='action', metavar='ACTION')
    actions.required = True
    dispatcher = actions.add_parser('dispatcher', help='hand the trainers\' pipelines out to '
                                                       'the workers; logs them as they come '
                                                       'and go')
    dispatcher.add_argument('--port', type=int, required=True, help='the port to serve on')
    worker = actions.add_parser('worker', help="run trainers' pipelines: read the shards "
                                               '(at the path the trainers give), decode, '
                                               'crop, batch')
    worker.add_argument('--dispatcher', required=True, metavar='HOST:PORT',
                        help='the dispatcher (grpc://HOST:PORT works too)')
    worker.add_argument('--port', type=int, default=0,
                        help='the port to serve on (default: any free one)')
    worker.add_argument('--host', default='localhost',
                        help='the name the trainers reach this worker by (default: localhost, '
                             'for trainers on this machine)')
    worker.add_argument('--wait', type=float, default=60.0, metavar='SECONDS',
                        help='how long to wait for the dispatcher to answer (default: 60)')
    bench = actions.add_parser('bench', help='images/sec of a pipeline read in this process '
                                             'and through 1, 2, ... local service workers, '
                                             'in turns')
    bench.add_argument('--dataset', required=True,
                       help='records:DIR, imagenet:DIR or tfds:DIR: its training split')
    bench.add_argument('--workers', default='0,1,2',
                       help='comma-separated service worker counts; 0: in this process '
                            '(default: 0,1,2)')
    bench.add_argument('--image-size', type=int, default=None,
                       help='the side JPEGs of any size are cropped to (default: 224)')
    bench.add_argument('--batch-size', type=int, default=64, help='(default: 64)')
    bench.add_argument('--warmup', type=int, default=10,
                       help='untimed batches per block (default: 10)')
    bench.add_argument('--window', type=int, default=50,
                       help='timed batches per row, in --rounds blocks (default: 50)')
    bench.add_argument('--rounds', type=int, default=5,
                       help='blocks per row, the rows in turns (default: 5)')
    return service
