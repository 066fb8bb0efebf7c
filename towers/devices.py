"""Which devices the towers run on, and the session config that makes them exist.

On a machine with GPUs the towers default to every visible GPU, `/gpu:0..k-1`,
as in the classic multi-GPU tutorial. Without GPUs, `num_towers=N` gives N
*virtual* CPU devices (`ConfigProto(device_count={'CPU': N})`), so the very same
multi-tower graph runs on N devices anywhere. A device that does not exist is an
error here, before any graph is built, never a silent collapse onto one device.
"""
import os
import re

import tensorflow as tf

from towers.errors import DeviceError
from towers.names import SPREAD

tf1 = tf.compat.v1

_DEVICE_RE = re.compile(r'^/?(?:device:)?(cpu|gpu):(\d+)$', re.IGNORECASE)


def visible_gpus():
    """Number of GPUs TensorFlow can see (0 on a CPU-only machine or build)."""
    return len(tf.config.list_physical_devices('GPU'))


def no_gpu_reason():
    """Why TensorFlow sees no GPU, as far as this process can tell."""
    if not tf.sysconfig.get_build_info().get('is_cuda_build'):
        return ("this TensorFlow is a CPU-only build (tensorflow-cpu): on a GPU machine, "
                "pip install -e '.[gpu]'")
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    if visible is not None and not visible.strip(' ,'):
        return 'CUDA_VISIBLE_DEVICES is empty, which hides every GPU'
    return ('TensorFlow found no CUDA GPU: check the NVIDIA driver (nvidia-smi) and that '
            "CUDA_VISIBLE_DEVICES names the GPUs")


def parse_device(name):
    """'/gpu:1', 'GPU:1', '/device:CPU:0' -> ('gpu', 1); anything else is an error."""
    match = _DEVICE_RE.match(name.strip())
    if not match:
        raise DeviceError(
            "bad device name %r: use the form /gpu:N or /cpu:N" % name)
    return match.group(1).lower(), int(match.group(2))


def require_gpus(parsed, num_gpus=None):
    """Raise DeviceError unless every ('gpu', i) in parsed exists.

    Args:
      parsed: (kind, index) pairs from parse_device.
      num_gpus: GPUs to assume; None asks TensorFlow (only if a GPU is named).
    """
    gpus = [index for kind, index in parsed if kind == 'gpu']
    if not gpus:
        return
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    if max(gpus) >= num_gpus:
        raise DeviceError('/gpu:%d does not exist: this machine has %d visible GPU(s)%s'
                          % (max(gpus), num_gpus, '; %s (or use /cpu:N, virtual devices)'
                             % no_gpu_reason() if not num_gpus else ''))


def resolve_devices(num_towers=None, devices=None, num_gpus=None):
    """Choose the tower devices.

    Args:
      num_towers: how many towers; None means every visible GPU, or one CPU.
      devices: explicit device names ('/gpu:0,/gpu:1' or a list); overrides
        num_towers (which, if also given, must agree).
      num_gpus: GPUs to assume; None asks TensorFlow.

    Returns:
      A list of canonical device strings, e.g. ['/gpu:0', '/gpu:1'] or
      ['/cpu:0', '/cpu:1', '/cpu:2'].

    Raises:
      DeviceError: a device that does not exist, duplicates, mixed kinds, or a
        tower count that cannot be met.
    """
    if num_gpus is None:
        num_gpus = visible_gpus()
    if devices:
        if isinstance(devices, str):
            devices = [d for d in devices.split(',') if d.strip()]
        if not devices:
            raise DeviceError('the device list names no device: use e.g. /gpu:0,/gpu:1')
        parsed = [parse_device(d) for d in devices]
        if len(set(parsed)) != len(parsed):
            raise DeviceError('device list %s names a device twice' % ','.join(devices))
        if len({kind for kind, _ in parsed}) > 1:
            raise DeviceError('device list %s mixes CPUs and GPUs; use one kind'
                              % ','.join(devices))
        if num_towers is not None and num_towers != len(parsed):
            raise DeviceError('{towers} %d disagrees with %d devices in %s'
                              % (num_towers, len(parsed), ','.join(devices)))
        require_gpus(parsed, num_gpus)
        return ['/%s:%d' % p for p in parsed]
    if num_towers is not None and num_towers < 1:
        raise DeviceError('{towers} must be at least 1, got %d' % num_towers)
    if num_gpus:
        if num_towers is None:
            num_towers = num_gpus
        if num_towers > num_gpus:
            raise DeviceError(
                'asked for %d towers but this machine has %d visible GPU(s); use '
                '{towers} %d or fewer, or {devices} /cpu:0,... for CPU towers'
                % (num_towers, num_gpus, num_gpus))
        return ['/gpu:%d' % i for i in range(num_towers)]
    return ['/cpu:%d' % i for i in range(num_towers or 1)]


