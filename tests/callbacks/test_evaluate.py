"""The Evaluate callback: exact numbers each epoch, the best checkpoint kept apart."""
import json
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.callbacks.common import (
    NUM_TEST,
    NUM_VALIDATION,
    Recorder,
    easy_datasets,
    eval_lines,
    index_steps,
    make_trainer,
    model_fn,
    state_steps,
)
from towers import callbacks as cb
from towers.errors import TowersError

tf1 = tf.compat.v1


def _reference(checkpoint, dataset):
    """Mean cross-entropy and accuracy of small_convnet with the checkpoint's weights on
    the whole dataset, in a graph of its own and numpy float64."""
    with tf.Graph().as_default() as graph:
        logits = model_fn()(tf.constant(dataset.images), False)
        with tf1.Session(graph=graph) as sess:
            tf1.train.Saver(tf1.global_variables()).restore(sess, checkpoint)
            logits = sess.run(logits).astype(np.float64)
    labels = dataset.labels
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(labels)), labels].mean()
    return loss, float(np.mean(np.argmax(logits, axis=1) == labels))


def test_evaluate_each_epoch_on_validation_with_exact_numbers(tmp_path):
    logdir, lines = str(tmp_path), []
    sets = easy_datasets(validation=NUM_VALIDATION)
    make_trainer([cb.Evaluate(), cb.Checkpoint(every_steps=0)], lines, datasets=sets,
                 steps_per_epoch=3, steps=6, logdir=logdir).train()
    evaluated = eval_lines(lines)
    assert len(evaluated) == 2
    for line, epoch in zip(evaluated, (1, 2)):
        match = re.fullmatch(r'validation at epoch %d\.00: loss (\d\.\d{4}) accuracy (\d\.\d{4}) '
                             r'top5 \d\.\d{4} \(23 images\)' % epoch, line)
        assert match, line
        loss, accuracy = _reference(os.path.join(logdir, 'model.ckpt-%d' % (3 * epoch)),
                                    sets.validation)
        assert float(match.group(1)) == pytest.approx(loss, abs=6e-5), line
        assert match.group(2) == '%.4f' % accuracy, line
    # The final test line is the trainer's, on the test split.
    assert re.fullmatch(r'test: loss \S+ accuracy \S+ top5 \S+ \(17 images\)', lines[-1]), \
        lines[-1]


def test_evaluate_falls_back_to_test_and_keeps_no_best_checkpoint_there(tmp_path):
    lines = []
    make_trainer([cb.Evaluate(best_metric='accuracy')], lines, logdir=str(tmp_path),
                 datasets=easy_datasets(validation=0, test=NUM_TEST), steps_per_epoch=2,
                 steps=4).train()
    assert [line.split(':')[0] for line in eval_lines(lines)] == [
        'test at epoch 1.00', 'test at epoch 2.00']
    assert eval_lines(lines)[0].endswith(' (17 images)')
    assert ('no validation set: evaluating on test, keeping no best checkpoint (hold some '
            'training data out with --validation-size N)') in lines
    assert not (tmp_path / 'best').exists()


def test_with_nothing_held_out_the_defaults_skip_evaluation_and_an_explicit_one_refuses():
    lines = []
    sets = easy_datasets(validation=0, test=0)
    result = make_trainer(None, lines, datasets=sets, steps_per_epoch=2, steps=4).train()
    assert eval_lines(lines) == [] and result['test'] is None
    with pytest.raises(TowersError, match='cannot evaluate on the test set: it is empty'):
        make_trainer([cb.Evaluate()], [], datasets=sets, steps=1).train()


class _ZeroWeightsAt(cb.Callback):
    """Sets every trainable variable to zero at the end of one epoch, before Evaluate
    (order 20) looks: all logits 0, so the loss is exactly ln 10 and argmax is class 0."""

    order = 15

    def __init__(self, epoch):
        self.epoch = epoch

    def setup_graph(self, trainer):
        self.zero = tf.group(*[v.assign(tf.zeros_like(v)) for v in tf1.trainable_variables()])

    def after_epoch(self, trainer):
        if trainer.epoch == self.epoch:
            trainer.sess.run(self.zero)


