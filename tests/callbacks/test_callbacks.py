"""The callbacks around the Session loop: checkpoints, evaluation, TensorBoard, the
stats file, progress, the NaN guard, and the hook order a custom Callback sees."""
import glob
import io
import json
import math
import os
import re
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import easy_digits
from towers import callbacks as cb
from towers import data, models
from towers.callbacks import default_callbacks, monitors
from towers.config import TrainConfig
from towers.errors import TowersError
from towers.model import ClassifierModel
from towers.trainer import Trainer

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)
NUM_TRAIN, NUM_VALIDATION, NUM_TEST = 60, 23, 17
HOOKS = ('setup_graph', 'fetches', 'before_train', 'after_step', 'after_epoch', 'after_train',
         'close')


_images_and_labels = easy_digits.images_and_labels


def _datasets(train=NUM_TRAIN, validation=0, test=NUM_TEST, seed=0):
    """data.Datasets of easy digits; a split of size 0 is an empty DataSet."""
    rng = np.random.RandomState(seed)
    splits = [data.DataSet(*_images_and_labels(num, rng)) if num else
              data.DataSet(np.zeros([0, *SHAPE], np.float32), np.zeros([0], np.int64))
              for num in (train, validation, test)]
    return data.Datasets(*splits)


def _model_fn(name='small_convnet'):
    return models.build_model(name, SHAPE, 10)


def _trainer(callbacks, lines, datasets=None, optimizer='sgd', model=None, **options):
    """A Trainer on one CPU tower with a tiny batch; its log goes into lines."""
    settings = dict(towers=['/cpu:0'], batch_size=10, learning_rate=0.05, warmup_steps=0)
    settings.update(options)
    model = model or ClassifierModel(_model_fn(), SHAPE, 10, optimizer=optimizer)
    return Trainer(model, datasets or _datasets(), callbacks=callbacks, log=lines.append,
                   **settings)


class _Recorder(cb.Callback):
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


def _index_steps(folder):
    """Steps of the model.ckpt-<step> checkpoints with any file on disk in folder."""
    return sorted({int(re.match(r'model\.ckpt-(\d+)\.', name).group(1))
                   for name in os.listdir(folder) if name.startswith('model.ckpt-')})


def _state_steps(folder):
    state = tf1.train.get_checkpoint_state(folder)
    assert state is not None, 'no checkpoint state in %s' % folder
    return [int(path.rsplit('-', 1)[1]) for path in state.all_model_checkpoint_paths]


def _snapshot(folder):
    """Every file under folder -> its bytes."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, 'rb') as f:
                files[os.path.relpath(path, folder)] = f.read()
    return files


def _finite_variables(checkpoint):
    """Names of the checkpoint's float variables, asserting each is all finite."""
    names = []
    for name, _ in tf1.train.list_variables(checkpoint):
        value = np.asarray(tf.train.load_variable(checkpoint, name))
        if np.issubdtype(value.dtype, np.floating):
            assert np.all(np.isfinite(value)), name
            names.append(name)
    return names


# --- Checkpoint ---------------------------------------------------------------------------


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
    result = _trainer([checkpoint], lines, steps_per_epoch=5, steps=12,
                      logdir=logdir).train()
    # Every 3 steps and at the ends of epochs (5, 10); 12 is both due and the end:
    # one save per step all the same.
    assert checkpoint.saved == [3, 5, 6, 9, 10, 12]
    assert _index_steps(logdir) == [10, 12]
    assert _state_steps(logdir) == [10, 12]
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
    _trainer([checkpoint], lines, steps_per_epoch=5, steps=14, logdir=logdir).train()
    assert 'resumed from %s' % newest in lines
    assert checkpoint.saved == [14]
    assert _index_steps(logdir) == [12, 14]
    assert _state_steps(logdir) == [12, 14]


