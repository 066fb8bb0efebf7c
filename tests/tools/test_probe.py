"""The precision probe: float32 against bf16 or fp16, timed on the device, once per process."""
import numpy as np
import pytest
import tensorflow as tf

from tests.harness import ancestors
from towers.tools import probe


def test_the_probe_times_conv_and_matmul_in_both_precisions_and_keeps_the_ratios():
    speed = probe.measure('bf16', '/cpu:1')
    assert (speed.name, speed.device, speed.error) == ('bf16', '/cpu:0', None)
    seconds = speed.seconds
    assert sorted(seconds) == [('conv', 'bf16'), ('conv', 'fp32'), ('matmul', 'bf16'),
                               ('matmul', 'fp32')]
    assert all(s > 0 for s in seconds.values()), seconds  # how long: no test's business
    assert speed.conv == seconds['conv', 'fp32'] / seconds['conv', 'bf16']
    assert speed.matmul == seconds['matmul', 'fp32'] / seconds['matmul', 'bf16']
    assert speed.ratio == pytest.approx(
        (seconds['conv', 'fp32'] + seconds['matmul', 'fp32'])
        / (seconds['conv', 'bf16'] + seconds['matmul', 'bf16']))
    # Once per process: every virtual CPU is the one CPU, and asking again times nothing.
    assert probe.measure('bf16', '/cpu:0') is speed
    assert probe.measure('bf16') is speed


def test_the_probe_reads_every_result_so_nothing_is_pruned():
    graph, _, fetches = probe._probe_graph('fp16', '/cpu:0')
    kinds = {op.type for op in graph.get_operations()}
    assert {'Conv2D', 'Conv2DBackpropInput', 'Conv2DBackpropFilter', 'MatMul'} <= kinds
    for fp32, half in fetches.values():
        assert (fp32.dtype, half.dtype) == (tf.float32, tf.float32)
    convs = [op for op in graph.get_operations() if op.type == 'Conv2D']
    assert [op.inputs[0].dtype for op in convs] == [tf.float32, tf.float16]
    assert convs[0].inputs[0].shape.as_list() == [8, 14, 14, 32]


def test_on_a_gpu_the_probe_is_built_there_at_a_size_a_gpu_notices():
    # Built only: this machine has no GPU to run it on.
    graph, _, fetches = probe._probe_graph('bf16', '/gpu:1')
    ops = graph.get_operations()
    work = [op for op in ops if op.type in ('VarHandleOp', 'Conv2D', 'Conv2DBackpropInput',
                                            'Conv2DBackpropFilter', 'MatMul', 'Cast', 'Sum')]
    assert {op.device for op in work} == {'/device:GPU:1'}
    # The rest name no device (initializers, reads): they go where their variable is.
    assert {op.device for op in ops} == {'/device:GPU:1', ''}
    assert probe.probe_device('/gpu:1') == '/gpu:1'
    assert probe.probe_device('/device:CPU:3') == '/cpu:0'
    # ~2 TFLOP of each kind per run: 4-16 ms on an H100, where a Session.run costs 0.1-0.2 ms.
    (conv, _), (matmul, _) = (_kind_ops(fetch, kind) for kind, fetch in (
        ('Conv2D', fetches['conv'][1]), ('MatMul', fetches['matmul'][1])))
    assert len(conv) == len(matmul) == 16
    assert {tuple(op.inputs[0].shape.as_list()) for op in conv} == {(512, 28, 28, 32)}
    assert {tuple(op.inputs[1].shape.as_list()) for op in conv} == {(5, 5, 32, 64)}
    assert {tuple(t.shape.as_list()) for op in matmul for t in op.inputs} == {(4096, 4096)}
    # Forward and both gradients: 3 x 2 x N*H*W x h*w*in x out each; a matmul 2 x m*k*n.
    conv_flops = sum(3 * 2 * np.prod(op.inputs[0].shape[:3]) * np.prod(op.inputs[1].shape)
                     for op in conv)
    matmul_flops = sum(2 * np.prod(op.inputs[0].shape) * op.inputs[1].shape[1] for op in matmul)
    assert 1.9e12 < conv_flops < 2.5e12 and 1.9e12 < matmul_flops < 2.5e12


