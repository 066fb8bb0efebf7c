"""What the callback tests share: easy digits, a one-tower Trainer, a hook recorder, disk probes."""
import json
import os
import re

import numpy as np
import tensorflow as tf

from tests import easy_digits
from towers import callbacks as cb
from towers import data, models
from towers.model import ClassifierModel
from towers.trainer import Trainer

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)
NUM_TRAIN, NUM_VALIDATION, NUM_TEST = 60, 23, 17
HOOKS = ('setup_graph', 'fetches', 'before_train', 'after_step', 'after_epoch', 'after_train',
         'close')


images_and_labels = easy_digits.images_and_labels


def easy_datasets(train=NUM_TRAIN, validation=0, test=NUM_TEST, seed=0):
    """data.Datasets of easy digits; a split of size 0 is an empty DataSet."""
    rng = np.random.RandomState(seed)
    splits = [data.DataSet(*images_and_labels(num, rng)) if num else
              data.DataSet(np.zeros([0, *SHAPE], np.float32), np.zeros([0], np.int64))
              for num in (train, validation, test)]
    return data.Datasets(*splits)


def model_fn(name='small_convnet'):
    return models.build_model(name, SHAPE, 10)


def make_trainer(callbacks, lines, datasets=None, optimizer='sgd', model=None, **options):
    """A Trainer on one CPU tower with a tiny batch; its log goes into lines."""
    settings = dict(towers=['/cpu:0'], batch_size=10, learning_rate=0.05, warmup_steps=0)
    settings.update(options)
    model = model or ClassifierModel(model_fn(), SHAPE, 10, optimizer=optimizer)
    return Trainer(model, datasets or easy_datasets(), callbacks=callbacks, log=lines.append,
                   **settings)


class Recorder(cb.Callback):
    """Records each hook as (hook, trainer.step) and what the trainer showed it."""

    def __init__(self, order=50, fail_at_step=None, journal=None, fetch=None):
        self.order, self.fail_at_step, self.fetch = order, fail_at_step, fetch
        self.calls, self.values, self.epoch_stats = [], [], []
        self.journal = [] if journal is None else journal  # (order, hook) of all recorders

    def _record(self, hook, step):
        self.calls.append((hook, step))
        self.journal.append((self.order, hook))

    def setup_graph(self, trainer):
        self._record('setup_graph', trainer.step)
        # fetch: name -> callable(trainer) -> tensor, run with every step.
        self.tensors = {name: make(trainer) for name, make in (self.fetch or {}).items()}

    def fetches(self, trainer):
        self._record('fetches', trainer.step)
        return self.tensors

    def before_train(self, trainer):
        self._record('before_train', trainer.step)

    def after_step(self, trainer, values):
        self._record('after_step', trainer.step)
        self.values.append(dict(values))
        if trainer.step == self.fail_at_step:
            raise RuntimeError('failing at step %d on purpose' % trainer.step)

    def after_epoch(self, trainer):
        self._record('after_epoch', trainer.step)
        self.epoch_stats.append({split: dict(results)
                                 for split, results in trainer.epoch_stats.items()})

    def after_train(self, trainer):
        self._record('after_train', trainer.step)

    def close(self):
        self._record('close', None)


def index_steps(folder):
    """Steps of the model.ckpt-<step> checkpoints with any file on disk in folder."""
    return sorted({int(re.match(r'model\.ckpt-(\d+)\.', name).group(1))
                   for name in os.listdir(folder) if name.startswith('model.ckpt-')})


def state_steps(folder):
    state = tf1.train.get_checkpoint_state(folder)
    assert state is not None, 'no checkpoint state in %s' % folder
    return [int(path.rsplit('-', 1)[1]) for path in state.all_model_checkpoint_paths]


def finite_variables(checkpoint):
    """Names of the checkpoint's float variables, asserting each is all finite."""
    names = []
    for name, _ in tf1.train.list_variables(checkpoint):
        value = np.asarray(tf.train.load_variable(checkpoint, name))
        if np.issubdtype(value.dtype, np.floating):
            assert np.all(np.isfinite(value)), name
            names.append(name)
    return names


def eval_lines(lines):
    return [line for line in lines if ' at epoch ' in line]


def stats_lines(logdir):
    with open(os.path.join(logdir, 'stats.jsonl'), encoding='utf-8') as f:
        return [json.loads(line) for line in f]


def step_lines(lines):
    return [line for line in lines if line.startswith('step ')]
