"""towers bench: timed images/sec per tower count, mean and standard error."""
import math
import re

import numpy as np
import pytest

from towers import data, models
from towers.deviceplan import local_plan
from towers.errors import TowersError
from towers.inputs import INPUT_MODES, SyntheticInput
from towers.tools.bench import mean_stderr, measure, measure_interleaved, run_bench
from towers.tools.benchtable import variables_line, xla_line

SHAPE = (28, 28, 1)


def test_mean_stderr_on_known_numbers():
    values = [1.0, 2.0, 3.0, 4.0]
    mean, stderr = mean_stderr(values)
    assert mean == 2.5
    # sample std (ddof=1) of 1..4 is sqrt(5/3); over sqrt(4).
    assert stderr == pytest.approx(math.sqrt(5 / 3) / 2, rel=1e-12)
    assert stderr == pytest.approx(np.std(values, ddof=1) / np.sqrt(len(values)), rel=1e-12)
    assert mean_stderr([7, 7, 7]) == (7.0, 0.0)


def test_mean_stderr_of_one_value_has_no_error_bar():
    mean, stderr = mean_stderr([120.0])
    assert mean == 120.0 and math.isnan(stderr)


def _tiny_dataset(num=40):
    rng = np.random.RandomState(0)
    return data.DataSet(rng.randint(0, 256, (num,) + SHAPE).astype(np.uint8),
                        rng.randint(0, 10, num))


def test_measure_times_a_real_window():
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    mean, stderr = measure(model_fn, SHAPE, local_plan(['/cpu:0', '/cpu:1']),
                           SyntheticInput(8, 10), warmup_steps=2, timed_steps=3)
    assert math.isfinite(mean) and mean > 0
    assert math.isfinite(stderr) and stderr >= 0


def test_measure_leaves_the_warm_up_out():
    # A fake clock: two warm-up steps of 100 s, then timed steps of exactly 0.5 s.
    durations = iter([100.0, 100.0, 0.5, 0.5, 0.5])
    now = [0.0]
    started = [False]

    def clock():
        if started[0]:
            now[0] += next(durations)
        started[0] = not started[0]
        return now[0]

    model_fn = models.build_model('small_convnet', SHAPE, 10)
    mean, stderr = measure(model_fn, SHAPE, local_plan(['/cpu:0']), SyntheticInput(8, 10),
                           warmup_steps=2, timed_steps=3, clock=clock)
    assert (mean, stderr) == (16.0, 0.0)  # 8 images / 0.5 s, warm-up not counted


def test_run_bench_every_input_mode_and_the_ratios():
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    lines = []
    rows = run_bench(model_fn, SHAPE, 10, [1, 2], batch_size=8, modes=INPUT_MODES,
                     dataset=_tiny_dataset(), warmup_steps=1, timed_steps=2, log=lines.append,
                     devices='cpu')
    assert [(r['towers'], r['input']) for r in rows] == [(n, m) for n in (1, 2)
                                                         for m in INPUT_MODES]
    assert {r['devices'] for r in rows} == {'/cpu:0', '/cpu:0,/cpu:1'}
    synthetic = {r['towers']: r['mean'] for r in rows if r['input'] == 'synthetic'}
    for row in rows:
        assert math.isfinite(row['mean']) and row['mean'] > 0
        assert row['vs_synthetic'] == row['mean'] / synthetic[row['towers']]
        first = next(r for r in rows if r['input'] == row['input'])
        assert row['vs_first'] == row['mean'] / first['mean']
    # Where the variables are, the rows' augmentation (train's default), a header, then one
    # line per row, in order.
    assert len(lines) == 3 + len(rows)
    assert lines[0] == 'variables: /cpu:0'
    assert lines[1] == 'augment: center (the default for 28x28x1 images; evaluation: centre)'
    assert lines[2].split()[:5] == ['input', 'towers', 'precision', 'devices', 'images/sec']
    for line, row in zip(lines[3:], rows):
        fields = line.split()
        assert fields[:4] == [row['input'], str(row['towers']), 'fp32', row['devices']]
        assert fields[4:7] == ['%.1f' % row['mean'], '±', '%.1f' % row['stderr']]
        # One precision: no ratio to the first precision in the table (it is 1).
        assert fields[7:] == ['%.3f' % row['vs_synthetic'], '%.3f' % row['vs_first']]
        assert row['precision'] == 'fp32' and row['vs_precision'] == 1.0


