"""towers bench: timed images/sec per tower count, mean and standard error."""
import math

import numpy as np
import pytest

import models
from towers.bench import mean_stderr, measure, run_bench
from towers.devices import resolve_devices
from towers.errors import TowersError

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


def test_measure_times_a_real_window():
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    mean, stderr = measure(model_fn, SHAPE, 10, ['/cpu:0', '/cpu:1'], batch_size=8,
                           warmup_steps=2, timed_steps=3)
    assert math.isfinite(mean) and mean > 0
    assert math.isfinite(stderr) and stderr >= 0


def test_run_bench_rows_and_table():
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    lines = []
    rows = run_bench(model_fn, SHAPE, 10, [1, 2], batch_size=8, warmup_steps=2, timed_steps=3,
                     log=lines.append)
    assert [row['towers'] for row in rows] == [1, 2]
    # On this CPU-only machine: '/cpu:0' and '/cpu:0,/cpu:1'.
    assert [row['devices'] for row in rows] == [','.join(resolve_devices(num_towers=n))
                                                 for n in (1, 2)]
    for row in rows:
        assert math.isfinite(row['mean']) and row['mean'] > 0
        assert math.isfinite(row['stderr']) and row['stderr'] >= 0
        assert row['ratio'] == row['mean'] / rows[0]['mean']
    assert rows[0]['ratio'] == 1.0
    # A header, then one line per tower count, in order.
    assert len(lines) == 3
    assert lines[0].split()[:3] == ['towers', 'devices', 'images/sec']
    assert lines[0].endswith('ratio to 1 tower(s)')
    for line, row in zip(lines[1:], rows):
        fields = line.split()
        assert fields[0] == str(row['towers']) and fields[1] == row['devices']
        assert fields[2:5] == ['%.1f' % row['mean'], '±', '%.1f' % row['stderr']]
        assert fields[5] == '%.3f' % row['ratio']


@pytest.mark.parametrize('batch_size,window,warmup', [(0, 5, 1), (8, 1, 1), (8, 5, -1)])
def test_run_bench_refuses_numbers_it_cannot_measure(batch_size, window, warmup):
    model_fn = models.build_model('small_convnet', SHAPE, 10)
    with pytest.raises(TowersError, match='bench needs --batch-size >= 1, --window >= 2'):
        run_bench(model_fn, SHAPE, 10, [1], batch_size=batch_size, warmup_steps=warmup,
                  timed_steps=window, log=lambda line: None)