def session_config(tower_devices, param_device='/cpu:0', num_gpus=None, **kwargs):
    """A ConfigProto under which every named device exists.

    Virtual CPU devices are created with device_count (device_config). A named
    GPU that is not there is an error here.

    Args:
      tower_devices: device strings from resolve_devices.
      param_device: the device holding the variables (counted too).
      num_gpus: GPUs to assume; None asks TensorFlow.
      **kwargs: other ConfigProto fields.

    Raises:
      DeviceError: a named GPU does not exist.
    """
    # 'spread' puts the variables on the tower devices themselves.
    hosts = [] if param_device == SPREAD else [param_device]
    parsed = [parse_device(d) for d in list(tower_devices) + hosts]
    require_gpus(parsed, num_gpus)
    cpus = [index for kind, index in parsed if kind == 'cpu']
    return device_config(max(cpus) + 1 if cpus else 1, **kwargs)


def device_config(num_cpus, **kwargs):
    """The ConfigProto every Session and server of towers starts from.

    num_cpus CPU devices (the ones past the first are virtual), and soft placement
    on, as in the classic tutorial: a single op without a kernel on its GPU (a
    summary, a string op) may run on the host; a tower op that moves is
    refused after the first step (callbacks/placement.py) unless asked.
    """
    config = tf1.ConfigProto(allow_soft_placement=True, **kwargs)
    config.device_count['CPU'] = num_cpus
    return config


def describe_devices(tower_devices, param_device):
    """Lines for `towers devices`: what would be used, and what exists."""
    gpus = visible_gpus()
    lines = ['visible GPUs: %d' % gpus]
    for i, device in enumerate(tower_devices):
        virtual = ' (virtual CPU device)' if device.startswith('/cpu') else ''
        lines.append('tower_%d: %s%s' % (i, device, virtual))
    lines.append('variables: %s' % ('spread over the tower devices, by size'
                                     if param_device == SPREAD else param_device))
    return lines


def resolve_param_device(choice, tower_devices, num_gpus=None):
    """Where the shared variables live.

    Args:
      choice: 'cpu' (the classic tutorial's '/cpu:0'), 'gpu' (the first tower's
        GPU, which must be one), 'spread' (over the tower devices, each
        variable to the one with the fewest bytes so far), or an explicit
        device name such as '/cpu:1'.
      tower_devices: the resolved tower devices.
      num_gpus: GPUs to assume for an explicit '/gpu:N'; None asks TensorFlow.
    """
    if choice in (None, 'cpu'):
        return '/cpu:0'
    if choice == SPREAD:
        return SPREAD
    if choice == 'gpu':
        if not tower_devices[0].startswith('/gpu'):
            raise DeviceError("{param_device} gpu needs GPU towers, but the towers run on %s; "
                              "use {param_device} cpu" % ','.join(tower_devices))
        return tower_devices[0]
    parsed = parse_device(choice)
    require_gpus([parsed], num_gpus)
    return '/%s:%d' % parsed
