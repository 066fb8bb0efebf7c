"""Evaluate: exact evaluation on a held-out split, and the best checkpoint kept apart."""
import json
import os

from towers import checkpoints
from towers.callbacks.base import Callback
from towers.data.atomic import atomic_output
from towers.errors import SettingError, TowersError
from towers.evaluation import format_metrics, split_size
from towers.logdir import take_over
from towers.names import BEST_DIR, BEST_FILE


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
            raise SettingError('{best_metric} %r is not a metric of this model; choose one of: '
                               '%s', self.best_metric, ', '.join(known))
        if self.split is None:
            self.split = 'validation' if split_size(trainer.data, 'validation') else 'test'
        if not split_size(trainer.data, self.split):
            raise TowersError('cannot evaluate on the %s set: it is empty' % self.split)
        if self.best_metric and trainer.logdir and self.split != 'validation':
            trainer.log('no validation set: evaluating on %s, keeping no best checkpoint '
                        '(hold some training data out with --validation-size N)' % self.split)
        elif self.best_metric and trainer.logdir:
            self.folder = os.path.join(trainer.logdir, BEST_DIR)
            self.saver = checkpoints.make_saver(trainer.graph.strategy.saved_variables(), 1)
            self.weights_finite = checkpoints.weights_finite()

    def before_train(self, trainer):
        if self.saver:
            # So that the next best replaces the one a resumed run left here.
            take_over(self.folder, self.saver, trainer.log, BEST_DIR)
            self.best = self._read_best(trainer)

    def _read_best(self, trainer):
        """best.json, when it describes the checkpoint best/ holds; else None."""
        try:
            with open(os.path.join(self.folder, BEST_FILE), encoding='utf-8') as f:
                best = json.load(f)
        except (OSError, ValueError):
            return None
        kept = checkpoints.newest_complete(self.folder)
        kept_name = kept and os.path.basename(kept)
        if not isinstance(best, dict) or best.get('checkpoint') != kept_name:
            # A run stopped between saving a best checkpoint and recording it:
            # the record is another checkpoint's, so the next evaluation replaces both.
            trainer.log('%s does not describe %s; the next evaluation keeps its checkpoint '
                        'as the best' % (os.path.join(self.folder, BEST_FILE), kept))
            return None
        return best

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
        checkpoints.check_weights(trainer.sess, self.weights_finite, trainer.step)
        os.makedirs(self.folder, exist_ok=True)
        path = checkpoints.save(self.saver, trainer.sess, self.folder, trainer.step)
        self.best = {'metric': self.best_metric, 'value': value, 'step': trainer.step,
                     'split': self.split, 'checkpoint': os.path.basename(path)}
        # Written after the checkpoint it names: a crash in between leaves the older record.
        with atomic_output(os.path.join(self.folder, BEST_FILE), suffix='.json') as out:
            out.write(json.dumps(self.best, indent=1, sort_keys=True).encode())
        trainer.log('best %s %s %.4f so far: %s' % (self.split, self.best_metric, value, path))
