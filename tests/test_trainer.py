"""The Session loop: step counts, checkpoints and resume, evaluate, errors, log lines."""
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import towers.distribution
from tests import easy_digits
from towers import data, models
from towers.callbacks.base import Callback
from towers.cli.parsers import build_parser
from towers.cli.train import settings
from towers.config import TrainConfig
from towers.deviceplan import local_plan
from towers.devices import session_config
from towers.errors import TowersError
from towers.evaluation import evaluate
from towers.graph import build_training_graph
from towers.model import ClassifierModel
from towers.names import XLA_CPU_FLAG
from towers.schedules import total_steps
from towers.trainer import train

tf1 = tf.compat.v1

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (28, 28, 1)
NUM_TRAIN, NUM_TEST = 200, 37


class _Counting:
    """A DataSet that records each batch of images taken from it: one per step."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.fed = []  # the index array of every batch, in order
        outer = self

        class _Images:
            def __getitem__(self, index):
                outer.fed.append(np.asarray(index))
                return outer.dataset.images[index]

        self.images = _Images()

    num_examples = property(lambda self: self.dataset.num_examples)
    labels = property(lambda self: self.dataset.labels)
    batches = property(lambda self: len(self.fed))


_images_and_labels = easy_digits.images_and_labels


def _datasets(seed=0):
    rng = np.random.RandomState(seed)
    train_set = data.DataSet(*_images_and_labels(NUM_TRAIN, rng), seed=seed)
    test_set = data.DataSet(*_images_and_labels(NUM_TEST, rng), seed=seed)
    empty = data.DataSet(np.zeros([0, 28, 28, 1], np.float32), np.zeros([0], np.int64))
    return data.Datasets(_Counting(train_set), empty, test_set)


def _model():
    return models.build_model('small_convnet', SHAPE, 10)


def _classifier():
    return ClassifierModel(_model(), SHAPE, 10, optimizer='sgd')


def _logits(checkpoint, images):
    """small_convnet's logits for images with the checkpoint's weights, in a graph of its own."""
    with tf.Graph().as_default() as graph, tf.device('/cpu:0'):  # as the runs it checks
        logits = _model()(tf.constant(images), False)
        with tf1.Session(graph=graph) as sess:
            tf1.train.Saver(tf1.global_variables()).restore(sess, checkpoint)
            return sess.run(logits)


def _config(**overrides):
    # The Trainer's tests train on the CPU, GPU machines too (tests/gpu trains on GPUs).
    options = dict(batch_size=10, optimizer='sgd', learning_rate=0.05, log_every=1000,
                   warmup_steps=0, towers=('/cpu:0',))
    options.update(overrides)
    return TrainConfig(**options)


def _train(config, datasets=None):
    """train() with a log collected into a list; returns (result, lines, datasets)."""
    datasets = datasets or _datasets()
    lines = []
    result = train(config, _model(), datasets, SHAPE, log=lines.append)
    return result, lines, datasets


def _checkpoint_steps(logdir):
    state = tf1.train.get_checkpoint_state(logdir)
    assert state is not None, 'no checkpoint in %s' % logdir
    return [int(path.rsplit('-', 1)[1]) for path in state.all_model_checkpoint_paths]


@pytest.mark.parametrize('epochs,steps_per_epoch,expected', [
    (1, 20, 20), (1, 7, 7), (0.5, 7, 4), (2.5, 4, 10), (0.01, 20, 1),
    (0.07, 1100, 77)])  # float ceil(0.07 * 1100) would say 78
def test_total_steps_is_epochs_times_steps_per_epoch_rounded_up(epochs, steps_per_epoch,
                                                                expected):
    assert total_steps(epochs, None, steps_per_epoch) == expected
    assert total_steps(epochs, 3, steps_per_epoch) == 3


def test_two_epochs_feed_every_example_exactly_once_each():
    # 200 examples at 30 per step: 7 steps an epoch, the 7th holding 20.
    result, _, sets = _train(_config(epochs=2, batch_size=30))
    assert result['steps'] == 14
    assert [len(b) for b in sets.train.fed] == [30] * 6 + [20] + [30] * 6 + [20]
    for epoch in (sets.train.fed[:7], sets.train.fed[7:]):
        assert sorted(np.concatenate(epoch)) == list(range(NUM_TRAIN))


def test_epochs_run_exactly_the_computed_steps_on_two_towers():
    # 0.5 epoch of 7 steps (200 at 30 per step): ceil(3.5) = 4 steps.
    result, lines, sets = _train(_config(epochs=0.5, batch_size=30,
                                         towers=['/cpu:0', '/cpu:1']))
    assert result['steps'] == 4
    assert sets.train.batches == 4
    assert 'training 4 steps on 2 tower(s) /cpu:0,/cpu:1, global batch 30, feed input' in lines
    assert result['checkpoint'] is None
    assert lines[-1] == 'test: loss %.4f accuracy %.4f top5 %.4f (37 images)' % (
        result['test_loss'], result['test_accuracy'], result['test_top5'])


def test_steps_override_epochs():
    result, _, sets = _train(_config(epochs=5, steps=3))
    assert result['steps'] == 3 and sets.train.batches == 3


def test_checkpoints_every_k_steps_and_at_the_end_then_resume(tmp_path):
    logdir = str(tmp_path / 'run')  # does not exist yet: train creates it
    first, lines, sets = _train(_config(steps=7, checkpoint_every=3, logdir=logdir))
    assert first['steps'] == 7 and sets.train.batches == 7
    assert _checkpoint_steps(logdir) == [3, 6, 7]
    assert first['checkpoint'] == os.path.join(logdir, 'model.ckpt-7')
    assert tf1.train.latest_checkpoint(logdir) == first['checkpoint']
    assert tf.train.load_variable(logdir, 'global_step') == 7
    assert not any('resumed' in line for line in lines)

    # The same logdir and more steps: training continues from step 7.
    second, lines, sets = _train(_config(steps=10, checkpoint_every=3, logdir=logdir))
    assert 'resumed from %s' % first['checkpoint'] in lines
    assert second['steps'] == 10 and sets.train.batches == 3
    assert _checkpoint_steps(logdir) == [3, 6, 7, 9, 10]
    assert tf.train.load_variable(logdir, 'global_step') == 10

    # Nothing left to do: no step runs and the restored weights test the same.
    third, lines, sets = _train(_config(steps=10, checkpoint_every=3, logdir=logdir))
    assert 'resumed from %s' % second['checkpoint'] in lines
    assert third['steps'] == 10 and sets.train.batches == 0
    assert third['test_loss'] == pytest.approx(second['test_loss'], rel=1e-6)
    assert third['test_accuracy'] == second['test_accuracy']
    assert third['test_loss'] != pytest.approx(first['test_loss'], rel=1e-3)


def test_resumed_runs_keep_only_the_last_five_checkpoints(tmp_path):
    logdir = str(tmp_path)
    _train(_config(steps=4, checkpoint_every=1, logdir=logdir))
    assert _checkpoint_steps(logdir) == [1, 2, 3, 4]
    _train(_config(steps=7, checkpoint_every=1, logdir=logdir))
    assert _checkpoint_steps(logdir) == [3, 4, 5, 6, 7]
    on_disk = sorted(int(name.split('-')[1].split('.')[0]) for name in os.listdir(logdir)
                     if name.endswith('.index'))
    assert on_disk == [3, 4, 5, 6, 7]


def _reference_loss_and_accuracy(logits, labels):
    """Mean softmax cross-entropy and accuracy in numpy, float64."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    losses = -log_probs[np.arange(len(labels)), labels]
    return losses, float(np.mean(np.argmax(logits, axis=1) == labels))


