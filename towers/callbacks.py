"""Callbacks: everything that happens around a training step, one concern each.

The Trainer (trainer.py) calls, in each callback's `order`:
  setup_graph(trainer)        while the graph is built (add ops, Savers)
  fetches(trainer) -> dict    tensors to run with every step
  wants_trace(trainer)        whether to trace the coming step (--trace)
  before_train(trainer)       session ready, variables initialised or restored
  after_step(trainer, values) values: the step's fetches, plus 'seconds'
  after_epoch(trainer)        every steps_per_epoch steps
  after_train(trainer)        the loop ended or was stopped (trainer.stopped)
  close()                     always, errors included
The NaN guard runs first, so nothing saves a step whose numbers are not finite;
checkpoints run next, so that an epoch's checkpoint is on disk before its
(possibly long) evaluation starts. Monitors that only
report (progress, TensorBoard, the stats file) are in monitors.py.
"""
import json
import os

import numpy as np
import tensorflow as tf

from towers.data.atomic import atomic_output
from towers.errors import TowersError
from towers.evaluation import format_metrics, split_size
from towers.export import save

tf1 = tf.compat.v1

CHECKPOINT_NAME = 'model.ckpt'
BEST_DIR = 'best'
BEST_FILE = 'best.json'


class Callback:
    """Base class: every hook does nothing."""

    order = 50

    def setup_graph(self, trainer):
        pass

    def fetches(self, trainer):
        return {}

    def wants_trace(self, trainer):
        """True to run the coming step (trainer.step + 1) fully traced; its
        RunMetadata then arrives in after_step's values['run_metadata']."""
        return False

    def before_train(self, trainer):
        pass

    def after_step(self, trainer, values):
        pass

    def after_epoch(self, trainer):
        pass

    def after_train(self, trainer):
        pass

    def close(self):
        pass


class Throughput:
    """images/sec over the steps since the last report.

    The first warmup_steps of this process are left out (graph optimisation and
    memory allocation happen there), also when a run resumes mid-way.
    """

    def __init__(self, warmup_steps):
        self.warmup_left = warmup_steps
        self.images = 0
        self.seconds = 0.0

    def add(self, images, seconds):
        if self.warmup_left > 0:
            self.warmup_left -= 1
        else:
            self.images += images
            self.seconds += seconds

    def take(self):
        rate = self.images / self.seconds if self.seconds else None
        self.images, self.seconds = 0, 0.0
        return rate


class NaNGuard(Callback):
    """Stop at the first step whose loss or applied gradient is NaN or Inf.

    It runs before the checkpoint callbacks, so the bad step is never saved and
    the newest checkpoint holds finite weights.
    """

    order = 0

    def fetches(self, trainer):
        return {'finite': trainer.graph.finite}

    def after_step(self, trainer, values):
        if values['finite']:
            return
        loss = values['loss']
        if not np.isfinite(loss):
            message = 'loss is %s at step %d; lower --lr' % (loss, trainer.step)
        else:
            message = ('a gradient is NaN or Inf at step %d (loss %.4g); lower --lr or clip '
                       'with --clip-norm' % (trainer.step, loss))
        saved = [c.last_saved for c in trainer.callbacks
                 if isinstance(c, Checkpoint) and c.last_saved]
        if saved:
            message += ' (%s, saved before it, is intact)' % saved[0]
        raise TowersError(message)


class Checkpoint(Callback):
    """Save the shared variables every K steps, at each epoch end and at the end.

    Keeps the newest `keep` checkpoints in the logdir (older ones are deleted,
    also across resumes). The data order's settings are variables too, so a
    checkpoint says which batches come next.

    Args:
      every_steps: save every this many steps (0: only epochs and the end).
      keep: how many of the newest checkpoints to keep.
      at_epoch_end: also save when an epoch ends.
    """

    order = 15

    def __init__(self, every_steps=500, keep=5, at_epoch_end=True):
        self.every_steps, self.keep, self.at_epoch_end = every_steps, keep, at_epoch_end
        self.saver, self.last_saved, self._saved_step = None, None, None

    def setup_graph(self, trainer):
        if not trainer.logdir:
            raise TowersError('the Checkpoint callback needs a logdir')
        self.prefix = os.path.join(trainer.logdir, CHECKPOINT_NAME)
        # One copy of each variable (local ones hold input state; replicas are copies).
        # Relative paths in the state file: a logdir copied or moved still resumes
        # from its own files, not from the folder it was written in.
        self.saver = tf1.train.Saver(trainer.graph.strategy.saved_variables(),
                                     max_to_keep=self.keep, save_relative_paths=True)
        self.weights_finite = weights_finite()

    def before_train(self, trainer):
        state = tf1.train.get_checkpoint_state(trainer.logdir)
        if state and state.model_checkpoint_path:
            # A fresh Saver knows none of the earlier checkpoints: without this it
            # would drop them from the state file and never delete them (keep).
            self.saver.recover_last_checkpoints(state.all_model_checkpoint_paths)
            self.last_saved = state.model_checkpoint_path

    def save(self, trainer):
        if self._saved_step != trainer.step:
            check_weights(trainer, self.weights_finite, self.last_saved)
            self.last_saved = save(self.saver, trainer.sess, self.prefix, trainer.step)
            self._saved_step = trainer.step

    def after_step(self, trainer, values):
        if self.every_steps and trainer.step % self.every_steps == 0:
            self.save(trainer)

    def after_epoch(self, trainer):
        if self.at_epoch_end:
            self.save(trainer)

    def after_train(self, trainer):
        self.save(trainer)
        trainer.log('checkpoint: %s' % self.last_saved)


