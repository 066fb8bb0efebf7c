"""--trace: one step as a Chrome trace with events on every tower device, and its summary."""
import json
import re
import types

import numpy as np
import pytest
import tensorflow as tf

from towers import data, models
from towers.callbacks import Callback, PlacementAudit
from towers.config import TrainConfig
from towers.session import step_options
from towers.tools import trace
from towers.tools.bench import run_bench
from towers.tools.trace import Trace
from towers.trainer import train

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)


def _devices_with_events(path):
    with open(path) as f:
        events = json.load(f)['traceEvents']
    names = {e['pid']: e['args']['name'] for e in events
             if e.get('ph') == 'M' and e.get('name') == 'process_name'}
    return {trace.short_device(names[e['pid']].split()[0]) for e in events
            if e.get('ph') == 'X'}


def test_train_traces_the_first_step_after_warm_up(tmp_path):
    rng = np.random.RandomState(0)
    sets = data.Datasets(data.DataSet(rng.rand(60, *SHAPE).astype(np.float32),
                                      rng.randint(0, 10, 60)), None, None)
    path = str(tmp_path / 'step.json')
    lines = []
    picture = tmp_path / 'step.png'
    train(TrainConfig(towers=['/cpu:0', '/cpu:1', '/cpu:2'], batch_size=12, steps=6,
                      warmup_steps=3, log_every=100),
          models.build_model('small_convnet', SHAPE, 10), sets, SHAPE, log=lines.append,
          callbacks=[Trace(path, plot=str(picture))])
    assert _devices_with_events(path) >= {'/cpu:0', '/cpu:1', '/cpu:2'}
    assert picture.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # Step 4 alone: not also step 1, whose partition graphs the placement audit reads.
    assert [line for line in lines if line.startswith('trace of step')] == [
        'trace of step 4: %s (open it in ui.perfetto.dev or chrome://tracing)' % path]
    start = lines.index('trace of step 4: %s (open it in ui.perfetto.dev or chrome://tracing)'
                        % path)
    step = re.fullmatch(r'step ([\d.]+) ms; averaging ([\d.]+) ms, apply ([\d.]+) ms',
                        lines[start + 1])
    assert step, lines[start + 1]
    step_ms, average_ms, apply_ms = map(float, step.groups())
    assert step_ms > 0 and 0 <= average_ms <= step_ms and 0 <= apply_ms <= step_ms
    # The averaging and the apply are in the trace (their times may print as 0.0 ms).
    with open(path) as f:
        names = {e.get('args', {}).get('name', '') for e in json.load(f)['traceEvents']}
    assert any(n.startswith('average_gradients') for n in names)
    with open(path) as f:
        assert any('Apply' in e.get('name', '') for e in json.load(f)['traceEvents'])
    for i, device in enumerate(['/cpu:0', '/cpu:1', '/cpu:2']):
        busy = re.fullmatch(r'  %s +busy ([\d.]+) ms \((\d+)%%\), idle ([\d.]+) ms' % device,
                            lines[start + 2 + i])
        assert busy, lines[start + 2 + i]
        assert float(busy.group(1)) + float(busy.group(3)) == pytest.approx(step_ms, abs=0.11)


class _Metadata(Callback):
    """Each step's RunMetadata, where it has one."""

    def __init__(self):
        self.by_step = {}

    def after_step(self, trainer, values):
        if 'run_metadata' in values:
            self.by_step[trainer.step] = values['run_metadata']


def test_a_trace_of_the_audits_step_is_a_full_trace_with_the_partition_graphs(tmp_path):
    rng = np.random.RandomState(0)
    sets = data.Datasets(data.DataSet(rng.rand(20, *SHAPE).astype(np.float32),
                                      rng.randint(0, 10, 20)), None, None)
    path, lines, seen = str(tmp_path / 'step.json'), [], _Metadata()
    train(TrainConfig(towers=['/cpu:0', '/cpu:1'], batch_size=10, steps=2, log_every=100),
          models.build_model('small_convnet', SHAPE, 10), sets, SHAPE, log=lines.append,
          callbacks=[Trace(path, step=1), seen])
    metadata = seen.by_step[1]
    assert metadata.partition_graphs  # the audit's
    assert any(device.node_stats for device in metadata.step_stats.dev_stats)  # --trace's
    assert _devices_with_events(path) >= {'/cpu:0', '/cpu:1'}
    assert 2 not in seen.by_step  # and no other step is traced or placed
    # What the Trainer asks for on that step: both callbacks' options, merged.
    trainer = types.SimpleNamespace(step=0, warmup_steps=0, num_steps=2)
    callbacks = [PlacementAudit(), Trace(path, step=1)]
    for callback in callbacks:
        callback.before_train(trainer)
    options = step_options(callback.wants_trace(trainer) for callback in callbacks)
    assert options.trace_level == tf1.RunOptions.FULL_TRACE and options.output_partition_graphs


def test_bench_traces_its_first_row(tmp_path):
    path = str(tmp_path / 'bench.json')
    lines = []
    run_bench(models.build_model('small_convnet', SHAPE, 10), SHAPE, 10, [2], batch_size=8,
              warmup_steps=1, timed_steps=2, log=lines.append, trace=path, devices='cpu')
    assert _devices_with_events(path) >= {'/cpu:0', '/cpu:1'}
    assert lines[0] == 'variables: /cpu:0'
    assert lines[1].startswith('trace of step 2: %s' % path)


def test_busy_time_is_the_union_of_the_intervals():
    assert trace._union([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert trace._union([]) == 0
    assert trace.short_device('/job:localhost/replica:0/task:0/device:GPU:3') == '/gpu:3'


def test_a_trace_step_outside_the_run_and_an_unwritable_path_are_errors(tmp_path):
    from towers.errors import TowersError
    rng = np.random.RandomState(0)
    sets = data.Datasets(data.DataSet(rng.rand(20, *SHAPE).astype(np.float32),
                                      rng.randint(0, 10, 20)), None, None)
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    with pytest.raises(TowersError, match=r'trace_step 50 is not among the steps this run '
                                          r'takes \(1 to 3\)'):
        train(TrainConfig(batch_size=10, steps=3), model_fn, sets, SHAPE,
              log=lambda line: None, callbacks=[Trace(str(tmp_path / 't.json'), step=50)])
    with pytest.raises(TowersError, match='trace .*: folder .* does not exist'):
        Trace(str(tmp_path / 'no' / 't.json'))
