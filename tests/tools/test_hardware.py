"""What towers says of a precision's speed: the probe's measurement, then what the hardware has."""
import pytest
import tensorflow as tf

from towers import exactness
from towers.cli import main
from towers.errors import SettingError
from towers.tools import hardware, probe
from towers.tools.hardware import check_compute_capability, precision_support, slow_warning


def _measured(**ratios):
    """A probe that measured each precision at ratios[name] x float32, and records its calls."""
    def measure(name, device):
        measure.calls.append((name, device))
        ratio = ratios[name]
        if isinstance(ratio, str):
            return probe.Speed(name, device, error=ratio)
        return probe.Speed(name, device, conv=ratio * 0.9, matmul=ratio * 1.5, ratio=ratio)
    measure.calls = []
    return measure


AMX = {'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile', 'avx512_fp16'}
ZEN4 = {'avx512f', 'avx512_bf16'}


@pytest.mark.parametrize('name,ratio,flags,line', [
    # The Intel Xeon of issue 19: avx512_fp16, and float16 300x slower than float32.
    ('fp16', 0.003, AMX, "fp16 on CPU: slow, 0.003x float32 measured (conv 0.0027x, matmul "
     "0.0045x); TensorFlow's CPU kernels emulate float16 here, although the CPU has "
     "avx512_fp16 (AVX-512 FP16)"),
    ('fp16', 0.14, ZEN4, "fp16 on CPU: slow, 0.14x float32 measured (conv 0.13x, matmul "
     "0.21x); TensorFlow's CPU kernels emulate float16 here (the CPU has no amx_fp16 or "
     "avx512_fp16)"),
    ('bf16', 2.5, AMX, 'bf16 on CPU: fast, 2.50x float32 measured (conv 2.25x, matmul 3.75x); '
     'the CPU has amx_bf16 (AMX BF16 tiles)'),
    ('bf16', 1.0, ZEN4, 'bf16 on CPU: no faster, 1.00x float32 measured (conv 0.90x, matmul '
     '1.50x); the CPU has avx512_bf16 (AVX-512 BF16, no AMX)'),
    ('bf16', 1.3, {'avx2'}, 'bf16 on CPU: fast, 1.30x float32 measured (conv 1.17x, matmul '
     '1.95x); the CPU has no amx_bf16 or avx512_bf16'),
    ('bf16', 0.5, {'avx2'}, "bf16 on CPU: slow, 0.50x float32 measured (conv 0.45x, matmul "
     "0.75x); TensorFlow's CPU kernels emulate bfloat16 here (the CPU has no amx_bf16 or "
     "avx512_bf16)"),
    ('bf16', 1.3, set(), 'bf16 on CPU: fast, 1.30x float32 measured (conv 1.17x, matmul 1.95x); '
     'its flags are unknown (no /proc/cpuinfo to read)'),
    ('bf16', 'No OpKernel was registered', ZEN4,
     'bf16 on CPU: could not run on /cpu:0: No OpKernel was registered'),
])
def test_the_cpu_verdict_is_the_measured_one_and_the_flags_are_said_beside_it(
        name, ratio, flags, line):
    measure = _measured(**{name: ratio})
    assert precision_support(name, ['/cpu:0', '/cpu:1'], cpu_flags=flags,
                             measure=measure) == line
    assert measure.calls == [(name, '/cpu:0')]  # virtual CPUs are one CPU: timed once


def test_fp32_is_fp32_and_needs_no_probe():
    measure = _measured()
    assert precision_support('fp32', ['/cpu:0'], measure=measure) == 'fp32: float32 throughout'
    assert slow_warning('fp32', ['/cpu:0'], measure=measure) is None
    assert measure.calls == []


@pytest.mark.parametrize('ratio,verdict', [(1.2, 'fast'), (1.19, 'no faster'),
                                           (0.8, 'no faster'), (0.79, 'slow')])
def test_the_verdicts_bounds(ratio, verdict):
    assert hardware.verdict(ratio) == verdict


def _gpus(capability, name='Tesla V100-SXM2-16GB', count=1):
    return {'/gpu:%d' % i: {'compute_capability': capability, 'device_name': name}
            for i in range(count)}