@pytest.mark.parametrize('metric', ['loss', 'accuracy'])
def test_the_best_checkpoint_is_the_best_epoch_and_the_only_one_kept(tmp_path, metric):
    logdir, lines = str(tmp_path), []
    sets = easy_datasets(validation=NUM_VALIDATION)
    recorder = Recorder(order=25)
    make_trainer([cb.Evaluate(best_metric=metric), _ZeroWeightsAt(epoch=3), recorder],
                 lines, datasets=sets, optimizer='adam', learning_rate=0.003, steps_per_epoch=3,
                 steps=9, logdir=logdir).train()
    values = [stats['validation'][metric] for stats in recorder.epoch_stats]
    assert len(values) == 3
    # The metric got better by training, then worse when the weights were wiped.
    zeroed = {'loss': math.log(10),
              'accuracy': float(np.mean(sets.validation.labels == 0))}[metric]
    assert values[2] == pytest.approx(zeroed, rel=1e-6)
    better = (lambda a, b: a < b) if metric == 'loss' else (lambda a, b: a > b)
    assert better(values[1], values[0]) and better(values[1], values[2]), values
    step = 6
    with open(os.path.join(logdir, 'best', 'best.json'), encoding='utf-8') as f:
        best = json.load(f)
    assert best == {'metric': metric, 'value': pytest.approx(values[1], rel=1e-12),
                    'step': step, 'split': 'validation', 'checkpoint': 'model.ckpt-%d' % step}
    best_dir = os.path.join(logdir, 'best')
    assert sorted(os.listdir(best_dir)) == [
        'best.json', 'checkpoint', 'model.ckpt-6.data-00000-of-00001', 'model.ckpt-6.index',
        'model.ckpt-6.meta']
    assert state_steps(best_dir) == [6]
    assert tf.train.load_variable(os.path.join(best_dir, 'model.ckpt-6'), 'global_step') == 6
    saved = [line for line in lines if line.startswith('best ')]
    assert saved[-1] == 'best validation %s %.4f so far: %s' % (
        metric, values[1], os.path.join(best_dir, 'model.ckpt-6'))
    # Epoch 1 was the best so far when it was evaluated, epoch 2 replaced it.
    assert len(saved) == 2


def test_a_resumed_run_still_keeps_one_best_checkpoint(tmp_path):
    logdir = str(tmp_path)
    sets = easy_datasets(validation=NUM_VALIDATION)

    def run(steps):
        make_trainer([cb.Evaluate(best_metric='loss'), cb.Checkpoint(every_steps=0)], [],
                     datasets=sets, optimizer='adam', learning_rate=0.003, steps_per_epoch=3,
                     steps=steps, logdir=logdir).train()
        with open(os.path.join(logdir, 'best', 'best.json'), encoding='utf-8') as f:
            return json.load(f)

    assert run(3)['step'] == 3
    assert run(6)['step'] == 6, 'the second epoch must be the better one for this test'
    assert state_steps(os.path.join(logdir, 'best')) == [6]
    on_disk = index_steps(os.path.join(logdir, 'best'))
    if on_disk != [6]:
        pytest.fail('logdir/best holds the checkpoints of steps %s' % on_disk)


def test_a_best_metric_the_model_lacks_is_an_error_that_names_the_known_ones(tmp_path):
    with pytest.raises(TowersError, match=re.escape(
            "best_metric 'top3' is not a metric of this model; choose one of: "
            'loss, accuracy, top5')):
        make_trainer([cb.Evaluate(best_metric='top3')], [], datasets=easy_datasets(validation=10),
                     steps=1, logdir=str(tmp_path)).train()


# --- TensorBoard --------------------------------------------------------------------------
