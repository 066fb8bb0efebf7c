"""The whole training graph in a fresh tf.Graph, wired as the classic recipe.

input source (inputs/) -> towers (tower.py, one per device, each running the
ModelDesc's build_graph) -> build_train_op (gradients.py: the average, weight
decay and gradient processors, the one apply_gradients) -> evaluation towers
sharing the variables. The learning rate follows its schedule (schedules.py);
an optional moving average of the weights is updated after each apply and read
by the evaluation towers. Nothing here adds math of its own.
"""
import collections

import tensorflow as tf

from towers.checkpoints import restore_map
from towers.config import check
from towers.gradients import count_weighted, weighted
from towers.model import normalize
from towers.placeholders import FedBatch
from towers.precision import Precision, all_finite, check_kernels
from towers.schedules import LearningRate
from towers.slicing import split_batch
from towers.tower import build_towers_from_slices
from towers.variables import make_strategy, variable_name

tf1 = tf.compat.v1

TrainGraph = collections.namedtuple(
    'TrainGraph', ['graph', 'source', 'towers', 'train_op', 'loss', 'metrics', 'batch',
                   'global_step', 'learning_rate', 'finite', 'ema', 'eval_images',
                   'eval_labels', 'eval_loss', 'eval_metrics', 'init_op', 'saver', 'strategy',
                   'sync_op', 'precision', 'loss_scale', 'plan'])
TrainGraph.__doc__ = """Handles on a built training graph.

  graph: the tf.Graph holding everything.
  source: the InputSource the training towers read (towers/inputs/); built
    without one, the FedBatch whose `images` and `labels` are fed by hand.
  towers: the training Towers.
  train_op: runs one synchronous step over all towers.
  loss: scalar float32, the global batch's mean cost (towers weighted by
    share), plus the weight-decay term when there is one.
  metrics: dict name -> scalar float32, the global batch's mean of each
    metric build_graph returned (e.g. 'accuracy').
  batch: scalar int32, the size of that global batch.
  global_step: the int64 step counter.
  learning_rate: scalar float32, the rate this step uses.
  finite: scalar bool, whether the loss and every applied gradient are finite
    (with a dynamic loss scale, a step it skips for a gradient that overflowed
    is finite while the scale is above 1: only the loss must be).
  ema: the tf.train.ExponentialMovingAverage of the weights, or None.
  eval_images, eval_labels: placeholders [None, H, W, C] float32 and [None]
    int64 feeding the inference-mode (training=False) towers, which share the
    variables (their moving averages, with ema); eval_loss and eval_metrics
    are what they compute.
  init_op, saver: global and local variable initializer; a Saver of the
    variables a checkpoint holds (one copy of each, whatever the strategy);
    None when built with finalize=False (the Trainer makes them with
    finalize_graph once its callbacks have added their ops).
  strategy: the --variable-update strategy (towers/variables.py).
  sync_op: copies the master variables onto their replicas; run it after
    init_op and after every restore (a no-op for parameter_server).
  precision: the towers.precision.Precision the towers compute in.
  loss_scale: its towers.precision.LossScale (fp16), or None.
  plan: the towers.deviceplan.DevicePlan it was built on.
"""


def weighted_loss(towers, name='loss'):
    """The global batch's mean loss: each tower's mean weighted by its share."""
    return tf.add_n([weighted(t.loss, t.weight) for t in towers], name=name)


def weighted_metrics(towers):
    """Each metric's global mean (float64), weighted by the towers' shares as the loss is."""
    return count_weighted([t.count for t in towers], [t.metrics for t in towers])


