"""The reporting callbacks: TensorBoard events, stats.jsonl, the progress bar and lines."""
import glob
import io
import json
import os
import re
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.callbacks.common import (
    SHAPE,
    Recorder,
    easy_datasets,
    make_trainer,
    model_fn,
    stats_lines,
    step_lines,
)
from towers import callbacks as cb
from towers.callbacks import monitors

tf1 = tf.compat.v1


def _event_files(logdir):
    return sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*')),
                  key=os.path.getmtime)


def _events(path):
    return list(tf1.train.summary_iterator(path))


def test_tensorboard_writes_scalars_the_graph_and_histograms_and_marks_a_resume(tmp_path):
    logdir, lines = str(tmp_path), []
    callbacks = [monitors.TensorBoard(every_steps=2, histograms=True), cb.Evaluate(),
                 cb.Checkpoint(every_steps=0)]
    make_trainer(callbacks, lines, towers=['/cpu:0', '/cpu:1'], steps_per_epoch=3, steps=4,
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
    train_tags = {'loss', 'accuracy', 'top5', 'learning_rate', 'images_per_sec', 'tower_0/loss',
                  'tower_1/loss'}
    eval_tags = {'test/loss', 'test/accuracy', 'test/top5'}
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
        model_fn()(tf1.placeholder(tf.float32, [None, *SHAPE]), True)
        assert {v.op.name for v in tf1.trainable_variables()} == variables
    assert set(histograms) == {2, 4}
    weights = tf.train.load_variable(os.path.join(logdir, 'model.ckpt-4'), 'conv1/weights')
    for step in (2, 4):
        assert set(histograms[step]) == {'histograms/' + name for name in variables}
        assert histograms[step]['histograms/conv1/weights'].num == weights.size
    assert not any(event.HasField('session_log') for event in events)

    # A resumed run's file marks the step it restarts from.
    make_trainer([monitors.TensorBoard(every_steps=2), cb.Checkpoint(every_steps=0)], [],
                 towers=['/cpu:0', '/cpu:1'], steps_per_epoch=3, steps=5,
                 logdir=logdir).train()
    resumed = _events(_event_files(logdir)[-1])
    starts = [event.step for event in resumed if event.HasField('session_log')
              and event.session_log.status == tf1.SessionLog.START]
    assert starts == [4]
    assert {value.tag for event in resumed if event.step == 5
            for value in event.summary.value} == train_tags


def test_tensorboard_itself_reads_the_run(tmp_path):
    # The `tensorboard` extra: what `tensorboard --logdir` loads, its scalars, graph and
    # histograms, from one run of towers.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    make_trainer([monitors.TensorBoard(every_steps=2, histograms=True), cb.Evaluate(),
                  cb.Checkpoint(every_steps=0)], [], towers=['/cpu:0', '/cpu:1'],
                 steps_per_epoch=3, steps=4, logdir=str(tmp_path)).train()
    run = EventAccumulator(str(tmp_path), size_guidance={'histograms': 0})
    run.Reload()
    tags = run.Tags()
    assert set(tags['scalars']) == {'loss', 'accuracy', 'top5', 'learning_rate',
                                    'images_per_sec', 'tower_0/loss', 'tower_1/loss',
                                    'test/loss', 'test/accuracy', 'test/top5'}
    assert [e.step for e in run.Scalars('learning_rate')] == [2, 4]
    assert run.Scalars('learning_rate')[-1].value == pytest.approx(0.05)
    assert [e.step for e in run.Scalars('test/accuracy')] == [3, 4]
    assert tags['graph'] and any(node.name.startswith('tower_1/') for node in run.Graph().node)
    assert set(tags['histograms']) == {'histograms/conv1/weights', 'histograms/conv1/biases',
                                       'histograms/logits/weights', 'histograms/logits/biases'}


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


