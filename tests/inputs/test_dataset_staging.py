"""The dataset input staged, as it is on GPU towers: the same rows, the same training,
bytes across the bus as bytes, and an end found one step ahead, never mid-step.

Staging is forced on the virtual CPUs here (staged=True); the placement on GPUs is
checked by `towers explain --plan-only` (tests/tools/test_planonly.py).
"""
import numpy as np
import pytest
import tensorflow as tf

from tests.harness import run_graph
from towers import models
from towers.deviceplan import local_plan
from towers.devices import session_config
from towers.errors import TowersError
from towers.graph import build_training_graph
from towers.inputs import DatasetInput
from towers.model import ClassifierModel
from towers.session import run_steps

tf1 = tf.compat.v1

# Equality tests: TF32 off, op determinism on (tests/conftest.py).
pytestmark = pytest.mark.exact

SHAPE = (28, 28, 1)
DEVICES = ['/cpu:0', '/cpu:1']


def _bytes(num, seed=0):
    """uint8 images whose pixel (0, 0, 0) is their own index, and labels."""
    rng = np.random.RandomState(seed)
    images = rng.randint(0, 256, (num,) + SHAPE).astype(np.uint8)
    images[:, 0, 0, 0] = np.arange(num)
    return images, rng.randint(0, 10, num)


def _steps(source, num_steps, start=0):
    """Per step, per tower: (images, count, batch), driven by the session loop."""
    runs, graph = _runs(source, [(start, num_steps)])
    return runs[0], graph


def _runs(source, runs):
    """_steps of each (start, num_steps) of runs, each run the source started anew as a
    resumed training starts it, in one graph and Session (building them is most of a run's
    cost); and the graph."""
    with tf.Graph().as_default() as graph:
        slices = source.build(SHAPE, DEVICES)
        init = tf1.local_variables_initializer()
    fetches = {'rows': [(s.images, s.count, s.batch) for s in slices]}
    results = []
    with tf1.Session(graph=graph, config=session_config(DEVICES)) as sess:
        for start, num_steps in runs:
            sess.run(init)
            with run_steps(sess, source, fetches, start, num_steps) as loop:
                results.append([values['rows'] for values in loop])
    return results, graph


def _assert_same_steps(staged, unstaged):
    assert len(staged) == len(unstaged)
    for step, reference in zip(staged, unstaged):
        for (images, count, batch), (ref_images, ref_count, ref_batch) in zip(step, reference):
            assert (count, batch) == (ref_count, ref_batch)
            np.testing.assert_array_equal(images[:count], ref_images[:ref_count])


def test_staged_bytes_cross_as_bytes_and_arrive_as_the_unstaged_floats():
    images, labels = _bytes(50)

    def source(staged):
        return DatasetInput(images, labels, batch_size=8, seed=3, mean=[0.25], std=[0.5],
                            staged=staged)
    staged, graph = _steps(source(True), 9)
    unstaged, _ = _steps(source(False), 9)
    _assert_same_steps(staged, unstaged)
    puts = [op for op in graph.get_operations() if op.type == 'Stage']
    assert [(op.device, op.inputs[0].dtype) for op in puts] == [
        ('/device:CPU:0', tf.uint8), ('/device:CPU:1', tf.uint8)]
    # What the towers read is normalised (the seventh step ends the epoch of 50 at 2).
    assert [sum(count for _, count, _ in step) for step in staged] == [8] * 6 + [2, 8, 8]
    first = staged[0][0][0]
    assert first.dtype == np.float32 and first.shape[1:] == SHAPE
    assert abs(first.mean() - (127.5 / 255 - 0.25) / 0.5) < 0.05


def test_a_staged_dataset_resumes_where_the_unstaged_one_does():
    images, labels = _bytes(40)

    def source(staged):
        return DatasetInput(images, labels, batch_size=6, seed=1, staged=staged)
    _assert_same_steps(_steps(source(True), 12, start=5)[0], _steps(source(False), 12, start=5)[0])


def test_a_staged_dataset_ends_with_its_epochs_after_the_same_steps():
    """The end is seen by the put after the last batch: no step is started that has no
    batch, and the last batch is trained on."""
    images, labels = _bytes(20)
    labels[[3, 9]] = 99  # cleaned out: the epochs are 18 records, not 20

    def source(staged):
        return DatasetInput(images, labels, batch_size=4, seed=2, epochs=2, staged=staged)
    (staged, exactly, fewer), _ = _runs(source(True), [(0, 100), (0, 10), (0, 3)])
    unstaged, _ = _steps(source(False), 100)
    assert [sum(count for _, count, _ in step) for step in staged] == [4, 4, 4, 4, 2] * 2
    _assert_same_steps(staged, unstaged)
    # A run asked for exactly the steps there are ends at its count, as one asked for fewer.
    assert len(exactly) == 10 and len(fewer) == 3


def _trained(staged, num_steps=4):
    images, labels = _bytes(30, seed=4)
    source = DatasetInput(images, labels, batch_size=8, seed=5, mean=[0.5], std=[0.25],
                          staged=staged)
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    # Without the evaluation towers, which nothing here runs: a fifth less graph to build.
    graph = build_training_graph(ClassifierModel(model_fn, SHAPE, 10, optimizer='sgd'),
                                 local_plan(DEVICES), seed=7, source=source, learning_rate=0.1,
                                 evaluation=False)
    saved, _, losses = run_graph(graph, num_steps, fetches={'loss': graph.loss})
    return saved, [step['loss'] for step in losses]


def test_a_staged_dataset_trains_exactly_like_the_unstaged_one():
    (staged, staged_losses), (unstaged, losses) = _trained(True), _trained(False)
    assert staged_losses == losses and len(losses) == 4
    assert staged.keys() == unstaged.keys()
    for name in staged:
        np.testing.assert_array_equal(staged[name], unstaged[name], err_msg=name)


@pytest.mark.parametrize('staged', [True, False])
def test_a_step_past_the_count_a_staged_source_was_started_for_is_refused(staged):
    """No batch was put for it: its get would wait forever (bench --trace ran one more)."""
    images, labels = _bytes(20)
    source = DatasetInput(images, labels, batch_size=4, staged=staged)
    with tf.Graph().as_default() as graph:
        slices = source.build(SHAPE, DEVICES)
        init = tf1.local_variables_initializer()
    with tf1.Session(graph=graph, config=session_config(DEVICES)) as sess:
        sess.run(init)
        with run_steps(sess, source, {'rows': [s.count for s in slices]}, 0, 2) as loop:
            assert len(list(loop)) == 2
            if not staged:  # nothing waits: the pipeline has more batches
                assert loop.run_one() is not None
                return
            with pytest.raises(TowersError, match='step 2 of a staged input started for 2 '
                                                  'steps'):
                loop.run_one()