def build_training_graph(model, plan, seed=None, source=None, learning_rate=1e-3,
                         steps_per_epoch=1, ema_decay=None, finalize=True, strategy=None,
                         sync_bn=False, precision=None, total_steps=None, accumulate=1,
                         evaluation=True):
    """Build a fresh tf.Graph with training and evaluation towers.

    Args:
      model: a towers.model.ModelDesc (ClassifierModel wraps a model_fn).
      plan: the towers.deviceplan.DevicePlan: the towers' devices, where the
        variables live, the host ops, and in a cluster the task's own device.
      seed: graph-level random seed (initializers, dropout), or None.
      source: the InputSource of the training batches (towers/inputs/);
        default a FedBatch (towers/placeholders.py): the placeholders
        `images` and `labels`, fed by hand, that a FeedInput feeds.
      learning_rate: a float, or a towers.schedules.LearningRate.
      steps_per_epoch: what an epoch is, for a schedule counted in epochs.
      total_steps: the run's length, which a cosine schedule without its own decays over.
      ema_decay: keep an exponential moving average of the trainable
        variables with this decay (the CIFAR-10 tutorial's 0.9999), or None.
      finalize: finalize the graph; the Trainer says False, adds its
        callbacks' ops, then finalizes it itself.
      strategy: how the towers' gradients meet (towers/variables.py), e.g. a
        cluster mode's; None: the one of the plan's --variable-update.
      sync_bn: batch norms use the moments of the whole global batch, pooled
        over the towers; default: each tower its own slice's, and the moving
        averages from tower 0 (as tf_cnn_benchmarks).
      precision: a towers.precision.Precision or its name ('fp32', 'bf16',
        'fp16'): what the towers compute in, over float32 variables, and the
        loss scaling; None: float32.
      accumulate: K, each training tower's slice in K micro-batches one after
        another, their gradients summed (towers/tower.py micro_slices): the
        same update in about 1/K of the activations' memory.
      evaluation: build the inference-mode towers; False (a graph that only
        steps: bench's, a test's) leaves them out, and the eval_* fields None:
        a sixth of Inception v3's two-tower graph (22,357 ops to 18,510).
    Returns:
      A TrainGraph.
    """
    source = source or FedBatch()
    schedule = learning_rate if isinstance(learning_rate, LearningRate) else \
        LearningRate(learning_rate)
    check('ema', ema_decay)
    precision = Precision.of(precision)
    graph = tf.Graph()
    with graph.as_default(), tf1.device(plan.default_device):
        if seed is not None:
            tf1.set_random_seed(seed)
        strategy = strategy or make_strategy(plan)
        slices = source.build(model.input_shape, list(plan.towers))
        with tf.device(plan.host):
            global_step = tf1.train.get_or_create_global_step()
            rate = schedule.build(global_step, steps_per_epoch, total_steps)
            loss_scale = precision.build_loss_scale()
        # One optimizer per copy of the variables (each keeps its own slots).
        optimizers = [model.optimizer(rate)
                      for _ in (plan.towers if strategy.replicas else [None])]
        if loss_scale is not None:  # the first copy's apply moves the scale
            optimizers = [loss_scale.optimizer(o, primary=i == 0)
                          for i, o in enumerate(optimizers)]
        towers = build_towers_from_slices(model.tower_loss, slices, plan,
                                          optimizer=optimizers[0], training=True,
                                          sync_bn=sync_bn, precision=precision,
                                          accumulate=accumulate)
        decay = model.weight_decay()
        masters = [v for v in tf1.trainable_variables() if variable_name(v) == v.op.name]
        # The step's loss adds the decay of the weights it ran on: read before any update
        # (without the dependency the read and the apply race, and a step now and then
        # reported the decay of its updated weights).
        with tf.device('/cpu:0'):
            decay_term = decay.loss(masters) if decay is not None else None
        with tf.control_dependencies([decay_term] if decay_term is not None else []):
            train_op, applied = strategy.build_train_op(towers, optimizers, global_step, decay,
                                                        model.gradient_processors())
        loss, metrics, batch, finite = _step_results(towers, decay_term, applied, strategy,
                                                     loss_scale, train_op)
        train_op, ema = _moving_average(train_op, masters, global_step, ema_decay,
                                        loss_scale.gate if loss_scale else None)
        evaluation = (_eval_towers(model, plan.for_evaluation(), reuse=True, ema=ema,
                                   precision=precision) if evaluation else (None,) * 4)
        check_kernels(graph, precision, scopes=('tower_', 'eval/'))
        sync_op = strategy.sync_op()
        # Without finalize the caller adds variables of its own, then makes these.
        init_op, saver = finalize_graph(graph, strategy) if finalize else (None, None)
    eval_images, eval_labels, eval_loss, eval_metrics = evaluation
    return TrainGraph(
        graph=graph, source=source, towers=towers, train_op=train_op, loss=loss,
        metrics=metrics, batch=batch, global_step=global_step, learning_rate=rate,
        finite=finite, ema=ema, eval_images=eval_images, eval_labels=eval_labels,
        eval_loss=eval_loss, eval_metrics=eval_metrics, init_op=init_op, saver=saver,
        strategy=strategy, sync_op=sync_op, precision=precision, loss_scale=loss_scale,
        plan=plan)