def test_on_a_gpu_each_repeat_waits_for_the_last_one_and_none_is_another_twice():
    # One repeat's maps in memory at a time: repeat r starts after repeat r - 1's sum (the
    # matmuls are a chain); and no two convs are the same computation, which grappler would
    # run once.
    graph, _, fetches = probe._probe_graph('fp16', '/gpu:0')
    for kind, fetch in (('Conv2D', fetches['conv'][1]), ('MatMul', fetches['matmul'][1])):
        ops, before = _kind_ops(fetch, kind)
        assert sorted(before) == list(range(16)), before  # each after all the earlier ones
    convs, _ = _kind_ops(fetches['conv'][1], 'Conv2D')
    assert len({op.inputs[1].op.name for op in convs}) == 16  # 16 filters
    # Results summed in their own type: no float32 pass over a half-precision map.
    assert _sum_types(graph) == {tf.float32, tf.float16}
    # The CPU's work is as it was: one conv, one matmul, summed in float32.
    graph, _, fetches = probe._probe_graph('fp16', '/cpu:0')
    assert [len(_kind_ops(f, k)[0]) for f, k in ((fetches['conv'][1], 'Conv2D'),
                                                (fetches['matmul'][1], 'MatMul'))] == [1, 1]
    assert _sum_types(graph) == {tf.float32}


def _sum_types(graph):
    return {op.inputs[0].dtype for op in graph.get_operations() if op.type == 'Sum'}


def _kind_ops(fetch, kind):
    """(the ops of type `kind` a fetch waits for, how many of those each one waits for)."""
    ops = [op for op in ancestors(fetch.op) if op.type == kind]
    return ops, [sum(other.type == kind for other in ancestors(op)) - 1 for op in ops]


class _Clock:
    """A fake perf_counter and fake runs: each run adds its seconds to the clock.

    `seconds[name]` is a list of one run's seconds, call after call; its last
    entry repeats. `calls` records the names run, in order.
    """

    def __init__(self, monkeypatch, **seconds):
        self.now, self.seconds, self.calls = 0.0, seconds, []
        monkeypatch.setattr(probe.time, 'perf_counter', lambda: self.now)

    def run(self, name):
        def run():
            times = self.seconds[name]
            self.now += times[min(self.calls.count(name), len(times) - 1)]
            self.calls.append(name)
        return run


def test_a_slow_first_run_is_set_up_not_speed_and_the_warm_runs_are_timed(monkeypatch):
    # As bf16 on an H100: cuDNN autotunes and every kernel JIT-compiles in the first run.
    clock = _Clock(monkeypatch, fp32=[0.9, 0.004], bf16=[2.5, 0.003])
    assert probe._time_in_turns([clock.run('fp32'), clock.run('bf16')]) == pytest.approx(
        [0.004, 0.003])


def test_each_runs_its_warm_ups_untimed_before_any_is_timed(monkeypatch):
    # Slow in all its warm-ups, fast after: only the runs after them count.
    slow = [1.0] * probe.WARM_UPS + [0.002]
    clock = _Clock(monkeypatch, fp32=slow, bf16=slow)
    assert probe._time_in_turns([clock.run('fp32'), clock.run('bf16')]) == pytest.approx(
        [0.002, 0.002])
    assert probe.WARM_UPS >= 2
    assert clock.calls[:2 * probe.WARM_UPS] == ['fp32'] * probe.WARM_UPS + ['bf16'] * probe.WARM_UPS


def test_a_very_slow_precision_is_timed_once_it_is_warm(monkeypatch):
    clock = _Clock(monkeypatch, fp32=[0.004], slow=[0.5])
    assert probe._time_in_turns([clock.run('fp32'), clock.run('slow')]) == pytest.approx(
        [0.004, 0.5])
    # float32 is timed after its warm-ups until it has used its budget; the slow one is
    # timed once, warm, and never again.
    assert clock.calls.count('slow') == probe.WARM_UPS + 1
    assert clock.calls.count('fp32') == probe.WARM_UPS + 13  # 13 x 0.004 s: past 0.05 s


def test_fast_ones_run_in_turns_until_both_used_their_budget(monkeypatch):
    clock = _Clock(monkeypatch, fp32=[0.004], bf16=[0.002])
    assert probe._time_in_turns([clock.run('fp32'), clock.run('bf16')]) == pytest.approx(
        [0.004, 0.002])
    warm = 2 * probe.WARM_UPS
    assert clock.calls[warm:warm + 4] == ['fp32', 'bf16', 'fp32', 'bf16']
    # bf16 needs 25 runs for its 0.05 s: the runs stop at MAX_RUNS.
    assert clock.calls.count('bf16') == probe.WARM_UPS + probe.MAX_RUNS