def test_a_resume_with_another_data_order_is_refused_and_changes_nothing(tmp_path):
    logdir = str(tmp_path)
    sets = _datasets(validation=NUM_VALIDATION)
    callbacks = default_callbacks(TrainConfig(logdir=logdir, log_every=1000, checkpoint_every=2))
    _trainer(callbacks, [], steps=3, logdir=logdir, run_info={'model': 'small_convnet'},
             datasets=sets).train()
    before = _snapshot(logdir)
    assert {'model.ckpt-3.index', 'stats.jsonl', 'run.json', 'best/best.json'} <= set(before)

    for changed, asked in [
            (dict(seed=1), 'batch_size 10, num_examples 60, seed 1, steps_per_epoch 6, '
                           'tf_data_order 0'),
            (dict(batch_size=20), 'batch_size 20, num_examples 60, seed 0, steps_per_epoch 3, '
                                  'tf_data_order 0')]:
        lines = []
        callbacks = default_callbacks(TrainConfig(logdir=logdir, log_every=1000,
                                                  checkpoint_every=2))
        trainer = _trainer(callbacks, lines, steps=6, logdir=logdir, datasets=sets,
                           run_info={'model': 'small_convnet'}, **changed)
        with pytest.raises(TowersError) as error:
            trainer.train()
        assert str(error.value) == (
            'the checkpoint in %s was trained with data order batch_size 10, '
            'num_examples 60, seed 0, steps_per_epoch 6, tf_data_order 0, this run asks for '
            '%s: resuming would train on other batches; use the same seed, batch_size, '
            'dataset and input, or a new logdir' % (logdir, asked))
        assert lines == []
        assert _snapshot(logdir) == before, changed


def test_a_resume_refused_for_another_model_leaves_run_json_alone(tmp_path):
    logdir = str(tmp_path)
    _trainer([cb.Checkpoint()], [], steps=2, logdir=logdir,
             run_info={'model': 'small_convnet'}).train()
    before = _snapshot(logdir)
    other = ClassifierModel(_model_fn('mnist_convnet'), SHAPE, 10, optimizer='sgd')
    with pytest.raises(TowersError, match='does not match this model'):
        _trainer([cb.Checkpoint()], [], model=other, steps=4, logdir=logdir,
                 run_info={'model': 'mnist_convnet'}).train()
    assert _snapshot(logdir) == before
    with open(os.path.join(logdir, 'run.json'), encoding='utf-8') as f:
        assert json.load(f)['model'] == 'small_convnet'


def test_checkpoint_needs_a_logdir():
    with pytest.raises(TowersError, match='the Checkpoint callback needs a logdir'):
        _trainer([cb.Checkpoint()], [], steps=1).train()


# --- Evaluate -----------------------------------------------------------------------------


def _eval_lines(lines):
    return [line for line in lines if ' at epoch ' in line]


def _reference(checkpoint, dataset):
    """Mean cross-entropy and accuracy of small_convnet with the checkpoint's weights on
    the whole dataset, in a graph of its own and numpy float64."""
    with tf.Graph().as_default() as graph:
        logits = _model_fn()(tf.constant(dataset.images), False)
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
    sets = _datasets(validation=NUM_VALIDATION)
    _trainer([cb.Evaluate(), cb.Checkpoint(every_steps=0)], lines, datasets=sets,
             steps_per_epoch=3, steps=6, logdir=logdir).train()
    evaluated = _eval_lines(lines)
    assert len(evaluated) == 2
    for line, epoch in zip(evaluated, (1, 2)):
        match = re.fullmatch(r'validation at epoch %d\.00: loss (\d\.\d{4}) accuracy (\d\.\d{4}) '
                             r'\(23 images\)' % epoch, line)
        assert match, line
        loss, accuracy = _reference(os.path.join(logdir, 'model.ckpt-%d' % (3 * epoch)),
                                    sets.validation)
        assert float(match.group(1)) == pytest.approx(loss, abs=6e-5), line
        assert match.group(2) == '%.4f' % accuracy, line
    # The final test line is the trainer's, on the test split.
    assert re.fullmatch(r'test: loss \S+ accuracy \S+ \(17 images\)', lines[-1]), lines[-1]


def test_evaluate_falls_back_to_test_and_keeps_no_best_checkpoint_there(tmp_path):
    lines = []
    _trainer([cb.Evaluate(best_metric='accuracy')], lines, logdir=str(tmp_path),
             datasets=_datasets(validation=0, test=NUM_TEST), steps_per_epoch=2,
             steps=4).train()
    assert [line.split(':')[0] for line in _eval_lines(lines)] == [
        'test at epoch 1.00', 'test at epoch 2.00']
    assert _eval_lines(lines)[0].endswith(' (17 images)')
    assert ('no validation set: evaluating on test, keeping no best checkpoint (hold some '
            'training data out with --validation-size N)') in lines
    assert not (tmp_path / 'best').exists()