def finalize_graph(graph, strategy, freeze=True):
    """(init_op of every variable, a Saver of what a checkpoint holds); the graph is frozen
    (unless not to freeze: a MonitoredSession that freezes it itself).

    The Trainer calls it once its callbacks have added their ops.
    """
    init_op = tf.group(tf1.global_variables_initializer(), tf1.local_variables_initializer(),
                       name='init')
    saver = tf1.train.Saver(strategy.saved_variables(), max_to_keep=5)
    if freeze:
        graph.finalize()
    return init_op, saver


def _moving_average(train_op, masters, global_step, ema_decay, applied=None):
    """(train_op that also updates the average, the ExponentialMovingAverage), or as given.

    applied: a dynamic loss scale's decision (scalar bool): a step it skips does
    not move the average either.
    """
    if ema_decay is None:
        return train_op, None
    # As the tutorial: the average follows each apply, and num_updates lets
    # it move fast early on.
    ema = tf1.train.ExponentialMovingAverage(ema_decay, num_updates=global_step)
    with tf.control_dependencies([train_op]):
        if applied is None:
            return tf.group(ema.apply(masters), name='train_op_ema'), ema
        return tf.group(tf.cond(applied, lambda: ema.apply(masters), tf.no_op),
                        name='train_op_ema'), ema


def _step_results(towers, decay_term, applied, strategy, loss_scale, train_op):
    """What a step reports: (loss, metrics, batch, finite), see TrainGraph."""
    with tf.device('/cpu:0'):
        loss, metrics, batch = strategy.step_results(
            weighted_loss(towers), weighted_metrics(towers),
            tf.add_n([t.count for t in towers], name='batch'))
        if decay_term is not None:
            loss = tf.add(loss, decay_term, name='total_loss')
        if loss_scale is not None and loss_scale.dynamic:
            # An overflow the scale can still halve away is skipped, not fatal: only
            # one at scale 1 is. Read once the update (the chief's, across processes)
            # has decided, whichever task's gradients overflowed.
            grads = tf.logical_not(loss_scale.stuck(train_op))
        else:
            grads = all_finite([g for g, _ in applied if g is not None])
        finite = tf.logical_and(all_finite([loss]), grads, name='finite')
    return loss, metrics, batch, finite


def _averaged(ema):
    """A custom getter that hands out each variable's moving average where there is one."""
    def averaged_getter(getter, name, *args, **kwargs):  # TF passes these by keyword
        var = getter(name, *args, **kwargs)
        average = ema.average(var)
        return var if average is None else average
    return averaged_getter


def _eval_towers(model, plan, reuse, ema=None, precision=None):
    """Inference-mode towers on their own placeholders, one shared copy of the variables.

    Returns:
      (images, labels, loss, metrics): placeholders [None, H, W, C] float32 and
      [None] int64, the weighted mean loss and metrics.
    """
    images = tf1.placeholder(tf.float32, [None] + list(model.input_shape), name='eval_images')
    labels = tf1.placeholder(tf.int64, [None], name='eval_labels')
    getter = _averaged(ema) if ema is not None else None
    with tf1.name_scope('eval'), \
            tf1.variable_scope(tf1.get_variable_scope(), custom_getter=getter,
                               auxiliary_name_scope=False):
        with tf.device('/cpu:0'):  # as the training input normalised its images
            normalized = normalize(images, getattr(model, 'normalization', None))
            slices = split_batch(normalized, labels, plan.num_towers)
        towers = build_towers_from_slices(model.tower_loss, slices, plan, training=False,
                                          reuse=reuse, precision=precision)
    with tf.device('/cpu:0'):
        loss = weighted_loss(towers, name='eval_loss')
        metrics = weighted_metrics(towers)
    return images, labels, loss, metrics


EvalGraph = collections.namedtuple(
    'EvalGraph', ['graph', 'eval_images', 'eval_labels', 'eval_loss', 'eval_metrics', 'saver',
                  'variables'])
EvalGraph.__doc__ = """An inference-only graph over the towers, for `evaluate` after training.

  The fields mean what they mean in TrainGraph; saver restores the model's
  variables from a training checkpoint (optimizer slots are not needed), or
  their moving averages into them when built with ema; variables is its
  var_list, checkpoint name -> variable.
"""


def build_eval_graph(model, plan, ema=False, precision=None):
    """A fresh tf.Graph with only the inference-mode towers (computing in precision)."""
    precision = Precision.of(precision)
    graph = tf.Graph()
    with graph.as_default():
        evaluation = _eval_towers(model, plan.for_evaluation(), reuse=False,
                                  precision=precision)
        check_kernels(graph, precision, scopes=('eval/',))
        variables = restore_map(ema)
        saver = tf1.train.Saver(variables)
    graph.finalize()
    return EvalGraph(graph, *evaluation, saver, variables)
