"""Input modes: exactly once per epoch, same training as feed, cleaning, clean shutdown."""
import re
import signal
import threading

import numpy as np
import pytest
import tensorflow as tf

from tests.harness import run_graph
from towers import data, models
from towers.config import TrainConfig
from towers.data.sampler import EpochSampler
from towers.deviceplan import local_plan
from towers.devices import session_config
from towers.errors import TowersError
from towers.graph import build_training_graph
from towers.inputs import DatasetInput, FeedInput, PythonInput, StagingInput, SyntheticInput
from towers.model import ClassifierModel
from towers.trainer import train

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)
DEVICES = ['/cpu:0', '/cpu:1']


def _numbered(num):
    """Images whose pixel (0, 0, 0) is their own index, so delivery can be traced."""
    rng = np.random.RandomState(0)
    images = rng.rand(num, *SHAPE).astype(np.float32)
    images[:, 0, 0, 0] = np.arange(num)
    return data.DataSet(images, rng.randint(0, 10, num))


def _delivered(source, num_steps, devices=DEVICES):
    """Run a source alone for num_steps; return the example ids of each step."""
    with tf.Graph().as_default() as graph:
        slices = source.build(SHAPE, devices)
        init = tf1.local_variables_initializer()
    steps = []
    with tf1.Session(graph=graph, config=session_config(devices)) as sess:
        sess.run(init)
        source.start(sess, 0, num_steps)
        try:
            for step in range(num_steps):
                extra, feed = source.step(step)
                values = sess.run([(s.images, s.count) for s in slices] + extra, feed)
                steps.append(np.concatenate([images[:count, 0, 0, 0].astype(int)
                                             for images, count in values[:len(slices)]]))
        finally:
            source.stop(sess)
    return steps


def test_staging_delivers_each_example_exactly_once_per_epoch():
    train_set = _numbered(50)
    sampler = EpochSampler(50, 8, seed=3)  # 7 steps an epoch, the last of 2
    steps = _delivered(StagingInput(train_set, sampler), 14)
    assert [len(s) for s in steps] == [8] * 6 + [2] + [8] * 6 + [2]
    for epoch in (steps[:7], steps[7:]):
        assert sorted(np.concatenate(epoch)) == list(range(50))
    # One loader thread keeps the sampler's order: the same batches feed would give.
    assert [list(s) for s in steps] == [list(sampler.indices(k)) for k in range(14)]


def test_staging_with_several_loader_threads_still_delivers_each_example_once():
    sampler = EpochSampler(50, 8, seed=3)
    steps = _delivered(StagingInput(_numbered(50), sampler, num_threads=3), 7)
    assert sorted(np.concatenate(steps)) == list(range(50))


def test_dataset_delivers_each_example_exactly_once_per_epoch():
    train_set = _numbered(50)
    source = DatasetInput(train_set.images, train_set.labels, batch_size=8, seed=3)
    steps = _delivered(source, 14)
    assert [len(s) for s in steps] == [8] * 6 + [2] + [8] * 6 + [2]
    first, second = np.concatenate(steps[:7]), np.concatenate(steps[7:])
    assert sorted(first) == list(range(50)) and sorted(second) == list(range(50))
    assert list(first) != list(second), 'each epoch is reshuffled'


def _rows(source, devices, starts, num_steps=8):
    """For each start: per step, per tower, (example ids, count, batch) of a source run alone
    from that step, started anew as a resumed training starts it. One graph and Session for
    every start: building them is most of a run's cost."""
    with tf.Graph().as_default() as graph:
        slices = source.build(SHAPE, devices)
        init = tf1.local_variables_initializer()
    runs = []
    with tf1.Session(graph=graph, config=session_config(['/cpu:0', '/cpu:1'])) as sess:
        for start in starts:
            sess.run(init)
            source.start(sess, start, num_steps)
            runs.append([[(list(images[:count, 0, 0, 0].astype(int)), count, batch)
                          for images, count, batch in sess.run([(s.images, s.count, s.batch)
                                                                for s in slices])]
                         for _ in range(num_steps)])
    return runs