def test_the_best_warm_run_is_the_time_not_one_slowed_down(monkeypatch):
    # Another process on the cores slows one run: it only adds time, so the best is taken.
    clock = _Clock(monkeypatch, fp32=[0.01, 0.01, 0.004, 0.04, 0.004], bf16=[0.01, 0.01, 0.002])
    assert probe._time_in_turns([clock.run('fp32'), clock.run('bf16')]) == pytest.approx(
        [0.004, 0.002])


def test_the_probe_times_its_warm_ups_and_runs_on_one_session_and_fetch(monkeypatch):
    # The very same Session and fetch warm up and are timed: no kernel or algorithm the
    # timed runs use is chosen in them.
    seen = []
    real = probe._time_in_turns

    def time_in_turns(runs):
        seen.append([(run.func.__self__, run.args) for run in runs])
        return real(runs)

    monkeypatch.setattr(probe, 'WARM_UPS', 3)
    monkeypatch.setattr(probe, 'MAX_RUNS', 1)
    monkeypatch.setattr(probe, '_time_in_turns', time_in_turns)
    speed = probe._measure.__wrapped__('fp16', '/cpu:0')
    assert speed.error is None and len(seen) == 2  # conv's pair, matmul's pair
    sessions = {session for pair in seen for session, _ in pair}
    assert len(sessions) == 1
    fetches = [args for pair in seen for _, args in pair]
    assert all(len(args) == 1 for args in fetches) and len(set(fetches)) == 4


def test_each_fetch_is_a_scalar_that_waits_for_all_of_its_work():
    # A Session.run returns only when what it fetches is on the host: a GPU's queued
    # kernels cannot make a run look fast where the fetch depends on all of them.
    graph, _, fetches = probe._probe_graph('bf16', '/cpu:0')
    for kind, work in (('conv', {'Conv2D', 'Conv2DBackpropInput', 'Conv2DBackpropFilter'}),
                       ('matmul', {'MatMul'})):
        for fetch, dtype in zip(fetches[kind], (tf.float32, tf.bfloat16)):
            assert fetch.shape.as_list() == [] and fetch.dtype == tf.float32
            ops = ancestors(fetch.op)
            assert {op.type for op in ops if op.type in work} == work
            assert {op.get_attr('T') for op in ops if op.type in work} == {dtype}


@pytest.mark.gpu
@pytest.mark.skipif(not tf.config.list_physical_devices('GPU'), reason='needs a GPU')
def test_on_an_ampere_or_newer_gpu_the_probe_times_bf16_warm_and_says_its_ratio():
    # An H100 once measured bf16 at 0.00072x float32 from a first run's JIT compile and
    # autotuning. How fast it is warm is read, not asserted (another process on the GPU moves
    # it): .ci/gpu-checks.sh's lease stage prints it in its devices step.
    details = tf.config.experimental.get_device_details(
        tf.config.list_physical_devices('GPU')[0])
    if tuple(details.get('compute_capability') or (0, 0)) < (8, 0):
        pytest.skip('bf16 tensor cores need compute capability 8.0')
    speed = probe.measure('bf16', '/gpu:0')
    assert speed.error is None, speed.error
    assert sorted(speed.seconds) == [('conv', 'bf16'), ('conv', 'fp32'), ('matmul', 'bf16'),
                                     ('matmul', 'fp32')]
    assert all(s > 0 for s in speed.seconds.values()) and speed.ratio > 0
    assert speed.text().endswith('float32 measured (conv %s, matmul %s)' % (
        probe.times(speed.conv), probe.times(speed.matmul)))


def test_only_the_mixed_precisions_are_probed():
    with pytest.raises(ValueError, match="the probe times bf16 or fp16 against fp32, not 'fp32'"):
        probe.measure('fp32')


@pytest.mark.parametrize('ratio,text', [(2.104, '2.10x'), (0.921, '0.92x'), (0.00312, '0.0031x'),
                                        (1.0, '1.00x')])
def test_ratios_read_as_people_write_them(ratio, text):
    assert probe.times(ratio) == text
