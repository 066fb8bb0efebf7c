"""The Checkpoint callback: every K steps and each epoch, the newest kept, refused resumes."""
import json
import os

import pytest
import tensorflow as tf

from tests.callbacks.common import (
    NUM_TRAIN,
    NUM_VALIDATION,
    SHAPE,
    easy_datasets,
    index_steps,
    make_trainer,
    model_fn,
    state_steps,
)
from tests.harness import snapshot
from towers import callbacks as cb
from towers.callbacks import default_callbacks
from towers.config import TrainConfig
from towers.errors import TowersError
from towers.model import ClassifierModel

tf1 = tf.compat.v1


class _SaveRecorder(cb.Checkpoint):
    """A Checkpoint that records the step of every save its Saver really makes."""

    def setup_graph(self, trainer):
        super().setup_graph(trainer)
        self.saved = []
        save = self.saver.save

        def recording_save(sess, save_path, global_step=None, **kwargs):
            self.saved.append(global_step)
            return save(sess, save_path, global_step=global_step, **kwargs)
        self.saver.save = recording_save


def test_checkpoints_at_epoch_ends_and_every_k_steps_keep_the_newest_across_a_resume(
        tmp_path):
    logdir = str(tmp_path / 'run')
    checkpoint, lines = _SaveRecorder(every_steps=3, keep=2), []
    result = make_trainer([checkpoint], lines, steps_per_epoch=5, steps=12,
                          logdir=logdir).train()
    # Every 3 steps and at the ends of epochs (5, 10); 12 is both due and the end:
    # one save per step all the same.
    assert checkpoint.saved == [3, 5, 6, 9, 10, 12]
    assert index_steps(logdir) == [10, 12]
    assert state_steps(logdir) == [10, 12]
    newest = os.path.join(logdir, 'model.ckpt-12')
    assert result['checkpoint'] == checkpoint.last_saved == newest
    assert 'checkpoint: %s' % newest in lines
    assert tf.train.load_variable(newest, 'global_step') == 12
    # The data order is saved with the weights.
    assert tf.train.load_variable(newest, 'data_order/seed') == 0
    assert tf.train.load_variable(newest, 'data_order/batch_size') == 10
    assert tf.train.load_variable(newest, 'data_order/num_examples') == NUM_TRAIN

    # A new process: its Saver learns of the old checkpoints and goes on deleting them.
    checkpoint, lines = _SaveRecorder(every_steps=3, keep=2), []
    make_trainer([checkpoint], lines, steps_per_epoch=5, steps=14, logdir=logdir).train()
    assert 'resumed from %s' % newest in lines
    assert checkpoint.saved == [14]
    assert index_steps(logdir) == [12, 14]
    assert state_steps(logdir) == [12, 14]


def test_a_resume_with_another_data_order_is_refused_and_changes_nothing(tmp_path):
    logdir = str(tmp_path)
    sets = easy_datasets(validation=NUM_VALIDATION)
    callbacks = default_callbacks(TrainConfig(logdir=logdir, log_every=1000, checkpoint_every=2))
    make_trainer(callbacks, [], steps=3, logdir=logdir, run_info={'model': 'small_convnet'},
                 datasets=sets).train()
    before = snapshot(logdir, times=False)
    assert {'model.ckpt-3.index', 'stats.jsonl', 'run.json', 'best/best.json'} <= set(before)

    for changed, asked in [
            (dict(seed=1), 'batch_size 10, num_examples 60, seed 1, steps_per_epoch 6, '
                           'tf_data_order 0'),
            (dict(batch_size=20), 'batch_size 20, num_examples 60, seed 0, steps_per_epoch 3, '
                                  'tf_data_order 0')]:
        lines = []
        callbacks = default_callbacks(TrainConfig(logdir=logdir, log_every=1000,
                                                  checkpoint_every=2))
        trainer = make_trainer(callbacks, lines, steps=6, logdir=logdir, datasets=sets,
                               run_info={'model': 'small_convnet'}, **changed)
        with pytest.raises(TowersError) as error:
            trainer.train()
        assert str(error.value) == (
            'the checkpoint in %s was trained with data order batch_size 10, '
            'num_examples 60, seed 0, steps_per_epoch 6, tf_data_order 0, this run asks for '
            '%s: resuming would train on other batches; use the same seed, batch_size, '
            'dataset and input, or a new logdir' % (logdir, asked))
        assert lines == []
        assert snapshot(logdir, times=False) == before, changed


def test_a_resume_refused_for_another_model_leaves_run_json_alone(tmp_path):
    logdir = str(tmp_path)
    make_trainer([cb.Checkpoint()], [], steps=2, logdir=logdir,
                 run_info={'model': 'small_convnet'}).train()
    before = snapshot(logdir, times=False)
    other = ClassifierModel(model_fn('mnist_convnet'), SHAPE, 10, optimizer='sgd')
    with pytest.raises(TowersError, match='does not match this model'):
        make_trainer([cb.Checkpoint()], [], model=other, steps=4, logdir=logdir,
                     run_info={'model': 'mnist_convnet'}).train()
    assert snapshot(logdir, times=False) == before
    with open(os.path.join(logdir, 'run.json'), encoding='utf-8') as f:
        assert json.load(f)['model'] == 'small_convnet'


def test_checkpoint_needs_a_logdir():
    with pytest.raises(TowersError, match='the Checkpoint callback needs a logdir'):
        make_trainer([cb.Checkpoint()], [], steps=1).train()


# --- Evaluate -----------------------------------------------------------------------------