@pytest.mark.parametrize('name,ratio,details,line', [
    ('bf16', 0.6, _gpus((7, 0), count=2),
     'bf16 on /gpu:0,/gpu:1 (Tesla V100-SXM2-16GB, compute capability 7.0): slow, 0.60x '
     'float32 measured (conv 0.54x, matmul 0.90x); bf16 tensor cores from compute capability '
     '8.0 (Ampere)'),
    ('fp16', 3.0, _gpus((7, 0), count=2),
     'fp16 on /gpu:0,/gpu:1 (Tesla V100-SXM2-16GB, compute capability 7.0): fast, 3.00x '
     'float32 measured (conv 2.70x, matmul 4.50x); fp16 tensor cores from compute capability '
     '7.0 (Volta)'),
    ('bf16', 1.0, {}, 'bf16 on /gpu:0,/gpu:1 (GPU, compute capability unknown): no faster, '
     '1.00x float32 measured (conv 0.90x, matmul 1.50x); bf16 tensor cores from compute '
     'capability 8.0 (Ampere)'),
])
def test_gpus_are_measured_and_their_compute_capability_said_beside(name, ratio, details, line):
    measure = _measured(**{name: ratio})
    # The CPU's flags do not matter where the towers are GPUs.
    assert precision_support(name, ['/gpu:0', '/gpu:1'], cpu_flags={'amx_bf16'},
                             gpu_details=details, measure=measure) == line
    assert measure.calls == [(name, '/gpu:0')]  # GPUs of one kind: the first is timed


def test_gpus_of_two_kinds_are_each_measured_and_named_apart():
    details = dict(_gpus((8, 6), 'NVIDIA RTX A6000'),
                   **{'/gpu:1': {'compute_capability': (7, 5), 'device_name': 'Tesla T4'}})
    speeds = {'/gpu:0': 2.0, '/gpu:1': 0.5}

    def measure(name, device):
        ratio = speeds[device]
        return probe.Speed(name, device, conv=ratio, matmul=ratio, ratio=ratio)
    assert precision_support('bf16', ['/gpu:0', '/gpu:1'], gpu_details=details,
                             measure=measure) == (
        'bf16 on /gpu:0 (NVIDIA RTX A6000, compute capability 8.6): fast, 2.00x float32 '
        'measured (conv 2.00x, matmul 2.00x); /gpu:1 (Tesla T4, compute capability 7.5): slow, '
        '0.50x float32 measured (conv 0.50x, matmul 0.50x); bf16 tensor cores from compute '
        'capability 8.0 (Ampere)')


@pytest.mark.parametrize('name,ratios,advice', [
    ('fp16', {'fp16': 0.003, 'bf16': 2.0}, 'use bf16 or fp32 on this CPU'),
    ('fp16', {'fp16': 0.14, 'bf16': 0.7}, 'use fp32 on this CPU'),  # bf16 measured slow too
    ('bf16', {'bf16': 0.2, 'fp16': 1.0}, 'use fp16 or fp32 on this CPU'),
    ('fp16', {'fp16': 'No OpKernel was registered', 'bf16': 'none either'},
     'use fp32 on this CPU'),
])
def test_a_run_more_than_3x_slower_than_fp32_is_warned_of_in_one_line(name, ratios, advice):
    measure = _measured(**ratios)
    line = slow_warning(name, ['/cpu:0', '/cpu:1'], measure=measure)
    assert line == 'warning: %s; %s' % (
        precision_support(name, ['/cpu:0'], measure=measure), advice)
    assert '\n' not in line


@pytest.mark.parametrize('ratio', [1 / 3, 0.5, 2.0])
def test_no_warning_down_to_a_third_of_fp32(ratio):
    measure = _measured(fp16=ratio, bf16=1.0)
    assert slow_warning('fp16', ['/cpu:0'], measure=measure) is None
    assert measure.calls == [('fp16', '/cpu:0')]  # the advice's probe runs only to advise


def test_slow_gpus_are_advised_as_gpus():
    measure = _measured(bf16=0.1, fp16=4.0)
    line = slow_warning('bf16', ['/gpu:0'], gpu_details=_gpus((7, 0)), measure=measure)
    assert line.endswith('; use fp16 or fp32 on these GPUs')


def test_train_warns_before_its_first_step_where_the_precision_is_slow(monkeypatch, capsys):
    monkeypatch.setattr(probe, 'measure', _measured(fp16=0.003, bf16=2.0))
    assert main(['train', '--precision', 'fp16', '--steps', '2', '--model', 'small_convnet',
                 '--quiet', '--eval-every', '0', '--log-every', '1', '--devices', 'cpu']) == 0
    out = capsys.readouterr().out.splitlines()
    warnings = [i for i, line in enumerate(out) if line.startswith('warning: ')]
    assert len(warnings) == 1, out
    assert out[warnings[0]].startswith('warning: fp16 on CPU: slow, 0.003x float32 measured')
    assert out[warnings[0]].endswith('; use bf16 or fp32 on this CPU')
    first_step = next(i for i, line in enumerate(out) if line.startswith('step 1'))
    assert warnings[0] < first_step