def test_evaluate_counts_every_example_of_a_test_set_that_is_not_a_multiple_of_the_batch(
        tmp_path):
    images = np.random.RandomState(5).rand(NUM_TEST, *SHAPE).astype(np.float32)
    one = build_training_graph(_classifier(), local_plan(['/cpu:0']), seed=3)
    with tf1.Session(graph=one.graph, config=session_config(['/cpu:0'])) as sess:
        sess.run(one.init_op)
        checkpoint = one.saver.save(sess, str(tmp_path / 'weights'))
    logits = _logits(checkpoint, images)
    with tf1.Session(graph=one.graph, config=session_config(['/cpu:0'])) as sess:
        one.saver.restore(sess, checkpoint)
        predicted = np.argmax(logits, axis=1)
        # Every other label is wrong on purpose: accuracy is exactly 19/37.
        labels = np.where(np.arange(NUM_TEST) % 2 == 0, predicted, (predicted + 1) % 10)
        test_set = data.DataSet(images, labels)
        losses, accuracy = _reference_loss_and_accuracy(logits, labels)
        assert accuracy == 19 / 37
        # The one-shot run over all 37 agrees with numpy.
        loss, accuracy = sess.run([one.eval_loss, one.eval_metrics['accuracy']],
                                  {one.eval_images: images, one.eval_labels: labels})
        assert loss == pytest.approx(losses.mean(), rel=1e-5) and accuracy == 19 / 37
        one_tower = evaluate(sess, one, test_set, 10)
    # Averaging the four batch means (10, 10, 10, 7) would be off: the test can tell.
    batch_means = np.mean([losses[i:i + 10].mean() for i in range(0, NUM_TEST, 10)])
    assert abs(batch_means - losses.mean()) > 1e-4 * losses.mean()
    assert one_tower['loss'] == pytest.approx(losses.mean(), rel=1e-5)
    assert one_tower['accuracy'] == 19 / 37

    # Three towers, same weights: the last batch of 7 splits 3/2/2; batch 1 leaves
    # two towers empty on every run.
    devices = ['/cpu:0', '/cpu:1', '/cpu:2']
    three = build_training_graph(_classifier(), local_plan(devices), seed=3)
    with tf1.Session(graph=three.graph, config=session_config(devices)) as sess:
        three.saver.restore(sess, checkpoint)
        for batch_size in (10, 1, 37):
            values = evaluate(sess, three, test_set, batch_size)
            assert values['loss'] == pytest.approx(losses.mean(), rel=1e-5), batch_size
            assert values['accuracy'] == 19 / 37, batch_size