def test_with_nothing_held_out_the_defaults_skip_evaluation_and_an_explicit_one_refuses():
    lines = []
    sets = _datasets(validation=0, test=0)
    result = _trainer(None, lines, datasets=sets, steps_per_epoch=2, steps=4).train()
    assert _eval_lines(lines) == [] and result['test'] is None
    with pytest.raises(TowersError, match='cannot evaluate on the test set: it is empty'):
        _trainer([cb.Evaluate()], [], datasets=sets, steps=1).train()


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
    sets = _datasets(validation=NUM_VALIDATION)
    recorder = _Recorder(order=25)
    _trainer([cb.Evaluate(best_metric=metric), _ZeroWeightsAt(epoch=3), recorder],
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
    assert _state_steps(best_dir) == [6]
    assert tf.train.load_variable(os.path.join(best_dir, 'model.ckpt-6'), 'global_step') == 6
    saved = [line for line in lines if line.startswith('best ')]
    assert saved[-1] == 'best validation %s %.4f so far: %s' % (
        metric, values[1], os.path.join(best_dir, 'model.ckpt-6'))
    # Epoch 1 was the best so far when it was evaluated, epoch 2 replaced it.
    assert len(saved) == 2


def test_a_resumed_run_still_keeps_one_best_checkpoint(tmp_path):
    logdir = str(tmp_path)
    sets = _datasets(validation=NUM_VALIDATION)

    def run(steps):
        _trainer([cb.Evaluate(best_metric='loss'), cb.Checkpoint(every_steps=0)], [],
                 datasets=sets, optimizer='adam', learning_rate=0.003, steps_per_epoch=3,
                 steps=steps, logdir=logdir).train()
        with open(os.path.join(logdir, 'best', 'best.json'), encoding='utf-8') as f:
            return json.load(f)

    assert run(3)['step'] == 3
    assert run(6)['step'] == 6, 'the second epoch must be the better one for this test'
    assert _state_steps(os.path.join(logdir, 'best')) == [6]
    on_disk = _index_steps(os.path.join(logdir, 'best'))
    if on_disk != [6]:
        pytest.fail('logdir/best holds the checkpoints of steps %s' % on_disk)


def test_a_best_metric_the_model_lacks_is_an_error_that_names_the_known_ones(tmp_path):
    with pytest.raises(TowersError, match=re.escape(
            "best_metric 'top5' is not a metric of this model; choose one of: "
            'loss, accuracy')):
        _trainer([cb.Evaluate(best_metric='top5')], [], datasets=_datasets(validation=10),
                 steps=1, logdir=str(tmp_path)).train()


# --- TensorBoard --------------------------------------------------------------------------


def _event_files(logdir):
    return sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*')),
                  key=os.path.getmtime)


def _events(path):
    return list(tf1.train.summary_iterator(path))