NEEDS = 'bench needs batch_size >= 1, timed_steps >= 2 and warmup_steps >= 0; got '


@pytest.mark.parametrize('batch_size,window,warmup,message', [
    (0, 5, 1, NEEDS + '0, 5 and 1'), (8, 1, 1, NEEDS + '8, 1 and 1'),
    (8, 5, -1, NEEDS + '8, 5 and -1')])
def test_run_bench_refuses_numbers_it_cannot_measure(batch_size, window, warmup, message):
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    with pytest.raises(TowersError, match='^%s$' % re.escape(message)):
        run_bench(model_fn, SHAPE, 10, [1], batch_size=batch_size, warmup_steps=warmup,
                  timed_steps=window, log=lambda line: None)


def test_configurations_are_timed_in_turns():
    order = []

    class Recording(SyntheticInput):
        def __init__(self, label):
            super().__init__(4, 10)
            self.label = label

        def step(self, step):
            order.append(self.label)
            return super().step(step)

    model_fn = models.build_model('small_convnet', SHAPE, 10)
    configs = [dict(model_fn=model_fn, input_shape=SHAPE, plan=local_plan(['/cpu:0']),
                    source=Recording(label)) for label in 'ab']
    results = measure_interleaved(configs, warmup_steps=1, timed_steps=4, rounds=2)
    assert order == list('a' 'b' 'aa' 'bb' 'aa' 'bb')
    assert len(results) == 2 and all(mean > 0 for mean, _ in results)


def test_the_variables_line_says_each_tower_counts_home_where_they_differ():
    assert variables_line({'/cpu:0': [1, 2, 4]}) == 'variables: /cpu:0'
    assert variables_line({'/gpu:0': [1], '/cpu:0': [2, 4]}) == (
        'variables: /gpu:0 at 1 tower(s); /cpu:0 at 2,4 tower(s)')


def test_bench_xla_compiles_every_row_in_every_precision_on_cpu_towers(tmp_path, forks):
    # A process of its own, as a user starts it: main sets TF_XLA_FLAGS for the CPU towers
    # after TensorFlow's import, before it first looks at its devices (pytest's process has;
    # the fork server, which forks it, has not).
    status, lines, err = forks.run(
        ['bench', '--xla', '--devices', 'cpu', '--towers', '1', '--model', 'small_convnet',
         '--batch-size', '8', '--warmup', '1', '--window', '2', '--precision', 'fp32,bf16'],
        tmp_path, env={'TF_XLA_FLAGS': None})
    assert status == 0, err
    assert ', adam, every row under XLA auto-clustering (each compiled), 1 warm-up' in lines[0]
    assert re.fullmatch(r'XLA: every row ran compiled clusters \(\d+( to \d+)? a step\)',
                        lines[-1]), lines


def test_the_xla_line_names_the_rows_that_compiled_nothing():
    rows = [{'input': 'synthetic', 'towers': 1, 'precision': p, 'xla_clusters': n}
            for p, n in (('fp32', 1), ('bf16', 3))]
    assert xla_line(rows) == 'XLA: every row ran compiled clusters (1 to 3 a step)'
    assert xla_line(rows[:1]) == 'XLA: every row ran compiled clusters (1 a step)'
    rows[1]['xla_clusters'] = 0
    assert xla_line(rows) == (
        'XLA: no cluster compiled in synthetic/1/bf16 (on CPU towers TensorFlow clusters only '
        'when TF_XLA_FLAGS holds --tf_xla_cpu_global_jit before it first looks at its devices, '
        'as towers bench --xla sets it)')
