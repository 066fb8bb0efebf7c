"""Whether bf16 or fp16 is fast on the towers' devices: measured, with what the hardware has.

The verdict comes from the probe (towers/tools/probe.py), which times the
model's kind of work in float32 and in the precision right here: 'fast' at
1.2x float32 or better, 'slow' under 0.8x, 'no faster' between. What the
hardware has (the CPU's flags, the GPUs' compute capability) is said beside the
measurement, as information: a flag means an instruction exists, not that
TensorFlow's kernels use it (an Intel Xeon with avx512_fp16 ran float16 at
0.003x float32).
"""
import functools
import os
import platform

import tensorflow as tf

from towers import exactness
from towers.devices import gpu_split, physical_gpus, visible_gpus
from towers.errors import SettingError
from towers.tools import probe

FAST = 1.2  # at least this times float32's speed: 'fast'
NO_FASTER = 0.8  # under this: 'slow'
WARN_BELOW = 1 / 3  # train warns before a run more than ~3x slower than float32

# The CPU flags (Linux /proc/cpuinfo) of instructions for a type, best first.
_CPU_KERNELS = {
    'bf16': [('amx_bf16', 'AMX BF16 tiles'), ('avx512_bf16', 'AVX-512 BF16, no AMX')],
    'fp16': [('amx_fp16', 'AMX FP16 tiles'), ('avx512_fp16', 'AVX-512 FP16')],
}
_TYPE_NAMES = {'bf16': 'bfloat16', 'fp16': 'float16'}
# The compute capability from which NVIDIA GPUs have tensor cores for a type.
_GPU_KERNELS = {'bf16': ((8, 0), 'Ampere'), 'fp16': ((7, 0), 'Volta')}


def verdict(ratio):
    """'fast', 'no faster' or 'slow' for a speed against float32's."""
    return 'fast' if ratio >= FAST else 'slow' if ratio < NO_FASTER else 'no faster'


def precision_support(name, devices, cpu_flags=None, gpu_details=None, measure=None):
    """One line: how fast a precision measured on the devices, and what the hardware has.

    Args:
      name: 'fp32', 'bf16' or 'fp16'.
      devices: the tower devices, e.g. ['/cpu:0', '/cpu:1'] or ['/gpu:0'].
      cpu_flags: the CPU's feature flags, e.g. {'avx512f', 'amx_bf16'};
        None reads /proc/cpuinfo.
      gpu_details: {'/gpu:i': {'compute_capability': (major, minor),
        'device_name': ...}}, as tf.config.experimental.get_device_details
        gives them; None asks TensorFlow.
      measure: (name, device) -> probe.Speed; None is the probe itself.
    Returns:
      e.g. 'fp16 on CPU: slow, 0.14x float32 measured (conv 0.11x, matmul
      0.92x); TensorFlow's CPU kernels emulate float16 here (the CPU has no
      amx_fp16 or avx512_fp16)'.
    """
    if name == 'fp32':
        return 'fp32: float32 throughout'
    kinds = device_kinds(devices, gpu_details)
    speeds = _measured(name, kinds, measure or _probe(devices))
    if kinds[0][0] == 'CPU':
        speed, = speeds
        if speed.error:
            return '%s on CPU: %s' % (name, speed.text())
        flags = set(read_cpu_flags() if cpu_flags is None else cpu_flags)
        return '%s on CPU: %s; %s' % (name, _judged(speed),
                                      _cpu_why(name, verdict(speed.ratio), flags))
    need, family = _GPU_KERNELS[name]
    return '%s on %s; %s tensor cores from compute capability %d.%d (%s)' % (
        name, '; '.join('%s: %s' % (label, _judged(speed))
                        for (label, _), speed in zip(kinds, speeds)),
        name, need[0], need[1], family)


def slow_warning(name, devices, gpu_details=None, measure=None):
    """One line to print before a run in a precision measured > ~3x slower than fp32, or None.

    The advice names what measured faster here: fp32, and the other of bf16
    and fp16 where it is not slow too.
    """
    if name == 'fp32':
        return None
    kinds, measure = device_kinds(devices, gpu_details), measure or _probe(devices)
    if not any(s.error or s.ratio < WARN_BELOW for s in _measured(name, kinds, measure)):
        return None
    other = 'fp16' if name == 'bf16' else 'bf16'
    good = all(not s.error and s.ratio >= NO_FASTER for s in _measured(other, kinds, measure))
    return 'warning: %s; use %s on %s' % (
        precision_support(name, devices, gpu_details=gpu_details, measure=measure),
        '%s or fp32' % other if good else 'fp32',
        'this CPU' if kinds[0][0] == 'CPU' else 'these GPUs')


def device_kinds(devices, gpu_details=None):
    """[(label, devices)]: the towers' devices by kind, each kind timed once.

    Virtual CPUs are one CPU: [('CPU', devices)]. GPUs are grouped by model and
    compute capability: [('/gpu:0,/gpu:1 (Tesla V100-SXM2-16GB, compute
    capability 7.0)', ['/gpu:0', '/gpu:1'])].
    """
    gpus = _gpus(devices)
    if not gpus:
        return [('CPU', list(devices))]
    details = _details(gpus, gpu_details)
    groups = {}  # (device name, compute capability) -> the towers' GPUs of that kind
    for device in gpus:
        info = details.get(device) or {}
        capability = info.get('compute_capability')
        groups.setdefault((info.get('device_name', 'GPU'),
                           tuple(capability) if capability else None), []).append(device)
    return [('%s (%s, compute capability %s)' % (
        ','.join(group), device_name, '%d.%d' % capability if capability else 'unknown'), group)
        for (device_name, capability), group in groups.items()]