def test_tensorboard_writes_scalars_the_graph_and_histograms_and_marks_a_resume(tmp_path):
    logdir, lines = str(tmp_path), []
    callbacks = [monitors.TensorBoard(every_steps=2, histograms=True), cb.Evaluate(),
                 cb.Checkpoint(every_steps=0)]
    _trainer(callbacks, lines, towers=['/cpu:0', '/cpu:1'], steps_per_epoch=3, steps=4,
             logdir=logdir).train()
    files = _event_files(logdir)
    assert len(files) == 1
    events = _events(files[0])

    scalars, histograms = {}, {}
    for event in events:
        for value in event.summary.value:
            if value.HasField('simple_value'):
                scalars.setdefault(event.step, {})[value.tag] = value.simple_value
            elif value.HasField('histo'):
                histograms.setdefault(event.step, {})[value.tag] = value.histo
    train_tags = {'loss', 'accuracy', 'learning_rate', 'images_per_sec', 'tower_0/loss',
                  'tower_1/loss'}
    eval_tags = {'test/loss', 'test/accuracy'}
    # Every 2 steps and at the last; the evaluation after epoch 1 (step 3) and at the end.
    assert {step: set(tags) for step, tags in scalars.items()} == {
        2: train_tags, 3: eval_tags, 4: train_tags | eval_tags}
    for step in (2, 4):
        values = scalars[step]
        assert values['learning_rate'] == pytest.approx(0.05)
        assert values['images_per_sec'] > 0
        # Batch 10 splits 5/5: the loss is the towers' mean.
        assert values['loss'] == pytest.approx(
            (values['tower_0/loss'] + values['tower_1/loss']) / 2, rel=1e-5)
    assert 0 <= scalars[3]['test/accuracy'] <= 1 and scalars[3]['test/loss'] > 0

    graphs = [event for event in events if event.HasField('graph_def')]
    assert len(graphs) == 1
    nodes = [node.name for node in tf1.GraphDef.FromString(graphs[0].graph_def).node]
    assert any(name.startswith('tower_0/') for name in nodes)
    assert any(name.startswith('tower_1/') for name in nodes)
    assert any('average_gradients' in name for name in nodes)

    variables = {'conv1/weights', 'conv1/biases', 'logits/weights', 'logits/biases'}
    with tf.Graph().as_default():
        _model_fn()(tf1.placeholder(tf.float32, [None, *SHAPE]), True)
        assert {v.op.name for v in tf1.trainable_variables()} == variables
    assert set(histograms) == {2, 4}
    weights = tf.train.load_variable(os.path.join(logdir, 'model.ckpt-4'), 'conv1/weights')
    for step in (2, 4):
        assert set(histograms[step]) == {'histograms/' + name for name in variables}
        assert histograms[step]['histograms/conv1/weights'].num == weights.size
    assert not any(event.HasField('session_log') for event in events)

    # A resumed run's file marks the step it restarts from.
    _trainer([monitors.TensorBoard(every_steps=2), cb.Checkpoint(every_steps=0)], [],
             towers=['/cpu:0', '/cpu:1'], steps_per_epoch=3, steps=5,
             logdir=logdir).train()
    resumed = _events(_event_files(logdir)[-1])
    starts = [event.step for event in resumed if event.HasField('session_log')
              and event.session_log.status == tf1.SessionLog.START]
    assert starts == [4]
    assert {value.tag for event in resumed if event.step == 5
            for value in event.summary.value} == train_tags


class _FakeTrainer:
    """What TensorBoard.before_train reads of a Trainer."""

    def __init__(self, logdir, step):
        self.logdir, self.step, self.warmup_steps = logdir, step, 0
        self.graph = type('Graph', (), {'graph': tf.Graph()})()


def _opened_at(path):
    """The wall-clock second in an event file's name: events.out.tfevents.<second>.<host>..."""
    return int(os.path.basename(path).split('.')[3])


def test_a_second_run_in_the_same_second_keeps_the_first_runs_events(tmp_path):
    for attempt in range(5):  # until both writers open within one wall-clock second
        logdir = str(tmp_path / str(attempt))
        os.makedirs(logdir)
        for step in (0, 3):  # a run, then its resume: each writes its graph first
            writer = monitors.TensorBoard()
            writer.before_train(_FakeTrainer(logdir, step))
            writer.close()
        if len({_opened_at(path) for path in _event_files(logdir)}) == 1:
            break
    else:
        pytest.skip('never opened two writers within one second')
    graphs = [event for path in _event_files(logdir) for event in _events(path)
              if event.HasField('graph_def')]
    if len(graphs) != 2:
        pytest.fail('%d graph event(s) left of 2 in %s' % (len(graphs),
                                                                _event_files(logdir)))


# --- StatsFile ----------------------------------------------------------------------------


def _stats_lines(logdir):
    with open(os.path.join(logdir, 'stats.jsonl'), encoding='utf-8') as f:
        return [json.loads(line) for line in f]


