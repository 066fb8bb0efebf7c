"""The whole training graph in a fresh tf.Graph, wired as the classic recipe.

input source (inputs.py) -> towers (tower.py) -> build_train_op (gradients.py:
the average and the one apply_gradients) -> evaluation towers sharing the
variables. Nothing here adds math of its own.
"""
import collections

import tensorflow as tf

from towers.errors import TowersError
from towers.gradients import build_train_op
from towers.inputs import FeedInput
from towers.tower import build_towers, build_towers_from_slices

tf1 = tf.compat.v1

OPTIMIZERS = ('sgd', 'momentum', 'adam')

TrainGraph = collections.namedtuple(
    'TrainGraph', ['graph', 'source', 'towers', 'train_op', 'loss', 'correct', 'batch',
                   'global_step', 'eval_images', 'eval_labels', 'eval_loss', 'eval_correct',
                   'init_op', 'saver'])
TrainGraph.__doc__ = """Handles on a built training graph.

  graph: the tf.Graph holding everything.
  source: the InputSource the training towers read (towers/inputs.py).
  towers: the training Towers.
  train_op: runs one synchronous step over all towers.
  loss: scalar float32, the global batch's mean loss (towers weighted by share).
  correct: scalar int32, correct predictions over the global batch.
  batch: scalar int32, the size of that global batch.
  global_step: the int64 step counter.
  eval_images, eval_labels: placeholders [None, H, W, C] float32 and [None]
    int64 feeding the inference-mode (training=False) towers, which share the
    variables; eval_loss and eval_correct are what they compute.
  init_op, saver: global and local variable initializer; a Saver of all
    global variables.
"""


def make_optimizer(name, learning_rate, momentum=0.9):
    """A tf.compat.v1 optimizer by name: 'sgd', 'momentum' or 'adam'."""
    if learning_rate <= 0:
        raise TowersError('--lr must be positive, got %g' % learning_rate)
    if name == 'sgd':
        return tf1.train.GradientDescentOptimizer(learning_rate)
    if name == 'momentum':
        return tf1.train.MomentumOptimizer(learning_rate, momentum)
    if name == 'adam':
        return tf1.train.AdamOptimizer(learning_rate)
    raise TowersError('unknown optimizer %r; choose one of: %s' % (name, ', '.join(OPTIMIZERS)))


def weighted_loss(towers):
    """The global batch's mean loss: each tower's mean weighted by its share."""
    return tf.add_n([t.weight * t.loss for t in towers], name='loss')


def build_training_graph(model_fn, input_shape, tower_devices, optimizer_fn,
                         param_device='/cpu:0', seed=None, source=None):
    """Build a fresh tf.Graph with training and evaluation towers.

    Args:
      model_fn: callable(images, training) -> logits.
      input_shape: (H, W, C) of one example.
      tower_devices: one device string per tower.
      optimizer_fn: callable() -> tf.compat.v1 optimizer, called inside the
        graph (optimizers create their slots in the default graph).
      param_device: where the variables live.
      seed: graph-level random seed (initializers, dropout), or None.
      source: the InputSource of the training batches; default a FeedInput
        (placeholders fed by the Session loop).
    Returns:
      A TrainGraph.
    """
    source = source or FeedInput()
    graph = tf.Graph()
    with graph.as_default():
        if seed is not None:
            tf1.set_random_seed(seed)
        slices = source.build(input_shape, tower_devices)
        with tf.device(param_device):
            global_step = tf1.train.get_or_create_global_step()
        opt = optimizer_fn()
        towers = build_towers_from_slices(model_fn, slices, tower_devices, param_device,
                                          optimizer=opt, training=True)
        train_op, _ = build_train_op(towers, opt, global_step)
        evaluation = _eval_towers(model_fn, input_shape, tower_devices, param_device, reuse=True)
        with tf.device('/cpu:0'):
            loss = weighted_loss(towers)
            correct = tf.add_n([t.correct for t in towers], name='correct')
            batch = tf.add_n([t.count for t in towers], name='batch')
        init_op = tf.group(tf1.global_variables_initializer(),
                           tf1.local_variables_initializer(), name='init')
        saver = tf1.train.Saver(max_to_keep=5)
    graph.finalize()
    return TrainGraph(graph, source, towers, train_op, loss, correct, batch, global_step,
                      *evaluation, init_op, saver)


def _eval_towers(model_fn, input_shape, tower_devices, param_device, reuse):
    """Inference-mode towers on their own placeholders.

    Returns:
      (images, labels, loss, correct): placeholders [None, H, W, C] float32 and
      [None] int64, the weighted mean loss and the correct count.
    """
    images = tf1.placeholder(tf.float32, [None] + list(input_shape), name='eval_images')
    labels = tf1.placeholder(tf.int64, [None], name='eval_labels')
    with tf1.name_scope('eval'):
        towers = build_towers(model_fn, images, labels, tower_devices, param_device,
                              training=False, reuse=reuse)
    with tf.device('/cpu:0'):
        loss = weighted_loss(towers)
        correct = tf.add_n([t.correct for t in towers], name='eval_correct')
    return images, labels, loss, correct


EvalGraph = collections.namedtuple(
    'EvalGraph', ['graph', 'eval_images', 'eval_labels', 'eval_loss', 'eval_correct', 'saver'])
EvalGraph.__doc__ = """An inference-only graph over the towers, for `evaluate` after training.

  The fields mean what they mean in TrainGraph; saver restores the model's
  variables from a training checkpoint (optimizer slots are not needed).
"""


def build_eval_graph(model_fn, input_shape, tower_devices, param_device='/cpu:0'):
    """A fresh tf.Graph with only the inference-mode towers."""
    graph = tf.Graph()
    with graph.as_default():
        evaluation = _eval_towers(model_fn, input_shape, tower_devices, param_device,
                                  reuse=False)
        saver = tf1.train.Saver(tf1.global_variables())
    graph.finalize()
    return EvalGraph(graph, *evaluation, saver)