class Evaluate(Callback):
    """Evaluate on a held-out split every few epochs, exactly, spread over the towers.

    Every example counts once, the last partial batch included (trainer.evaluate).
    With a logdir and best_metric, the best checkpoint so far on the validation
    set is kept apart in logdir/best/ with best.json saying its metric, value
    and step. Without a validation set the test set is evaluated but no best
    checkpoint is kept: one chosen on the test set would flatter its test score.

    Args:
      split: 'validation' or 'test'; None: validation when it has examples,
        else test.
      every_epochs: evaluate after every this many epochs, and at the end of
        a run that ends mid-epoch.
      best_metric: 'accuracy', 'loss' or another metric of the model; 'auto'
        is accuracy when the model has it, else loss; None keeps no best. A
        name ending in 'loss' or 'error' is better lower, others higher.
    """

    order = 20

    def __init__(self, split=None, every_epochs=1, best_metric=None):
        self.split, self.every_epochs, self.best_metric = split, every_epochs, best_metric
        self.best, self.saver, self._evaluated_step = None, None, None

    def setup_graph(self, trainer):
        known = ['loss'] + sorted(trainer.graph.eval_metrics)
        if self.best_metric == 'auto':
            self.best_metric = 'accuracy' if 'accuracy' in known else 'loss'
        if self.best_metric and self.best_metric not in known:
            raise TowersError('--best-metric %r is not a metric of this model; choose one of: %s'
                              % (self.best_metric, ', '.join(known)))
        if self.split is None:
            self.split = 'validation' if split_size(trainer.data, 'validation') else 'test'
        if not split_size(trainer.data, self.split):
            raise TowersError('cannot evaluate on the %s set: it is empty' % self.split)
        if self.best_metric and trainer.logdir and self.split != 'validation':
            trainer.log('no validation set: evaluating on %s, keeping no best checkpoint '
                        '(hold some training data out with --validation-size N)' % self.split)
        elif self.best_metric and trainer.logdir:
            self.folder = os.path.join(trainer.logdir, BEST_DIR)
            self.saver = tf1.train.Saver(trainer.graph.strategy.saved_variables(),
                                         max_to_keep=1, save_relative_paths=True)
            self.weights_finite = weights_finite()

    def before_train(self, trainer):
        if self.saver:
            try:
                with open(os.path.join(self.folder, BEST_FILE), encoding='utf-8') as f:
                    self.best = json.load(f)
            except (OSError, ValueError):
                self.best = None
            state = tf1.train.get_checkpoint_state(self.folder)
            if state and state.all_model_checkpoint_paths:
                # So that the next best replaces the one a resumed run left here.
                self.saver.recover_last_checkpoints(state.all_model_checkpoint_paths)

    def after_epoch(self, trainer):
        if round(trainer.epoch) % self.every_epochs == 0:
            self._evaluate(trainer)

    def after_train(self, trainer):
        if not trainer.stopped and self._evaluated_step != trainer.step:
            self._evaluate(trainer)

    def _evaluate(self, trainer):
        values = trainer.evaluate(self.split)
        self._evaluated_step = trainer.step
        trainer.epoch_stats[self.split] = values
        trainer.log('%s at epoch %.2f: %s (%d images)' % (
            self.split, trainer.epoch, format_metrics(values),
            split_size(trainer.data, self.split)))
        if self.saver and self._improves(values[self.best_metric]):
            self._save_best(trainer, values[self.best_metric])

    def _improves(self, value):
        if self.best is None or self.best.get('metric') != self.best_metric:
            return True
        lower = self.best_metric.endswith(('loss', 'error'))
        return value < self.best['value'] if lower else value > self.best['value']

    def _save_best(self, trainer, value):
        check_weights(trainer, self.weights_finite)
        os.makedirs(self.folder, exist_ok=True)
        path = save(self.saver, trainer.sess, os.path.join(self.folder, CHECKPOINT_NAME),
                    trainer.step)
        self.best = {'metric': self.best_metric, 'value': value, 'step': trainer.step,
                     'split': self.split, 'checkpoint': os.path.basename(path)}
        # Written after the checkpoint it names: a crash in between leaves the older record.
        with atomic_output(os.path.join(self.folder, BEST_FILE), suffix='.json') as out:
            out.write(json.dumps(self.best, indent=1, sort_keys=True).encode())
        trainer.log('best %s %s %.4f so far: %s' % (self.split, self.best_metric, value, path))


def weights_finite():
    """Scalar bool op: every float global variable of the default graph is finite."""
    with tf1.name_scope('weights_finite'):
        checks = []
        for var in tf1.global_variables():
            if var.dtype.base_dtype.is_floating:
                with tf.device(var.device):
                    checks.append(tf.reduce_all(tf.math.is_finite(var)))
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def check_weights(trainer, finite_op, last_saved=None):
    """Refuse to save weights that hold NaN or Inf (a step can overflow them with a finite loss)."""
    if not trainer.sess.run(finite_op):
        raise TowersError('the weights hold NaN or Inf after step %d, so no checkpoint was '
                          'written%s; lower --lr' % (trainer.step, ' (%s, saved before it, '
                                                     'is intact)' % last_saved
                                                     if last_saved else ''))