def test_stats_file_has_one_line_per_epoch_with_weighted_means_and_survives_a_resume(
        tmp_path):
    logdir = str(tmp_path)
    # 50 examples at 20 per step: epochs of 3 steps of 20, 20 and 10 examples.
    sets = _datasets(train=50)
    recorder = _Recorder(order=45)
    started = time.time()
    _trainer([cb.Evaluate(), monitors.StatsFile(), cb.Checkpoint(every_steps=0), recorder],
             [], datasets=sets, batch_size=20, epochs=2, logdir=logdir).train()
    finished = time.time()
    stats = _stats_lines(logdir)
    assert [line['step'] for line in stats] == [3, 6]
    assert [line['epoch'] for line in stats] == [1.0, 2.0]
    assert [int(v['batch']) for v in recorder.values] == [20, 20, 10] * 2
    for line, epoch_values, evaluation in zip(stats, (recorder.values[:3],
                                                      recorder.values[3:]),
                                              recorder.epoch_stats):
        assert set(line) == {'epoch', 'step', 'time', 'learning_rate', 'images_per_sec',
                             'train_loss', 'train_accuracy', 'test_loss', 'test_accuracy'}
        losses = [float(v['loss']) for v in epoch_values]
        batches = [int(v['batch']) for v in epoch_values]
        weighted = sum(loss * batch for loss, batch in zip(losses, batches)) / 50
        assert line['train_loss'] == pytest.approx(weighted, rel=1e-9)
        assert weighted != pytest.approx(np.mean(losses), rel=1e-6)  # weighting matters
        hits = sum(float(v['accuracy']) * int(v['batch']) for v in epoch_values)
        assert line['train_accuracy'] == pytest.approx(hits / 50, rel=1e-12)
        assert line['learning_rate'] == pytest.approx(0.05)
        assert line['images_per_sec'] > 0
        assert started <= line['time'] <= finished
        assert line['test_loss'] == evaluation['test']['loss']
        assert line['test_accuracy'] == evaluation['test']['accuracy']

    # A line from steps the checkpoint never saw, and one a crash cut short.
    path = os.path.join(logdir, 'stats.jsonl')
    with open(path, 'a', encoding='utf-8') as f:
        f.write(json.dumps({'epoch': 3.0, 'step': 9, 'by_hand': True}) + '\n')
        f.write('{"epoch": 4.0, "st')
    lines = []
    _trainer([cb.Evaluate(), monitors.StatsFile(), cb.Checkpoint(every_steps=0)], lines,
             datasets=sets, batch_size=20, epochs=3, logdir=logdir).train()
    assert 'resumed from %s' % os.path.join(logdir, 'model.ckpt-6') in lines
    resumed = _stats_lines(logdir)
    assert resumed[:2] == stats
    assert [line['step'] for line in resumed] == [3, 6, 9]
    assert 'by_hand' not in resumed[2] and resumed[2]['epoch'] == 3.0


# --- Progress -----------------------------------------------------------------------------


class _Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def _step_lines(lines):
    return [line for line in lines if line.startswith('step ')]


def test_progress_logs_plain_lines_every_k_steps_and_at_the_last():
    stream, lines, recorder = io.StringIO(), [], _Recorder()
    _trainer([monitors.Progress(every=4, stream=stream), recorder], lines,
             steps_per_epoch=10, steps=10).train()
    step_lines = _step_lines(lines)
    assert len(step_lines) == 3
    for line, step in zip(step_lines, (4, 8, 10)):
        match = re.fullmatch(r'step %d/10 epoch %.2f: loss (\S+) accuracy (\S+) lr 0\.05 '
                             r'\| ([\d.]+) images/sec' % (step, step / 10), line)
        assert match, line
        values = recorder.values[step - 1]
        assert match.group(1) == '%.4f' % values['loss']
        assert match.group(2) == '%.4f' % values['accuracy']
        assert float(match.group(3)) > 0
    assert stream.getvalue() == ''


def test_progress_draws_a_bar_on_a_terminal_and_other_lines_still_arrive(tmp_path):
    tty, lines = _Tty(), []
    trainer = _trainer([monitors.Progress(every=4, stream=tty), cb.Evaluate(),
                        cb.Checkpoint(every_steps=0)], lines, steps_per_epoch=10,
                       steps=10, logdir=str(tmp_path))
    trainer.train()
    assert '10/10' in tty.getvalue()
    assert _step_lines(lines) == []
    assert lines[0].startswith('training 10 steps on 1 tower(s)')
    assert [line.split(':')[0] for line in lines[1:]] == ['test at epoch 1.00', 'checkpoint',
                                                          'trained to step 10', 'test']
    assert trainer.log == lines.append  # given back when the bar closed