def test_train_says_nothing_where_the_precision_is_not_slow(monkeypatch, capsys):
    monkeypatch.setattr(probe, 'measure', _measured(bf16=0.9))
    assert main(['train', '--precision', 'bf16', '--steps', '1', '--model', 'small_convnet',
                 '--quiet', '--eval-every', '0', '--devices', 'cpu']) == 0
    assert 'warning' not in capsys.readouterr().out


def test_devices_says_what_each_precision_measured(monkeypatch, capsys):
    measure = _measured(bf16=1.3, fp16=0.003)
    monkeypatch.setattr(probe, 'measure', measure)
    assert main(['devices', '--towers', '2', '--devices', 'cpu']) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [precision_support('bf16', ['/cpu:0', '/cpu:1'], measure=measure),
                        precision_support('fp16', ['/cpu:0', '/cpu:1'], measure=measure)]
    assert out[-2].startswith('bf16 on CPU: fast, 1.30x float32 measured')


def test_bf16_on_gpus_before_ampere_is_refused_in_one_line():
    v100 = _gpus((7, 0), count=2)
    with pytest.raises(SettingError, match=r'^precision bf16 needs GPUs of compute capability '
                                           r'8\.0 \(Ampere\) or newer; /gpu:0 is a Tesla '
                                           r'V100-SXM2-16GB, 7\.0: use precision fp16 or fp32 '
                                           r'there$'):
        check_compute_capability('bf16', ['/gpu:0', '/gpu:1'], gpu_details=v100)
    # fp16 runs there (the probe says how fast); Ampere runs bf16; CPUs are the probe's.
    check_compute_capability('fp16', ['/gpu:0', '/gpu:1'], gpu_details=v100)
    check_compute_capability('bf16', ['/gpu:0'], gpu_details=_gpus((8, 0), 'NVIDIA A100'))
    check_compute_capability('bf16', ['/cpu:0', '/cpu:1'])


def test_what_a_timing_ran_on_names_the_gpus_where_the_towers_are_gpus(monkeypatch):
    cpu = hardware.machine()
    assert cpu.endswith(' cores') and hardware.machine(['/cpu:0', '/cpu:1']) == cpu
    monkeypatch.setattr(hardware, '_gpu_details', lambda gpus: _gpus((8, 0), 'NVIDIA A100',
                                                                     count=2))
    assert hardware.machine(['/gpu:0', '/gpu:1']) == (
        cpu + '; /gpu:0,/gpu:1 (NVIDIA A100, compute capability 8.0); '
        + exactness.describe())
    assert exactness.describe().startswith('TF32 ')


def test_the_build_and_each_gpu_are_named(monkeypatch):
    monkeypatch.setattr(tf.sysconfig, 'get_build_info', lambda: {
        'is_cuda_build': True, 'cuda_version': '12.5.1', 'cudnn_version': '9'})
    assert hardware.build_line() == 'TensorFlow %s, CUDA 12.5.1, cuDNN 9' % tf.__version__
    monkeypatch.setattr(tf.config, 'list_physical_devices', lambda kind: ['g0', 'g1'])
    details = {'/gpu:0': {'compute_capability': (8, 0), 'device_name': 'NVIDIA A100'},
               '/gpu:1': {'device_name': 'NVIDIA A100'}}
    assert hardware.gpu_lines(details) == ['/gpu:0: NVIDIA A100, compute capability 8.0',
                                           '/gpu:1: NVIDIA A100, compute capability unknown']


def test_logical_gpus_are_probed_and_named_as_the_gpu_they_are_on(monkeypatch):
    # Two towers on one GPU: /gpu:1 is GPU 0's second logical GPU, and the probe's Session
    # must make the same two logical GPUs the run's will (TensorFlow fixes them at the first).
    monkeypatch.setattr(tf.config, 'list_physical_devices', lambda kind: ['the H100'])
    monkeypatch.setattr(tf.config.experimental, 'get_device_details', lambda gpu: {
        'device_name': 'NVIDIA H100 80GB HBM3', 'compute_capability': (9, 0)})
    monkeypatch.setattr(hardware, 'visible_gpus', lambda: 1)
    asked = []

    def measure(name, device, per_gpu=1):
        asked.append((name, device, per_gpu))
        return probe.Speed(name, device, 1.3, 1.3, 1.3, {})
    monkeypatch.setattr(probe, 'measure', measure)
    line = precision_support('bf16', ['/gpu:0', '/gpu:1'])
    assert line.startswith('bf16 on /gpu:0,/gpu:1 (NVIDIA H100 80GB HBM3, compute capability '
                           '9.0): fast')
    assert asked == [('bf16', '/gpu:0', 2)]