def test_evaluate_refuses_an_empty_set():
    graph = build_training_graph(_classifier(), local_plan(['/cpu:0']))
    empty = data.DataSet(np.zeros([0, 28, 28, 1], np.float32), np.zeros([0], np.int64))
    with tf1.Session(graph=graph.graph, config=session_config(['/cpu:0'])) as sess:
        sess.run(graph.init_op)
        with pytest.raises(TowersError, match='empty'):
            evaluate(sess, graph, empty, 10)


class _NeverBuilt:
    """A model_fn that must not be called: the error comes before the graph."""

    def __call__(self, images, training):
        raise AssertionError('the graph was built before the error')


@pytest.mark.parametrize('overrides,match', [
    (dict(batch_size=0), 'batch_size must be at least 1, got 0'),
    (dict(steps=0), 'steps must be at least 1, got 0'),
    (dict(epochs=0), 'epochs must be positive, got 0'),
    (dict(epochs=-1), 'epochs must be positive, got -1'),
    (dict(batch_size=NUM_TRAIN + 1), 'batch_size 201 exceeds the 200 training examples'),
], ids=['batch 0', 'steps 0', 'epochs 0', 'epochs -1', 'batch > train set'])
def test_bad_numbers_are_errors_before_training(overrides, match):
    lines = []
    with pytest.raises(TowersError, match=match):
        train(_config(**overrides), _NeverBuilt(), _datasets(), SHAPE, log=lines.append)
    assert lines == []


def test_unwritable_logdir_is_an_error_before_training(tmp_path):
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a folder')
    lines = []
    with pytest.raises(TowersError, match='cannot create logdir .*a_file/run'):
        train(_config(steps=1, logdir=str(blocker / 'run')), _NeverBuilt(), _datasets(), SHAPE,
              log=lines.append)
    assert lines == []


def test_a_diverging_loss_stops_training_at_the_step_where_it_happens(tmp_path):
    sets = _datasets()
    lines = []
    with pytest.raises(TowersError) as error:
        train(_config(steps=20, learning_rate=1e30, log_every=1, checkpoint_every=1,
                      logdir=str(tmp_path)),
              _model(), sets, SHAPE, log=lines.append)
    match = re.match(r'loss is (nan|inf) at step (\d+) \((.*), saved before it, is intact\); '
                     r'replayed, step \2 first went non-finite in the forward pass of tower 0, ',
                     str(error.value))
    assert match, str(error.value)
    bad_step = int(match.group(2))
    # The first step's loss comes from the initial weights, so it is finite. The replay took
    # one batch more: the failed step's, from the checkpoint before it.
    assert bad_step >= 2 and sets.train.batches == bad_step + 1
    # Every step before it was logged with a finite loss: the first bad one stopped the run.
    logged = [re.match(r'step (\d+)/20 epoch [\d.]+: loss (\S+) ', line)
              for line in lines if line.startswith('step ')]
    assert [int(m.group(1)) for m in logged] == list(range(1, bad_step))
    assert all(np.isfinite(float(m.group(2))) for m in logged)
    # Only the good steps were checkpointed.
    assert _checkpoint_steps(str(tmp_path)) == list(range(1, bad_step))[-5:]