def test_progress_quiet_logs_plain_lines_even_on_a_terminal():
    tty, lines = _Tty(), []
    _trainer([monitors.Progress(every=5, quiet=True, stream=tty)], lines,
             steps_per_epoch=10, steps=10).train()
    assert [line.split(':')[0] for line in _step_lines(lines)] == [
        'step 5/10 epoch 0.50', 'step 10/10 epoch 1.00']
    assert tty.getvalue() == ''


# --- NaNGuard -----------------------------------------------------------------------------


def test_a_nan_loss_stops_before_anything_saves_it(tmp_path):
    logdir = str(tmp_path)
    with pytest.raises(TowersError) as error:
        _trainer([cb.NaNGuard(), cb.Checkpoint(every_steps=1, keep=3)], [], learning_rate=1e30,
                 steps=20, logdir=logdir).train()
    match = re.fullmatch(
        r'(?:loss is (?:nan|inf) at step (\d+); lower learning_rate'
        r'|a gradient is NaN or Inf at step (\d+) \(loss \S+\); lower learning_rate or clip with '
        r'clip_norm) \((\S+), saved before it, is intact\)', str(error.value))
    assert match, str(error.value)
    bad_step = int(match.group(1) or match.group(2))
    assert bad_step >= 2  # the first step's loss comes from the initial weights
    newest = tf1.train.latest_checkpoint(logdir)
    assert newest == match.group(3) == os.path.join(logdir, 'model.ckpt-%d' % (bad_step - 1))
    assert _index_steps(logdir) == list(range(1, bad_step))[-3:]
    assert 'conv1/weights' in _finite_variables(newest)


class _InfiniteGradientAt:
    """A gradient processor: the first variable's gradient is Inf in step `step` only."""

    def __init__(self, step):
        self.step = step

    def __call__(self, grads_and_vars):
        (grad, var), rest = grads_and_vars[0], grads_and_vars[1:]
        global_step = tf1.train.get_global_step()  # step - 1 while step `step` runs
        poisoned = tf.where(tf.equal(global_step, self.step - 1), grad + np.inf, grad)
        return [(poisoned, var)] + rest


class _PoisonedClassifier(ClassifierModel):
    def gradient_processors(self):
        return super().gradient_processors() + [_InfiniteGradientAt(3)]


def test_an_infinite_gradient_with_a_finite_loss_stops_at_its_step(tmp_path):
    logdir = str(tmp_path)
    model = _PoisonedClassifier(_model_fn(), SHAPE, 10, optimizer='sgd')
    with pytest.raises(TowersError) as error:
        _trainer([cb.NaNGuard(), cb.Checkpoint(every_steps=1)], [], model=model, steps=6,
                 logdir=logdir).train()
    newest = os.path.join(logdir, 'model.ckpt-2')
    assert re.fullmatch(r'a gradient is NaN or Inf at step 3 \(loss \d\.\d+\); lower '
                        r'learning_rate or clip with clip_norm \(%s, saved before it, is intact\)'
                        % re.escape(newest), str(error.value)), str(error.value)
    assert tf1.train.latest_checkpoint(logdir) == newest
    _finite_variables(newest)


@pytest.mark.filterwarnings('ignore:overflow encountered in cast:RuntimeWarning')
def test_no_checkpoint_with_non_finite_weights_is_called_intact(tmp_path):
    logdir = str(tmp_path)
    with pytest.raises(TowersError) as error:
        _trainer([cb.NaNGuard(), cb.Checkpoint(every_steps=1)], [], learning_rate=1e39,
                 steps=5, logdir=logdir).train()
    # 1e39 is Inf in float32: step 1's loss and gradients are finite, its update is not.
    assert str(error.value) == ('the weights hold NaN or Inf after step 1, so no checkpoint '
                                'was written; lower learning_rate')
    newest = tf1.train.latest_checkpoint(logdir)
    assert newest is None


# --- A custom Callback --------------------------------------------------------------------


