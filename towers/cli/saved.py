"""`towers eval` and `towers export`: what is done with a logdir `towers train` wrote.

Both read its run.json (which model, dataset and options made it) and a
checkpoint: the one named, the best, or the newest that reads back whole. A
logdir a run is still training in is read as it stands, and they say so.
"""
import os

import tensorflow as tf

from towers import checkpoints, data, graph, models
from towers.callbacks.origin import read_origin
from towers.cli.config import flag
from towers.cli.datasets import SYNTHETIC
from towers.config import check
from towers.deviceplan import local_plan
from towers.errors import TowersError
from towers.evaluation import evaluate, format_metrics, split_size
from towers.logdir import in_use_by
from towers.model import ClassifierModel
from towers.names import RUN_FILE
from towers.tools import export


def saved_run(args, log):
    """(run.json, model_fn, checkpoint) of --logdir."""
    holder = in_use_by(args.logdir)
    if holder and not args.checkpoint and not args.best and (
            not os.path.exists(os.path.join(args.logdir, RUN_FILE))
            or not checkpoints.newest_complete(args.logdir)):
        raise TowersError('%s is in use by %s, which has not saved a checkpoint yet: wait for '
                          'its first one', args.logdir, holder)
    run = checkpoints.read_run(args.logdir)
    model_fn = models.build_model(run['model'], run['input_shape'], run['num_classes'],
                                  **run.get('model_options', {}))
    checkpoint = checkpoints.find_checkpoint(args.logdir, args.checkpoint, args.best)
    if holder and not args.checkpoint:
        log('%s is in use by %s: reading its %s checkpoint, %s'
            % (args.logdir, holder, 'best' if args.best else 'newest complete', checkpoint))
    return run, model_fn, checkpoint


def run_eval(args, log):
    """towers eval: a checkpoint's loss and accuracy over the whole test set."""
    from towers.cli.train import evaluation_split, image_test_set, records_test_set
    check('batch_size', args.batch_size)
    run, model_fn, checkpoint = saved_run(args, log)
    origin = None
    if run['dataset'].startswith('records:'):
        folder = run['dataset'].split(':', 1)[1]
        test_set, _ = records_test_set(folder, run['num_classes'])
        origin = 'records:%s test split' % folder
    elif run['dataset'].startswith(('imagenet:', 'tfds:')):
        test_set, _ = image_test_set(run['dataset'], run['input_shape'][0], run['num_classes'])
        origin = '%s %s split' % (run['dataset'], evaluation_split(run['dataset']))
    elif run['dataset'] == SYNTHETIC:
        raise TowersError('%s trained on %s, which has no test images', args.logdir, SYNTHETIC)
    else:
        test_set = data.load_dataset(run['dataset'], data_dir=args.data_dir or run['data_dir'],
                                     validation_size=0).test
    if not hasattr(test_set, 'batches'):  # (a streamed split is read at the run's shape)
        # The model is rebuilt from run.json: the data found now must fit it.
        data.check_images(test_set, run['input_shape'], origin=origin,
                          model='the model in %s' % os.path.join(args.logdir, RUN_FILE))
    plan = local_plan(args.towers, args.param_device, devices=args.devices,
                      logical_gpus=args.logical_gpus)
    model = ClassifierModel(model_fn, run['input_shape'], run['num_classes'],
                            normalization=run.get('normalization'))
    ema = run.get('ema', False)
    # In the precision it trained in, as its in-training evaluations were, unless asked.
    precision = args.precision or run.get('precision', 'fp32')
    built = graph.build_eval_graph(model, plan, ema=ema, precision=precision)
    with tf.compat.v1.Session(graph=built.graph, config=plan.config) as sess:
        checkpoints.restore(sess, built.saver, checkpoint, built.variables)
        values = evaluate(sess, built, test_set, args.batch_size)
    log('checkpoint: %s%s%s' % (checkpoint, ' (moving averages of the weights)' if ema else '',
                                ', computed in %s' % precision if precision != 'fp32' else ''))
    log('test: %s (%d images)' % (format_metrics(values), split_size(test_set)))
    stopped = read_origin(args.logdir)
    if stopped is not None:  # the run stopped at a NaN: what its replay found
        log('the run stopped at step %d, not finite: %s'
            % (stopped['step'], TowersError(stopped['line']).named(flag)))


def run_export(args, log):
    """towers export: a SavedModel of one tower that plain TensorFlow can serve."""
    run, model_fn, checkpoint = saved_run(args, log)
    export.export_saved_model(model_fn, run['input_shape'], checkpoint, args.out,
                              ema=run.get('ema', False), normalization=run.get('normalization'))
    log('exported %s as a SavedModel (signature %r: images -> probabilities, classes) to %s'
        % (checkpoint, export.SIGNATURE, args.out))
