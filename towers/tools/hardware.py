"""Whether a machine's CPU or GPUs have fast kernels for a precision: what `towers bench` says.

A bf16 or fp16 row on hardware without native kernels for the type still runs
(TensorFlow converts through float32, or falls back to Eigen), and slowly; the
bench says so from the CPU's flags or the GPUs' compute capability instead of
letting the table pretend.
"""
import tensorflow as tf

# The CPU flags (Linux /proc/cpuinfo) under which oneDNN has native kernels for a
# type, best first; without them TensorFlow still runs the type, but slowly.
_CPU_KERNELS = {
    'bf16': [('amx_bf16', 'AMX BF16 tiles'), ('avx512_bf16', 'AVX-512 BF16, no AMX')],
    'fp16': [('amx_fp16', 'AMX FP16 tiles'), ('avx512_fp16', 'AVX-512 FP16')],
}
_CPU_SLOW = {
    'bf16': 'bf16 runs converted through float32; expect no speed-up',
    'fp16': "TensorFlow's oneDNN leaves float16 to Eigen here (it logs \"oneDNN supports "
            'DT_HALF only on platforms with AVX-512"); expect it slower than fp32',
}
# The compute capability from which NVIDIA GPUs have tensor cores for a type.
_GPU_KERNELS = {'bf16': ((8, 0), 'Ampere'), 'fp16': ((7, 0), 'Volta')}


def precision_support(name, devices, cpu_flags=None, gpu_details=None):
    """One line: whether the devices have fast kernels for a precision, and why.

    Args:
      name: 'fp32', 'bf16' or 'fp16'.
      devices: the tower devices, e.g. ['/cpu:0', '/cpu:1'] or ['/gpu:0'].
      cpu_flags: the CPU's feature flags, e.g. {'avx512f', 'amx_bf16'};
        None reads /proc/cpuinfo.
      gpu_details: {'/gpu:i': {'compute_capability': (major, minor),
        'device_name': ...}}, as tf.config.experimental.get_device_details
        gives them; None asks TensorFlow.
    Returns:
      e.g. 'bf16 on CPU: fast (AVX-512 BF16, no AMX: avx512_bf16)'.
    """
    if name == 'fp32':
        return 'fp32: float32 throughout'
    gpus = [d for d in devices if d.lower().startswith(('/gpu', '/device:gpu'))]
    if gpus:
        return _gpu_support(name, gpus, _gpu_details(gpus) if gpu_details is None
                            else gpu_details)
    flags = set(read_cpu_flags() if cpu_flags is None else cpu_flags)
    if not flags:
        return '%s on CPU: unknown (no CPU flags to read in /proc/cpuinfo)' % name
    for flag, what in _CPU_KERNELS[name]:
        if flag in flags:
            return '%s on CPU: fast (%s: %s)' % (name, what, flag)
    return '%s on CPU: not fast (no %s): %s' % (
        name, ' or '.join(flag for flag, _ in _CPU_KERNELS[name]), _CPU_SLOW[name])


def _gpu_support(name, gpus, details):
    need, family = _GPU_KERNELS[name]
    groups = {}  # (device name, compute capability) -> the towers' GPUs of that kind
    for device in gpus:
        info = details.get(device) or {}
        capability = info.get('compute_capability')
        groups.setdefault((info.get('device_name', 'GPU'),
                           tuple(capability) if capability else None), []).append(device)
    known = [c for _, c in groups if c is not None]
    verdict = ('not fast' if any(c < need for c in known) else
               'unknown' if len(known) < len(groups) else 'fast')
    where = '; '.join('%s (%s, compute capability %s)' % (
        ','.join(devices), device_name, '%d.%d' % capability if capability else 'unknown')
        for (device_name, capability), devices in groups.items())
    return '%s on %s: %s (%s tensor cores from compute capability %d.%d, %s)%s' % (
        name, where, verdict, name, need[0], need[1], family,
        '; expect no speed-up' if verdict == 'not fast' else '')


def _gpu_details(gpus):
    """{'/gpu:i': TensorFlow's details of the i-th physical GPU}, for the GPUs named."""
    physical = tf.config.list_physical_devices('GPU')
    details = {}
    for device in gpus:
        index = int(device.rsplit(':', 1)[1])
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
