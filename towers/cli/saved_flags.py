"""The flags of what is done with a trained run: `towers eval` and `towers export`.

TensorFlow-free, as parsers.py, which adds them to its parser.
"""
from towers.cli.flags import device_flags
from towers.names import PRECISIONS


def _saved_run_flags(parser, verb):
    """Which trained run, and which of its checkpoints (eval and export)."""
    parser.add_argument('--logdir', required=True, help='the folder `towers train` wrote')
    parser.add_argument('--checkpoint', default=None,
                        help='a checkpoint prefix (default: the newest in --logdir)')
    parser.add_argument('--best', action='store_true',
                        help='%s the best checkpoint (LOGDIR/best) instead of the newest' % verb)


def eval_parser(commands):
    """towers eval: a trained run's checkpoint on the test set."""
    evaluate = commands.add_parser('eval', help="test a trained run's checkpoint")
    _saved_run_flags(evaluate, 'use')
    evaluate.add_argument('--data-dir', default=None, help='where the dataset is (default: as '
                                                           'trained)')
    evaluate.add_argument('--batch-size', type=int, default=100,
                          help='global evaluation batch (default: 100)')
    evaluate.add_argument('--precision', default=None, choices=PRECISIONS,
                          help='compute in this precision (default: the one it trained in; '
                               'its weights are float32 whatever it was)')
    device_flags(evaluate)
    return evaluate


def export_parser(commands):
    """towers export: a SavedModel of one tower."""
    export = commands.add_parser('export', help='write a SavedModel of one tower')
    _saved_run_flags(export, 'export')
    export.add_argument('--out', required=True, help='the SavedModel folder to create')
    return export