def test_images_per_sec_is_logged_only_after_the_warm_up():
    result, lines, _ = _train(_config(steps=6, log_every=1, warmup_steps=3))
    step_lines = [line for line in lines if line.startswith('step ')]
    assert len(step_lines) == 6
    for step, line in enumerate(step_lines, start=1):
        assert line.startswith('step %d/6 epoch %.2f: loss ' % (step, step * 10 / NUM_TRAIN))
        rate = re.search(r'\| ([\d.]+) images/sec$', line)
        if step <= 3:
            assert rate is None and 'images/sec' not in line, line
        else:
            assert rate and float(rate.group(1)) > 0, line
    assert result['images_per_sec'] > 0


def test_images_per_sec_is_none_when_the_run_is_all_warm_up():
    result, lines, _ = _train(_config(steps=2, log_every=1, warmup_steps=5))
    assert not any('images/sec' in line for line in lines)
    assert result['images_per_sec'] is None


def test_training_learns_the_easy_digits():
    result, _, _ = _train(_config(epochs=3, optimizer='adam', learning_rate=0.01))
    assert result['steps'] == 60
    assert result['test_accuracy'] == 1.0 and result['test_loss'] < 0.1


def _variables(logdir):
    return {name: tf.train.load_variable(logdir, name)
            for name, _ in tf1.train.list_variables(logdir)}


@pytest.mark.exact
def test_stopped_and_resumed_equals_uninterrupted(tmp_path):
    # 200 examples at 30 per step: the stop at step 9 falls mid second epoch.
    straight = str(tmp_path / 'straight')
    _, _, reference = _train(_config(steps=16, batch_size=30, logdir=straight))
    resumed = str(tmp_path / 'resumed')
    _, _, first = _train(_config(steps=9, batch_size=30, logdir=resumed))
    _, _, second = _train(_config(steps=16, batch_size=30, logdir=resumed))
    # The resumed run fed exactly the batches the straight run fed after step 9.
    order = first.train.fed + second.train.fed
    assert [list(b) for b in order] == [list(b) for b in reference.train.fed]
    expected, actual = _variables(straight), _variables(resumed)
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-6, atol=1e-7,
                                   err_msg=name)


def test_a_checkpoint_resumes_on_another_number_of_towers(tmp_path):
    logdir = str(tmp_path / 'run')
    _train(_config(steps=3, logdir=logdir, towers=['/cpu:0', '/cpu:1']))
    result, lines, _ = _train(_config(steps=5, logdir=logdir,
                                      towers=['/cpu:0', '/cpu:1', '/cpu:2'],
                                      param_device='/cpu:2'))
    assert any(line.startswith('resumed from') for line in lines)
    assert result['steps'] == 5


def test_a_checkpoint_of_another_model_is_a_readable_error(tmp_path):
    logdir = str(tmp_path / 'run')
    _train(_config(steps=2, logdir=logdir))
    other = models.build_model('mnist_convnet', SHAPE, 10)
    with pytest.raises(TowersError, match=re.escape(
            'does not match this model (missing: conv2/weights, conv2/biases, fc1/weights, '
            'fc1/biases, fc2/weights, fc2/biases | other shapes: conv1/weights [5, 5, 1, 32] '
            'here, [3, 3, 1, 32] there)')):
        train(_config(steps=4, logdir=logdir), other, _datasets(), SHAPE, log=lambda line: None)
    # An optimizer with slots the checkpoint lacks is named the same way.
    with pytest.raises(TowersError, match='missing: conv1/weights/Momentum, conv1/biases/Mom'):
        _train(_config(steps=4, logdir=logdir, optimizer='momentum'))
    assert _checkpoint_steps(logdir) == [2], 'a refused resume must not touch the checkpoints'


@pytest.mark.parametrize('field,value,message', [
    ('log_every', 0, 'log_every must be at least 1, got 0'),
    ('checkpoint_every', -1, 'checkpoint_every must be 0 (off) or more, got -1')])
def test_bad_loop_numbers_are_errors(field, value, message):
    with pytest.raises(TowersError, match=re.escape(message)):
        _train(_config(**{field: value}))


@pytest.mark.parametrize('flags,level', [([], tf1.OptimizerOptions.DEFAULT),
                                         (['--xla'], tf1.OptimizerOptions.ON_1)])