def test_a_custom_callback_sees_every_hook_in_order():
    recorder = _Recorder(fetch={'doubled_loss': lambda trainer: 2 * trainer.graph.loss})
    _trainer([recorder], [], steps_per_epoch=2, steps=5, learning_rate=0.05).train()
    assert recorder.calls == [
        ('setup_graph', 0), ('fetches', 0), ('before_train', 0),
        ('after_step', 1), ('after_step', 2), ('after_epoch', 2),
        ('after_step', 3), ('after_step', 4), ('after_epoch', 4),
        ('after_step', 5), ('after_train', 5), ('close', None)]
    for values in recorder.values:
        assert {'loss', 'accuracy', 'batch', 'learning_rate', 'seconds'} <= set(values)
        assert 'train_op' not in values
        assert values['batch'] == 10 and values['seconds'] > 0
        assert values['learning_rate'] == pytest.approx(0.05)
        assert np.isfinite(values['loss']) and 0 <= values['accuracy'] <= 1
        # Its own fetch ran with the step.
        assert values['doubled_loss'] == pytest.approx(2 * values['loss'], rel=1e-6)


def test_callbacks_run_by_order_and_close_in_reverse_also_when_training_raises():
    journal = []
    late = _Recorder(order=70, fail_at_step=2, journal=journal)
    early = _Recorder(order=5, journal=journal)
    with pytest.raises(RuntimeError, match='failing at step 2 on purpose'):
        _trainer([late, early], [], steps_per_epoch=10, steps=5).train()
    expected = [('setup_graph', 0), ('fetches', 0), ('before_train', 0), ('after_step', 1),
                ('after_step', 2), ('close', None)]
    assert late.calls == expected and early.calls == expected
    # Listed late first, called early first; closed in reverse, after_train never.
    assert journal == [(order, hook) for hook in HOOKS[:4] for order in (5, 70)] + [
        (5, 'after_step'), (70, 'after_step'), (70, 'close'), (5, 'close')]


def test_a_custom_callbacks_fetches_are_not_reported_as_training_metrics(tmp_path):
    logdir, lines = str(tmp_path / 'scalar'), []
    fetch = {'my_step': lambda trainer: trainer.graph.global_step}
    _trainer([monitors.Progress(every=1, stream=io.StringIO()), monitors.StatsFile(),
              _Recorder(fetch=fetch)], lines, steps_per_epoch=2, steps=2,
             logdir=logdir).train()
    reported = [line for line in _step_lines(lines) if 'my_step' in line] + [
        key for line in _stats_lines(logdir) for key in line if 'my_step' in key]

    # A callback that watches a weight matrix.
    fetch = {'my_weights': lambda trainer: trainer.graph.graph.get_tensor_by_name(
        'conv1/weights:0')}
    try:
        _trainer([monitors.StatsFile(), _Recorder(fetch=fetch)], [], steps=1,
                 logdir=str(tmp_path / 'matrix')).train()
    except TypeError as e:
        reported.append('my_weights crashed the run: %s' % e)
    if reported:
        pytest.fail('reported: %s' % reported)


def test_a_stop_on_an_epochs_last_step_still_finishes_that_epoch(tmp_path):
    logdir, sets = str(tmp_path), _datasets(validation=NUM_VALIDATION)
    stops = iter([None, None, 'SIGTERM'])
    first = []
    result = _trainer(default_callbacks(TrainConfig(logdir=logdir, log_every=1000)), first,
                      datasets=sets,
                      steps_per_epoch=3, steps=9, logdir=logdir,
                      stop_requested=lambda: next(stops)).train()
    assert result['stopped'] == 'SIGTERM' and result['steps'] == 3
    # Epoch 1 ended at the stop: its evaluation ran before the stop was acted on.
    assert [line.split(':')[0] for line in _eval_lines(first)] == ['validation at epoch 1.00']
    second = []
    _trainer(default_callbacks(TrainConfig(logdir=logdir, log_every=1000)), second, datasets=sets,
             steps_per_epoch=3, steps=9, logdir=logdir).train()
    assert [line['step'] for line in _stats_lines(logdir)] == [3, 6, 9]
    assert [line.split(':')[0] for line in _eval_lines(second)] == [
        'validation at epoch 2.00', 'validation at epoch 3.00']