def test_stats_file_has_one_line_per_epoch_with_weighted_means_and_survives_a_resume(
        tmp_path):
    logdir = str(tmp_path)
    # 50 examples at 20 per step: epochs of 3 steps of 20, 20 and 10 examples.
    sets = easy_datasets(train=50)
    recorder = Recorder(order=45)
    started = time.time()
    make_trainer([cb.Evaluate(), monitors.StatsFile(), cb.Checkpoint(every_steps=0), recorder],
                 [], datasets=sets, batch_size=20, epochs=2, logdir=logdir).train()
    finished = time.time()
    stats = stats_lines(logdir)
    assert [line['step'] for line in stats] == [3, 6]
    assert [line['epoch'] for line in stats] == [1.0, 2.0]
    assert [int(v['batch']) for v in recorder.values] == [20, 20, 10] * 2
    for line, epoch_values, evaluation in zip(stats, (recorder.values[:3],
                                                      recorder.values[3:]),
                                              recorder.epoch_stats):
        assert set(line) == {'epoch', 'step', 'time', 'learning_rate', 'images_per_sec',
                             'train_loss', 'train_accuracy', 'train_top5', 'test_loss',
                             'test_accuracy', 'test_top5'}
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
    make_trainer([cb.Evaluate(), monitors.StatsFile(), cb.Checkpoint(every_steps=0)], lines,
                 datasets=sets, batch_size=20, epochs=3, logdir=logdir).train()
    assert 'resumed from %s' % os.path.join(logdir, 'model.ckpt-6') in lines
    resumed = stats_lines(logdir)
    assert resumed[:2] == stats
    assert [line['step'] for line in resumed] == [3, 6, 9]
    assert 'by_hand' not in resumed[2] and resumed[2]['epoch'] == 3.0


# --- Progress -----------------------------------------------------------------------------


class _Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def test_progress_logs_plain_lines_every_k_steps_and_at_the_last():
    stream, lines, recorder = io.StringIO(), [], Recorder()
    make_trainer([monitors.Progress(every=4, stream=stream), recorder], lines,
                 steps_per_epoch=10, steps=10).train()
    printed = step_lines(lines)
    assert len(printed) == 3
    for line, step in zip(printed, (4, 8, 10)):
        match = re.fullmatch(r'step %d/10 epoch %.2f: loss (\S+) accuracy (\S+) top5 \S+ lr 0\.05 '
                             r'\| ([\d.]+) images/sec' % (step, step / 10), line)
        assert match, line
        values = recorder.values[step - 1]
        assert match.group(1) == '%.4f' % values['loss']
        assert match.group(2) == '%.4f' % values['accuracy']
        assert float(match.group(3)) > 0
    assert stream.getvalue() == ''


def test_progress_draws_a_bar_on_a_terminal_and_other_lines_still_arrive(tmp_path):
    tty, lines = _Tty(), []
    trainer = make_trainer([monitors.Progress(every=4, stream=tty), cb.Evaluate(),
                        cb.Checkpoint(every_steps=0)], lines, steps_per_epoch=10,
                           steps=10, logdir=str(tmp_path))
    trainer.train()
    assert '10/10' in tty.getvalue()
    assert step_lines(lines) == []
    assert lines[0].startswith('training 10 steps on 1 tower(s)')
    assert lines[1] == 'exact: a resume continues bit-exactly (CPU kernels; op determinism off)'
    assert lines[2] == 'variables: /cpu:0; maps NHWC'  # where the run's plan keeps them
    assert lines[3] == 'augment: center (the default for 28x28x1 images; evaluation: centre)'
    assert [line.split(':')[0] for line in lines[4:]] == ['test at epoch 1.00', 'checkpoint',
                                                          'trained to step 10', 'test']
    assert trainer.log == lines.append  # given back when the bar closed


def test_progress_quiet_logs_plain_lines_even_on_a_terminal():
    tty, lines = _Tty(), []
    make_trainer([monitors.Progress(every=5, quiet=True, stream=tty)], lines,
                 steps_per_epoch=10, steps=10).train()
    assert [line.split(':')[0] for line in step_lines(lines)] == [
        'step 5/10 epoch 0.50', 'step 10/10 epoch 1.00']
    assert tty.getvalue() == ''


# --- NaNGuard -----------------------------------------------------------------------------
