"""Which devices the towers run on, and the session config that makes them exist.

On a machine with GPUs the towers default to every visible GPU, `/gpu:0..k-1`,
as in the classic multi-GPU tutorial. Without GPUs, `num_towers=N` gives N
*virtual* CPU devices (`ConfigProto(device_count={'CPU': N})`), so the very same
multi-tower graph runs on N devices anywhere. A device that does not exist is an
error here, before any graph is built, never a silent collapse onto one device.

More towers than GPUs split each GPU into *logical* GPUs (TensorFlow's virtual
devices, `gpu_options.experimental.num_virtual_devices_per_gpu`), an equal share
of its memory each, so that every tower still has a `/gpu:i` of its own: two
towers on a one-GPU machine run on /gpu:0 and /gpu:1, both on GPU 0. The split
follows from the tower devices and the GPU count alone (gpu_split), so every
part that is handed the devices reads the same split: with G GPUs and N > G GPU
towers, each GPU holds ceil(N / G) logical GPUs, logical /gpu:j being on GPU
j // ceil(N / G).
"""
import math
import os
import re
import typing

import tensorflow as tf

from towers.errors import DeviceError
from towers.names import DEVICE_KINDS, SPREAD

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


def require_gpus(parsed, num_gpus=None, per_gpu=1):
    """Raise DeviceError unless every ('gpu', i) in parsed exists.

    Args:
      parsed: (kind, index) pairs from parse_device.
      num_gpus: GPUs to assume; None asks TensorFlow (only if a GPU is named).
      per_gpu: the logical GPUs each GPU is split into (gpu_split).
    """
    gpus = [index for kind, index in parsed if kind == 'gpu']
    if not gpus:
        return
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    if max(gpus) >= num_gpus * per_gpu:
        split = ' split into %d logical GPUs each' % per_gpu if per_gpu > 1 else ''
        raise DeviceError('/gpu:%d does not exist: this machine has %d visible GPU(s)%s%s'
                          % (max(gpus), num_gpus, split, '; %s (or use /cpu:N, virtual devices)'
                             % no_gpu_reason() if not num_gpus else ''))


def resolve_devices(num_towers=None, devices=None, num_gpus=None, logical_gpus=True,
                    per_gpu=None):
    """Choose the tower devices.

    Args:
      num_towers: how many towers; None means every visible GPU, or one CPU.
      devices: explicit device names ('/gpu:0,/gpu:1' or a list), which
        override num_towers (if also given, it must agree); or a kind, 'cpu'
        or 'gpu': num_towers towers on that kind (CPU towers on a GPU machine).
      num_gpus: GPUs to assume; None asks TensorFlow.
      logical_gpus: more GPU towers than GPUs split the GPUs into logical GPUs
        (the module's docstring); False refuses instead.
      per_gpu: the logical GPUs each GPU is split into, where one process runs
        several tower counts under the split of its largest (bench, check);
        None: the towers' own split (gpu_split).

    Returns:
      A list of canonical device strings, e.g. ['/gpu:0', '/gpu:1'] or
      ['/cpu:0', '/cpu:1', '/cpu:2'].

    Raises:
      DeviceError: a device that does not exist, duplicates, mixed kinds, or a
        tower count that cannot be met.
    """
    if num_gpus is None:
        num_gpus = visible_gpus()
    kind = device_kind_named(devices)
    if kind:
        devices = None
    elif devices:
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
        named = ['/%s:%d' % p for p in parsed]
        check_gpu_split(named, num_gpus, logical_gpus)
        require_gpus(parsed, num_gpus, per_gpu or gpu_split(named, num_gpus))
        return named
    if num_towers is not None and num_towers < 1:
        raise DeviceError('{towers} must be at least 1, got %d' % num_towers)
    if kind == 'gpu' and not num_gpus:
        require_gpus([('gpu', 0)], num_gpus)  # says why there is none
    if not num_gpus or kind == 'cpu':
        return ['/cpu:%d' % i for i in range(num_towers or 1)]
    towers = logical_gpu_devices(num_towers or num_gpus, num_gpus, per_gpu)
    check_gpu_split(towers, num_gpus, logical_gpus)
    return towers


