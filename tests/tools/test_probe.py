"""The precision probe: float32 against bf16 or fp16, timed on the device, once per process."""
import pytest
import tensorflow as tf

from towers.tools import probe


def test_the_probe_times_conv_and_matmul_in_both_precisions_and_keeps_the_ratios():
    speed = probe.measure('bf16', '/cpu:1')
    assert (speed.name, speed.device, speed.error) == ('bf16', '/cpu:0', None)
    seconds = speed.seconds
    assert sorted(seconds) == [('conv', 'bf16'), ('conv', 'fp32'), ('matmul', 'bf16'),
                               ('matmul', 'fp32')]
    assert all(0 < s < 5 for s in seconds.values()), seconds
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
    graph, _, _ = probe._probe_graph('bf16', '/gpu:1')
    ops = graph.get_operations()
    work = [op for op in ops if op.type in ('VarHandleOp', 'Conv2D', 'Conv2DBackpropInput',
                                            'Conv2DBackpropFilter', 'MatMul', 'Cast', 'Sum')]
    assert {op.device for op in work} == {'/device:GPU:1'}
    # The rest name no device (initializers, reads): they go where their variable is.
    assert {op.device for op in ops} == {'/device:GPU:1', ''}
    matmuls = [op for op in ops if op.type == 'MatMul']
    assert [op.inputs[0].shape.as_list() for op in matmuls] == [[2048, 2048]] * 2
    assert probe.probe_device('/gpu:1') == '/gpu:1'
    assert probe.probe_device('/device:CPU:3') == '/cpu:0'


def test_a_very_slow_precision_is_timed_by_its_warm_up_alone(monkeypatch):
    runs = []

    class Session:
        def run(self, fetch):
            runs.append(fetch)
            clock[0] += {'fp32': 0.004, 'slow': 0.5}[fetch]

    clock = [0.0]
    monkeypatch.setattr(probe.time, 'perf_counter', lambda: clock[0])
    assert probe._time_in_turns(Session(), ['fp32', 'slow']) == pytest.approx([0.004, 0.5])
    # float32 is timed after its warm-up until it has used its budget; the slow one never again.
    assert runs.count('slow') == 1
    assert runs.count('fp32') == 1 + 13  # 13 x 0.004 s: past the 0.05 s budget


def test_fast_ones_run_in_turns_until_both_used_their_budget(monkeypatch):
    runs = []
    seconds = {'fp32': 0.004, 'bf16': 0.002}

    class Session:
        def run(self, fetch):
            runs.append(fetch)
            clock[0] += seconds[fetch]

    clock = [0.0]
    monkeypatch.setattr(probe.time, 'perf_counter', lambda: clock[0])
    assert probe._time_in_turns(Session(), ['fp32', 'bf16']) == pytest.approx([0.004, 0.002])
    assert runs[2:6] == ['fp32', 'bf16', 'fp32', 'bf16']
    # bf16 needs 25 runs for its 0.05 s: the runs stop at MAX_RUNS.
    assert runs.count('bf16') == 1 + probe.MAX_RUNS


def test_only_the_mixed_precisions_are_probed():
    with pytest.raises(ValueError, match="the probe times bf16 or fp16 against fp32, not 'fp32'"):
        probe.measure('fp32')


@pytest.mark.parametrize('ratio,text', [(2.104, '2.10x'), (0.921, '0.92x'), (0.00312, '0.0031x'),
                                        (1.0, '1.00x')])
def test_ratios_read_as_people_write_them(ratio, text):
    assert probe.times(ratio) == text