def _measured(name, kinds, measure):
    """The Speed measure(name, device) gives the first device of each kind."""
    return [measure(name, group[0]) for _, group in kinds]


def _probe(devices):
    """probe.measure under the towers' split of their GPUs into logical GPUs."""
    gpus = _gpus(devices)
    per_gpu = gpu_split(gpus, visible_gpus()) if gpus else 1
    return functools.partial(probe.measure, per_gpu=per_gpu) if per_gpu > 1 else probe.measure


def _judged(speed):
    """'slow, 0.14x float32 measured (conv 0.11x, matmul 0.92x)'."""
    return speed.text() if speed.error else '%s, %s' % (verdict(speed.ratio), speed.text())


def _cpu_why(name, judged, flags):
    """What the CPU has for the type, worded against the verdict."""
    if not flags:
        return 'its flags are unknown (no /proc/cpuinfo to read)'
    kernels = _CPU_KERNELS[name]
    has = next(('%s (%s)' % (flag, what) for flag, what in kernels if flag in flags), None)
    missing = 'no %s' % ' or '.join(flag for flag, _ in kernels)
    if judged != 'slow':
        return 'the CPU has %s' % (has or missing)
    emulated = "TensorFlow's CPU kernels emulate %s here" % _TYPE_NAMES[name]
    return ('%s, although the CPU has %s' % (emulated, has) if has else
            '%s (the CPU has %s)' % (emulated, missing))


def machine(devices=()):
    """What a timing ran on: 'AMD EPYC, 2 cores', and the towers' GPUs where they are GPUs,
    and whether they computed float32 in TF32: 'AMD EPYC, 2 cores; /gpu:0,/gpu:1 (NVIDIA
    A100-SXM4-40GB, compute capability 8.0); TF32 on, op determinism off'."""
    name = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as info:
            name = next((line.split(':', 1)[1].strip() for line in info
                         if line.startswith('model name')), name)
    except OSError:
        pass
    cpu = '%s, %d cores' % (name, os.cpu_count() or 1)
    kinds = device_kinds(devices) if devices else [('CPU', [])]
    if kinds[0][0] == 'CPU':
        return cpu
    return '%s; %s; %s' % (cpu, '; '.join(k for k, _ in kinds), exactness.describe())


def build_line():
    """'TensorFlow 2.21.0, CPU-only build' or 'TensorFlow 2.21.0, CUDA 12.5, cuDNN 9'."""
    info = tf.sysconfig.get_build_info()
    if not info.get('is_cuda_build'):
        return 'TensorFlow %s, CPU-only build' % tf.__version__
    return 'TensorFlow %s, CUDA %s, cuDNN %s' % (tf.__version__, info.get('cuda_version', '?'),
                                                 info.get('cudnn_version', '?'))


def gpu_lines(gpu_details=None):
    """One line per visible GPU: its model and compute capability."""
    gpus = ['/gpu:%d' % i for i in range(len(tf.config.list_physical_devices('GPU')))]
    details = _details(gpus, gpu_details)
    return ['%s: %s, compute capability %s' % (
        device, info.get('device_name', 'GPU'),
        '%d.%d' % tuple(info['compute_capability']) if info.get('compute_capability')
        else 'unknown') for device, info in ((d, details.get(d) or {}) for d in gpus)]


def check_compute_capability(name, devices, gpu_details=None):
    """SettingError where GPU towers cannot run bf16 at all: cuDNN's bfloat16 kernels need
    compute capability 8.0 (Ampere). (fp16 runs from Pascal on, without tensor cores before
    Volta: the probe says how fast.)"""
    gpus = _gpus(devices)
    if name != 'bf16' or not gpus:
        return
    details = _details(gpus, gpu_details)
    need = _GPU_KERNELS['bf16'][0]
    old = [(d, details[d]) for d in gpus if details.get(d, {}).get('compute_capability')
           and tuple(details[d]['compute_capability']) < need]
    if old:
        device, info = old[0]
        raise SettingError('{precision} bf16 needs GPUs of compute capability 8.0 (Ampere) or '
                           'newer; %s is a %s, %d.%d: use {precision} fp16 or fp32 there',
                           device, info.get('device_name', 'GPU'),
                           *tuple(info['compute_capability']))


def _gpus(devices):
    """The GPUs among the tower devices ('/gpu:1', '/device:GPU:1')."""
    return [d for d in devices if d.lower().startswith(('/gpu', '/device:gpu'))]


def _details(gpus, given=None):
    """The GPUs' details as given (tests, callers that know them), else TensorFlow's."""
    return _gpu_details(gpus) if given is None else given


def _gpu_details(gpus):
    """{'/gpu:i': TensorFlow's details of the physical GPU it is on}, for the GPUs named (a
    logical GPU is on GPU i // its split, towers/devices.py)."""
    physical = tf.config.list_physical_devices('GPU')
    details = {}
    for device, index in zip(gpus, physical_gpus(gpus, len(physical))):
        if index < len(physical):
            details[device] = tf.config.experimental.get_device_details(physical[index])
    return details


def read_cpu_flags():
    """The CPU's feature flags from /proc/cpuinfo (an empty set where there is none)."""
    try:
        with open('/proc/cpuinfo') as info:
            for line in info:
                if line.startswith('flags'):
                    return set(line.split(':', 1)[1].split())
    except OSError:
        pass
    return set()