def logical_gpu_devices(num_towers, num_gpus, per_gpu=None):
    """The towers' /gpu:j over num_gpus GPUs, each split into per_gpu logical GPUs (None:
    ceil(num_towers / num_gpus), 1 while the GPUs suffice): the towers dealt out evenly
    (5 towers on 4 GPUs: two on GPU 0, one on each other), the lowest logical GPUs first.
    """
    per_gpu = per_gpu or split_for(num_towers, num_gpus)
    counts = [num_towers // num_gpus + (gpu < num_towers % num_gpus) for gpu in range(num_gpus)]
    if max(counts) > per_gpu:
        raise DeviceError('%d towers do not fit in %d GPU(s) of %d logical GPUs each'
                          % (num_towers, num_gpus, per_gpu))
    return ['/gpu:%d' % (gpu * per_gpu + j) for gpu in range(num_gpus) for j in range(counts[gpu])]


def device_kind_named(devices):
    """'cpu' or 'gpu' where --devices names a kind (DEVICE_KINDS), else None."""
    kind = devices.strip().lower() if isinstance(devices, str) else None
    return kind if kind in DEVICE_KINDS else None


def task_gpus(devices):
    """The GPUs a cluster task computes on for --devices: 0 for the kind 'cpu' (its towers on
    virtual CPUs, on a GPU host too), else None (the GPUs it sees)."""
    return 0 if device_kind_named(devices) == 'cpu' else None


def split_for(num_towers, num_gpus):
    """The logical GPUs per GPU for num_towers GPU towers on num_gpus GPUs: 1 while each has
    a GPU of its own, else ceil(num_towers / num_gpus). The one rule of the split."""
    return max(1, math.ceil(num_towers / num_gpus)) if num_gpus else 1


def process_split(tower_counts, devices=None, num_gpus=None):
    """The logical GPUs per GPU of a process that runs several tower counts (bench, check):
    its largest count's split, for every count, since TensorFlow fixes a process's logical
    GPUs at its first Session. 1 on CPU towers (devices 'cpu', or no GPU)."""
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    return 1 if device_kind_named(devices) == 'cpu' else split_for(max(tower_counts), num_gpus)


def gpu_split(tower_devices, num_gpus):
    """The logical GPUs per GPU that these towers need (split_for their GPU towers)."""
    return split_for(sum(1 for d in tower_devices if parse_device(d)[0] == 'gpu'), num_gpus)


def check_gpu_split(tower_devices, num_gpus, logical_gpus=True):
    """DeviceError where the towers need a GPU split that logical_gpus=False refuses."""
    if not logical_gpus and gpu_split(tower_devices, num_gpus) > 1:
        raise DeviceError(
            'asked for %d GPU towers but this machine has %d visible GPU(s), and '
            '{no_logical_gpus} refuses to split a GPU into logical ones; use {towers} %d or '
            'fewer, or {devices} cpu for CPU towers' % (len(tower_devices), num_gpus, num_gpus))


def physical_gpus(tower_devices, num_gpus, per_gpu=None):
    """The GPU each tower's device is on (logical GPUs of one GPU share it), None for a CPU:
    ['/gpu:0', '/gpu:1'] on one GPU -> (0, 0). per_gpu: as resolve_devices has it."""
    per_gpu = per_gpu or gpu_split(tower_devices, num_gpus)
    return tuple(index // per_gpu if kind == 'gpu' else None
                 for kind, index in map(parse_device, tower_devices))


def on_one_gpu(tower_devices, num_gpus=None, per_gpu=None):
    """Whether every tower is a GPU, all on one GPU: one tower, or logical GPUs of one GPU."""
    if any(parse_device(d)[0] != 'gpu' for d in tower_devices):
        return False
    num_gpus = visible_gpus() if num_gpus is None else num_gpus
    return len(set(physical_gpus(tower_devices, num_gpus, per_gpu))) == 1


class ProcessDevices(typing.NamedTuple):
    """A process's devices, resolved once (resolve_process_devices)."""
    towers: list  # one device name per tower
    param: object  # where the shared variables go: a device, or 'spread'
    config: object  # the Session's ConfigProto, under which every one of them exists
    gpus: tuple  # the GPU each tower is on (physical_gpus)


def resolve_process_devices(towers=None, param_device=None, devices=None, num_gpus=None,
                            logical_gpus=True, per_gpu=None):
    """Every device of one process's run, resolved in one place: the towers (a count or None
    as resolve_devices takes it, or device names resolved already), the parameter device
    (resolve_param_device), the Session's ConfigProto and each tower's GPU. Arguments as
    towers.deviceplan.local_plan has them."""
    tower_devices = (list(towers) if isinstance(towers, (list, tuple))
                     else resolve_devices(towers, devices, num_gpus, logical_gpus, per_gpu))
    if num_gpus is None and any(d.startswith('/gpu') for d in tower_devices):
        num_gpus = visible_gpus()
    param = resolve_param_device(param_device, tower_devices, num_gpus, per_gpu)
    return ProcessDevices(tower_devices, param,
                          session_config(tower_devices, param, num_gpus, per_gpu),
                          physical_gpus(tower_devices, num_gpus or 0, per_gpu))


def session_config(tower_devices, param_device='/cpu:0', num_gpus=None, per_gpu=None,
                   **kwargs):
    """A ConfigProto under which every named device exists.

    Virtual CPU devices are created with device_count (device_config), logical
    GPUs with gpu_options (more GPU towers than GPUs: the module's docstring).
    A named GPU that is not there is an error here.

    Args:
      tower_devices: device strings from resolve_devices.
      param_device: the device holding the variables (counted too).
      num_gpus: GPUs to assume; None asks TensorFlow.
      per_gpu: logical GPUs per GPU, as resolve_devices has it.
      **kwargs: other ConfigProto fields.

    Raises:
      DeviceError: a named GPU does not exist.
    """
    # 'spread' puts the variables on the tower devices themselves.
    hosts = [] if param_device == SPREAD else [param_device]
    parsed = [parse_device(d) for d in list(tower_devices) + hosts]
    if any(kind == 'gpu' for kind, _ in parsed) and num_gpus is None:
        num_gpus = visible_gpus()
    per_gpu = per_gpu or gpu_split(tower_devices, num_gpus)
    require_gpus(parsed, num_gpus, per_gpu)
    cpus = [index for kind, index in parsed if kind == 'cpu']
    config = device_config(max(cpus) + 1 if cpus else 1, **kwargs)
    if per_gpu > 1:
        # TensorFlow fixes a process's logical GPUs at its first Session: a process that
        # runs several tower counts gives them all its largest split (per_gpu).
        config.gpu_options.experimental.num_virtual_devices_per_gpu = per_gpu
    return config


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


def describe_devices(tower_devices, param_device, num_gpus=None):
    """Lines for `towers devices`: what would be used, and what exists."""
    gpus = visible_gpus() if num_gpus is None else num_gpus
    lines = ['visible GPUs: %d' % gpus]
    per_gpu = gpu_split(tower_devices, gpus)
    for i, (device, gpu) in enumerate(zip(tower_devices, physical_gpus(tower_devices, gpus))):
        where = ''
        if gpu is None:
            where = ' (virtual CPU device)'
        elif per_gpu > 1:
            where = ' (a logical GPU: 1/%d of GPU %d)' % (per_gpu, gpu)
        lines.append('tower_%d: %s%s' % (i, device, where))
    lines.append('variables: %s' % ('spread over the tower devices, by size'
                                     if param_device == SPREAD else param_device))
    return lines


def resolve_param_device(choice, tower_devices, num_gpus=None, per_gpu=None):
    """Where the shared variables live.

    Args:
      choice: 'auto' (the command line's default: 'gpu' where every tower is on
        one GPU, else 'cpu'), 'cpu' (the classic tutorial's '/cpu:0'), 'gpu'
        (the first tower's GPU, which must be one), 'spread' (over the tower
        devices, each variable to the one with the fewest bytes so far), or an
        explicit device name such as '/cpu:1'.
      tower_devices: the resolved tower devices.
      num_gpus: GPUs to assume for 'auto' or an explicit '/gpu:N'; None asks TensorFlow.
      per_gpu: logical GPUs per GPU, as resolve_devices has it.
    """
    if choice == 'auto':
        # tf_cnn_benchmarks' advice for one GPU, measured in issue 34: ResNet-50 on one H100
        # ran 16% (fp32) and 18% (bf16) slower with its variables on the host. CPU towers keep
        # /cpu:0, and so do several GPUs (whose fast path is --variable-update replicated).
        choice = 'gpu' if on_one_gpu(tower_devices, num_gpus, per_gpu) else 'cpu'
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
    if parsed[0] == 'gpu' and num_gpus is None:
        num_gpus = visible_gpus()
    require_gpus([parsed], num_gpus, gpu_split(tower_devices, num_gpus or 0))
    return '/%s:%d' % parsed