def test_a_cluster_workers_dataset_keeps_the_rows_of_its_towers_in_one_process():
    """Worker k of 2 (one tower each) reads what tower k of one process reads, resumed alike."""
    train_set = _numbered(50)

    def source(share=None):
        return DatasetInput(train_set.images, train_set.labels, batch_size=7, seed=3,
                            share=share)
    starts = (0, 5)
    workers = [_rows(source((k, 2)), ['/cpu:0'], starts) for k in (0, 1)]
    for run, whole in enumerate(_rows(source(), DEVICES, starts)):
        for k in (0, 1):
            mine = workers[k][run]
            # The same rows; the weights within the worker's own share.
            assert [step[0] for step in mine] == [(ids, count, count) for ids, count, _
                                                  in (step[k] for step in whole)]
    assert [len(step[0][0]) + len(step[1][0]) for step in whole] == [7] * 2 + [1] + [7] * 5


def test_in_graph_towers_on_several_tasks_read_on_their_own_task():
    """No batch crosses the network: each task has its pipeline, its towers' rows on it."""
    train_set = _numbered(50)
    devices = ['/job:worker/task:%d/device:CPU:%d' % (k, i) for k in (0, 1) for i in (0, 1)]
    with tf.Graph().as_default() as graph:
        slices = DatasetInput(train_set.images, train_set.labels, batch_size=8,
                              seed=3).build(SHAPE, devices)
    reads = sorted(op.device for op in graph.get_operations() if op.type == 'IteratorGetNextSync'
                   or op.type == 'IteratorGetNext')
    assert reads == ['/job:worker/task:0/device:CPU:0', '/job:worker/task:1/device:CPU:0']
    for i, piece in enumerate(slices):
        assert piece.images.device == '/job:worker/task:%d/device:CPU:0' % (i // 2)
        assert piece.batch.device.startswith('/job:worker/task:%d/' % (i // 2))


def _drain(source):
    """Read a finite dataset source to its end on one tower.

    Returns:
      (the example ids of each batch, source.cleaning() at the end).
    """
    with tf.Graph().as_default() as graph:
        slices = source.build(SHAPE, ['/cpu:0'])
        init = tf1.local_variables_initializer()
    batches = []
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        source.start(sess, 0, 100)
        with pytest.raises(tf.errors.OutOfRangeError):
            while True:
                batches.append(sess.run(slices[0].images)[:, 0, 0, 0].astype(int))
        return batches, source.cleaning(sess)


def test_dataset_cleaning_drops_and_counts_bad_records():
    train_set = _numbered(20)
    images, labels = train_set.images.copy(), train_set.labels.copy()
    images[3, 5, 5, 0] = np.nan
    images[7, 1, 2, 0] = np.inf
    labels[11], labels[12] = -1, 10
    source = DatasetInput(images, labels, num_classes=10, batch_size=4, epochs=1,
                          shuffle_buffer=0)
    batches, cleaning = _drain(source)
    kept = list(np.concatenate(batches))
    assert cleaning == (4, 20)
    assert kept == [i for i in range(20) if i not in (3, 7, 11, 12)]


def _train_variables(source, num_steps=3, devices=DEVICES):
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    # Without the evaluation towers, which nothing here runs: a fifth less graph to build.
    graph = build_training_graph(ClassifierModel(model_fn, SHAPE, 10, optimizer='sgd'),
                                 local_plan(devices), seed=7, source=source, learning_rate=0.1,
                                 evaluation=False)
    saved, _, _ = run_graph(graph, num_steps)
    return [saved[v.op.name]
            for v in graph.graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)]


def _in_order():
    """30 images in batches of 8 in a fixed order (4 steps an epoch, the last of 6), and
    that order."""
    train_set = _numbered(30)
    train_set.images[:, 0, 0, 0] = 0.5  # the ids were only for tracing
    return train_set, EpochSampler(30, 8, shuffle=False)


@pytest.fixture(scope='module')
def fed_reference():
    """The variables feed trains to in 6 steps of _in_order (into its second epoch): what
    every other mode is held to, trained once for the tests that compare with it."""
    return _train_variables(FeedInput(*_in_order()), num_steps=6)


def test_every_mode_trains_exactly_like_feed(fed_reference):
    train_set, in_order = _in_order()
    reference = fed_reference
    staged = _train_variables(StagingInput(train_set, in_order), num_steps=6)
    piped = _train_variables(DatasetInput(train_set.images, train_set.labels, batch_size=8,
                                          shuffle_buffer=0), num_steps=6)
    for ref, stage, pipe in zip(reference, staged, piped):
        np.testing.assert_array_equal(stage, ref)
        np.testing.assert_allclose(pipe, ref, rtol=1e-6, atol=1e-7)


def test_synthetic_slices_sit_on_their_towers():
    source = SyntheticInput(5, 10)
    with tf.Graph().as_default():
        slices = source.build(SHAPE, ['/cpu:0', '/cpu:1'])
        init = tf1.local_variables_initializer()
        with tf1.Session(config=session_config(['/cpu:0', '/cpu:1'])) as sess:
            sess.run(init)
            values = sess.run([(s.images, s.labels, s.count, s.batch) for s in slices])
    assert [v[2] for v in values] == [3, 2] and [v[3] for v in values] == [5, 5]
    assert values[0][0].shape == (3,) + SHAPE and values[1][1].shape == (2,)
    assert all(0 <= label < 10 for v in values for label in v[1])


def _finishes(fn, seconds=60):
    """Run fn in a thread; True when it returned within `seconds` (no hang)."""
    outcome = {}

    def target():
        try:
            outcome['value'] = fn()
        except BaseException as e:  # noqa: B902 - reported to the test below
            outcome['error'] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), outcome


def test_staging_stops_cleanly_at_the_end_of_data():
    sampler = EpochSampler(20, 4)
    source = StagingInput(_numbered(20), sampler, capacity=2)
    done, outcome = _finishes(lambda: _delivered(source, 5))
    assert done and 'error' not in outcome
    assert not any(t.name.startswith('towers-loader') for t in threading.enumerate())


def test_a_loader_error_reaches_the_trainer_without_a_hang():
    train_set = _numbered(40)

    def batches(step):
        if step == 2:
            raise OSError('disk went away')
        return train_set.images[:4], train_set.labels[:4]

    source = StagingInput(batches=batches, capacity=2)
    done, outcome = _finishes(lambda: _train_variables(source, num_steps=6))
    assert done, 'a failing loader must not hang the trainer'
    assert isinstance(outcome.get('error'), TowersError)
    assert str(outcome['error']) == 'the data loader failed: OSError: disk went away'
    assert not any(t.name.startswith('towers-loader') for t in threading.enumerate())


def test_stop_while_the_loader_waits_on_a_full_queue():
    source = StagingInput(_numbered(40), EpochSampler(40, 4), capacity=1)
    with tf.Graph().as_default() as graph:
        slices = source.build(SHAPE, DEVICES)
    with tf1.Session(graph=graph, config=session_config(DEVICES)) as sess:
        source.start(sess, 0, 50)  # 50 steps to load, room for 1 in the queue
        extra, _ = source.step(0)
        sess.run([slices[0].images] + extra)
        loader, = [t for t in threading.enumerate() if t.name.startswith('towers-loader')]
        done, outcome = _finishes(lambda: source.stop(sess), seconds=30)
    assert done and 'error' not in outcome
    assert not loader.is_alive()


def test_ctrl_c_during_staged_training_exits_cleanly(tmp_path, forks):
    with forks.training(['train', '--input', 'staging', '--towers', '2', '--devices', 'cpu',
                         '--model', 'small_convnet', '--steps', '100000', '--log-every', '5'],
                        tmp_path) as run:
        run.wait_for_line('step 5/100000')
        run.send_signal(signal.SIGINT)
        status = run.finish(timeout=60)
    assert status == 130, run.err
    assert run.err[-1] == 'towers: interrupted'


class _Batches:
    """A Python data source: batch i of a DataSet in a fixed order (picklable)."""

    def __init__(self, dataset, batch_size, fail_at=None):
        self.dataset, self.batch_size, self.fail_at = dataset, batch_size, fail_at
        self.sampler = EpochSampler(dataset.num_examples, batch_size, shuffle=False)

    def __len__(self):
        return self.sampler.steps_per_epoch

    def __getitem__(self, index):
        if index == self.fail_at:
            raise ValueError('unreadable batch %d' % index)
        batch = self.sampler.indices(index)
        return self.dataset.images[batch], self.dataset.labels[batch]


def test_a_python_source_with_parallel_workers_trains_exactly_like_feed(fed_reference):
    train_set, _ = _in_order()
    python = PythonInput(_Batches(train_set, 8), num_workers=3, workers='thread')
    assert python.steps_per_epoch == 4
    # 6 steps, as the reference: crosses into epoch 2.
    for ref, got in zip(fed_reference, _train_variables(python, num_steps=6)):
        np.testing.assert_array_equal(got, ref)


def test_a_python_source_worker_error_stops_training_with_that_error():
    source = PythonInput(_Batches(_numbered(40), 4, fail_at=3), num_workers=2, workers='thread')
    done, outcome = _finishes(lambda: _train_variables(source, num_steps=8))
    assert done, 'a failing worker must not hang the trainer'
    assert isinstance(outcome.get('error'), TowersError)
    assert re.fullmatch(r'the data loader failed: PrefetchError: batch 3 of 10 failed in '
                        r'prefetch worker [01]: ValueError: unreadable batch 3',
                        str(outcome['error'])), outcome['error']
    assert not any(t.name.startswith('towers-loader') for t in threading.enumerate())


def test_dataset_epochs_are_what_cleaning_kept_and_training_ends_with_them():
    train_set = _numbered(20)
    bad = [2, 7, 11, 19]
    train_set.images[bad, 3, 3, 0] = np.nan
    source = DatasetInput(train_set.images, train_set.labels, batch_size=4, seed=1, epochs=2)
    steps, cleaning = _drain(source)
    assert cleaning == (8, 40)  # two full passes: 4 dropped each
    kept = [i for i in range(20) if i not in bad]
    assert len(steps) == 8  # 16 kept at 4 a step, twice
    assert sorted(np.concatenate(steps[:4])) == kept and sorted(np.concatenate(steps[4:])) == kept


def test_training_on_a_dataset_input_stops_at_the_end_of_its_epochs():
    rng = np.random.RandomState(0)
    images = rng.rand(20, *SHAPE).astype(np.float32)
    images[[2, 7, 11, 19], 0, 0, 0] = np.inf
    test_set = data.DataSet(np.zeros((5,) + SHAPE, np.float32), rng.randint(0, 10, 5))
    datasets = data.Datasets(data.DataSet(images, rng.randint(0, 10, 20)), None, test_set)
    lines = []
    config = TrainConfig(towers=('/cpu:0',), batch_size=4, epochs=2, input='dataset',
                         optimizer='sgd', learning_rate=0.01, warmup_steps=0, log_every=100)
    result = train(config, models.build_model('small_convnet', SHAPE, 10), datasets, SHAPE,
                   log=lines.append)
    assert result['steps'] == 8 and result['dropped'] == 8
    assert 'cleaning dropped 8 of the 40 records read (every pass reads and cleans again)' \
        in lines


def test_dataset_normalises_per_channel_and_checks_the_channel_count():
    images = np.random.RandomState(2).randint(0, 256, (6,) + SHAPE).astype(np.uint8)
    source = DatasetInput(images, np.arange(6) % 10, batch_size=6, shuffle_buffer=0,
                          mean=[0.25], std=[0.5])
    with tf.Graph().as_default() as graph:
        slices = source.build(SHAPE, ['/cpu:0'])
        init = tf1.local_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        source.start(sess, 0, 1)
        got = sess.run(slices[0].images)
    np.testing.assert_allclose(got, (images / np.float32(255) - 0.25) / 0.5, rtol=1e-6)
    with tf.Graph().as_default(), pytest.raises(TowersError, match='one value per channel'):
        DatasetInput(images, np.arange(6), mean=[0.1, 0.2, 0.3], std=[1, 1, 1]).build(
            SHAPE, ['/cpu:0'])


@pytest.mark.parametrize('argv,message', [
    (['--mean', '0.5', '--std', '0.2'], '--mean/--std normalise in the tf.data pipeline'),
    (['--input', 'dataset', '--mean', '0.5'], '--mean and --std go together'),
    (['--input', 'dataset', '--mean', 'x', '--std', '1'], '--mean wants comma-separated numbers'),
    (['--input', 'dataset', '--mean', '0.5', '--std', '0'], '--std values must be positive')])
def test_normalisation_flags_are_checked(argv, message, capsys):
    from towers.cli import main
    assert main(['train', '--steps', '1'] + argv) == 1
    assert message in capsys.readouterr().err


def test_a_loader_raising_a_runtime_error_still_reaches_the_trainer():
    def batches(step):
        raise NotImplementedError('no batches here')

    done, outcome = _finishes(lambda: _train_variables(StagingInput(batches=batches),
                                                       num_steps=3))
    assert done, 'a RuntimeError in the loader must not hang the trainer'
    assert str(outcome.get('error')) == ('the data loader failed: NotImplementedError: '
                                         'no batches here')