def test_train_xla_reaches_the_sessions_config_and_is_off_by_default(monkeypatch, flags, level):
    args = build_parser().parse_args(['train', '--model', 'small_convnet', '--steps', '1',
                                      '--batch-size', '10', '--eval-every', '0',
                                      '--devices', 'cpu'] + flags)
    config, _, _ = settings(args, from_records=False)
    opened, open_session = [], towers.distribution.open_session

    def recorded(graph, session_config, **options):
        opened.append(session_config)
        return open_session(graph, session_config, **options)

    monkeypatch.setattr(towers.distribution, 'open_session', recorded)
    monkeypatch.setenv('TF_XLA_FLAGS', '')  # as a Python user who did not set it
    lines = []
    train(config, _model(), _datasets(), SHAPE, log=lines.append)
    assert [c.graph_options.optimizer_options.global_jit_level for c in opened] == [level]
    if flags:
        assert lines[0].endswith(', feed input, XLA auto-clustering on'), lines[0]
        assert lines[1] == ('XLA: TensorFlow clusters nothing on CPU towers unless TF_XLA_FLAGS '
                            'holds --tf_xla_cpu_global_jit before its first Session (towers '
                            'train --xla sets it)')
    else:
        assert not [line for line in lines if 'XLA' in line]


class _CompiledSteps(Callback):
    """Each step's loss, and how many XLA-compiled clusters ran in it (every step traced)."""

    def __init__(self):
        self.losses, self.compiled = [], []

    def wants_trace(self, trainer):
        return True

    def after_step(self, trainer, values):
        self.losses.append(float(values['loss']))
        self.compiled.append(sum(' = _XlaRun(' in node.timeline_label
                                 for device in values['run_metadata'].step_stats.dev_stats
                                 for node in device.node_stats))


# XLA compiles small_convnet's step and evaluation at 8x8 in about half the CPU it takes at
# 28x28 (2.7 s against 4.7 s on a 2-core AMD EPYC): the same ops, on smaller shapes.
XLA_SHAPE = (8, 8, 1)


def _xla_datasets():
    """Random 8x8 images: 200 to train on, NUM_TEST to test on (a last batch of 7)."""
    rng = np.random.RandomState(0)

    def dataset(num):
        return data.DataSet(rng.rand(num, *XLA_SHAPE).astype(np.float32),
                            rng.randint(0, 10, num))
    return data.Datasets(dataset(NUM_TRAIN), dataset(0), dataset(NUM_TEST))


def plain_and_xla_runs():
    """{'plain'|'xla': {losses, compiled (per step), test_loss, first_line}} of 3 steps each.

    Run in a process of its own whose TF_XLA_FLAGS holds --tf_xla_cpu_global_jit: TensorFlow
    fixes whether XLA may cluster on CPUs at its first Session, which in pytest's own process
    another test has made already.
    """
    runs = {}
    for name, xla in (('plain', False), ('xla', True)):
        steps, lines = _CompiledSteps(), []
        result = train(_config(steps=3, eval_every=0, xla=xla),
                       models.build_model('small_convnet', XLA_SHAPE, 10), _xla_datasets(),
                       XLA_SHAPE, log=lines.append, callbacks=[steps])
        runs[name] = dict(losses=steps.losses, compiled=steps.compiled,
                          test_loss=result['test_loss'], first_line=lines[0],
                          xla_lines=[line for line in lines if line.startswith('XLA:')])
    return runs


def test_xla_trains_with_compiled_clusters_to_the_losses_of_the_plain_run(forks):
    # This module run as a script, forked from a process that never made a Session.
    status, out, err = forks.run([], ROOT, module='tests.test_trainer',
                                 env={'TF_XLA_FLAGS': XLA_CPU_FLAG})
    assert status == 0, err
    runs = json.loads(out[-1])
    plain, jit = runs['plain'], runs['xla']
    assert plain['compiled'] == [0, 0, 0] and min(jit['compiled']) >= 1, runs
    assert jit['first_line'].endswith(', XLA auto-clustering on') and jit['xla_lines'] == []
    assert 'XLA' not in plain['first_line']
    # XLA fuses the step's float32 arithmetic and rounds it its own way. Measured on a 2-core
    # AMD EPYC (TensorFlow 2.21), on 8x8 images: step 1's loss 2.4e-7 apart (one float32 ulp at
    # 2.25), steps 2 and 3 equal, the test loss 6.4e-8 apart (at 28x28: 2.4e-7, equal, equal
    # and 1.3e-7); 1e-6 leaves about four ulps.
    assert jit['losses'] == pytest.approx(plain['losses'], rel=0, abs=1e-6)
    assert jit['test_loss'] == pytest.approx(plain['test_loss'], rel=0, abs=1e-6)


if __name__ == '__main__':  # test_xla_trains_with_compiled_clusters_to_the_losses_of_the_plain_run
    print(json.dumps(plain_and_xla_runs()))
