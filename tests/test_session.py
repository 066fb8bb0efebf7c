"""The session harness: init, load, sync in that order; the source always started and stopped."""
import numpy as np
import pytest
import tensorflow as tf

from tests.harness import fed
from towers import models
from towers.deviceplan import local_plan
from towers.devices import session_config
from towers.graph import build_training_graph
from towers.inputs import InputSource
from towers.model import ClassifierModel
from towers.session import (
    load_variables,
    open_session,
    placement_options,
    run_steps,
    step_options,
    trace_options,
)

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)
DEVICES = ['/cpu:0', '/cpu:1']


def _batches(num, size=6):
    rng = np.random.RandomState(0)
    return [(rng.rand(size, *SHAPE).astype(np.float32), rng.randint(0, 10, size))
            for _ in range(num)]


def _graph(source, variable_update='replicated'):
    model = ClassifierModel(models.build_model('small_convnet', SHAPE, 10), SHAPE, 10,
                            optimizer='sgd')
    return build_training_graph(model, local_plan(DEVICES, variable_update=variable_update),
                                seed=0, source=source, learning_rate=0.1)


def test_open_session_initialises_loads_then_syncs_the_replicas():
    graph = _graph(fed(_batches(1)))
    with graph.graph.as_default():
        variables = graph.strategy.saved_variables()
        replica = {v.op.name: v for v in tf1.global_variables()}['replica_1/logits/biases']
    master = variables['logits/biases']
    values = np.arange(10, dtype=np.float32)
    config = session_config(DEVICES)
    with open_session(graph, config,
                      load=lambda sess: load_variables(sess, variables,
                                                       {'logits/biases': values})) as sess:
        # The replica took the loaded master's value: sync ran after the load.
        assert np.array_equal(sess.run(master), values)
        assert np.array_equal(sess.run(replica), values)


class _Recording(InputSource):
    """Wraps a source and records the calls the harness makes."""

    def __init__(self, inner, calls, fail_stop=False):
        self.inner, self.calls, self.fail_stop = inner, calls, fail_stop

    def build(self, input_shape, tower_devices):
        return self.inner.build(input_shape, tower_devices)

    def start(self, sess, start_step, num_steps):
        self.calls.append(('start', start_step, num_steps))

    def step(self, step):
        self.calls.append(('step', step))
        return self.inner.step(step)

    def stop(self, sess):
        self.calls.append(('stop',))
        if self.fail_stop:
            raise RuntimeError('stop failed')


def _run(calls, start, stop, body=None, fail_stop=False):
    source = _Recording(fed(_batches(stop)), calls, fail_stop)
    graph = _graph(source, 'parameter_server')
    with open_session(graph, session_config(DEVICES)) as sess:
        with run_steps(sess, source, {'train_op': graph.train_op, 'loss': graph.loss}, start,
                       stop) as steps:
            for values in steps:
                assert set(values) == {'train_op', 'loss', 'seconds'} and values['seconds'] > 0
                if body:
                    body(steps)
        return steps.step


def test_run_steps_starts_runs_and_stops_the_source():
    calls = []
    assert _run(calls, 1, 4) == 4
    assert calls == [('start', 1, 4), ('step', 1), ('step', 2), ('step', 3), ('stop',)]


def test_a_break_still_stops_the_source_and_an_error_in_flight_wins_over_a_failing_stop():
    calls = []

    def stop_after_two(steps):
        if steps.step == 2:
            raise KeyError('the loop body failed')
    with pytest.raises(KeyError, match='the loop body failed'):
        _run(calls, 0, 5, stop_after_two, fail_stop=True)
    assert calls == [('start', 0, 5), ('step', 0), ('step', 1), ('stop',)]
    # Without an error in flight, a failing stop is the error.
    with pytest.raises(RuntimeError, match='stop failed'):
        _run([], 0, 1, fail_stop=True)


def test_only_a_traced_step_carries_run_metadata():
    """A cluster's steps run with options that only set a timeout: they trace nothing,
    so no callback may take them for --trace's step (it wrote empty traces over the real one)."""
    source = fed(_batches(3))
    graph = _graph(source, 'parameter_server')

    def options(step):
        return trace_options() if step == 1 else tf1.RunOptions(timeout_in_ms=60000)
    with open_session(graph, session_config(DEVICES)) as sess:
        with run_steps(sess, source, {'train_op': graph.train_op}, 0, 3,
                       run_options=options) as steps:
            traced = ['run_metadata' in values for values in steps]
    assert traced == [False, True, False]


def test_a_step_gets_what_its_callbacks_ask_for_and_no_more():
    assert step_options([]) is None and step_options([False, False]) is None
    audit = step_options([False, placement_options()])
    assert audit.output_partition_graphs and audit.trace_level == tf1.RunOptions.NO_TRACE
    both = step_options([placement_options(), True])  # --trace of the audit's step
    assert both.output_partition_graphs and both.trace_level == tf1.RunOptions.FULL_TRACE
    assert step_options([True]) == trace_options()


def test_the_audits_step_is_untraced_and_a_traced_step_carries_its_step_stats():
    """The placement audit reads the partition graphs alone: a trace on its step would start
    CUPTI on a GPU. A step that --trace asks for keeps its step stats (the timings)."""
    source = fed(_batches(2))
    graph = _graph(source)
    asked = {0: [placement_options()], 1: [placement_options(), True]}
    with open_session(graph, session_config(DEVICES)) as sess:
        with run_steps(sess, source, {'train_op': graph.train_op}, 0, 2,
                       run_options=lambda step: step_options(asked[step])) as steps:
            audit, traced = [values['run_metadata'] for values in steps]
    assert audit.partition_graphs and not audit.step_stats.dev_stats
    assert traced.partition_graphs and traced.step_stats.dev_stats
