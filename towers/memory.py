"""Memory: what a step's tensors hold at their peak on each device, and an out-of-memory
error said in one line, with what to try.

TensorFlow's step stats (RunOptions FULL_TRACE) record each allocation and each
release an op makes on a device's allocator, with its time: their running sum is
what the step's tensors held on that device, and its maximum the step's peak there.
The variables live across steps and are not in it (`towers explain` counts them
apart). On GPUs TensorFlow's allocator reserves more than this (it rounds up and
keeps freed blocks): the peak is what the step needs, not what `nvidia-smi` shows.
"""
import contextlib
import math
import re

import tensorflow as tf

from towers.deviceplan import ran_as_planned, short_device
from towers.errors import TowersError


class OutOfMemoryError(TowersError):
    """A device ran out of memory: which, for what, and what to try."""


def step_peaks(run_metadata):
    """{device, as TensorFlow names it: the most bytes the step's tensors held there at once}.

    Where two records share a microsecond the allocation is counted first: the
    peak errs high, never low.
    """
    peaks = {}
    for device in run_metadata.step_stats.dev_stats:
        records = sorted((record.alloc_micros, -record.alloc_bytes)
                         for node in device.node_stats for memory in node.memory
                         for record in memory.allocation_records)
        live = peak = 0
        for _, released in records:
            live -= released
            peak = max(peak, live)
        if records:
            peaks[device.device] = max(peaks.get(device.device, 0), peak)
    return peaks


# TensorFlow's words for an allocation that failed (RESOURCE_EXHAUSTED also says a full disk).
_OOM = re.compile(r'OOM when allocating tensor with shape\[([\d, ]*)\] and type (\w+) on '
                  r'(\S+) by allocator')


def out_of_memory(error, plan, batch_size, accumulate=1):
    """The OutOfMemoryError of a ResourceExhaustedError that says a device's memory ran out,
    else None (a full disk, say: TensorFlow's own line says it).

    Args:
      error: a tf.errors.ResourceExhaustedError.
      plan: the run's DevicePlan: which tower the device is, which towers share a GPU.
      batch_size, accumulate: the run's global batch and micro-batches.
    """
    match = _OOM.search(error.message or '')
    if match is None:
        return None
    shape, dtype, device = match.groups()
    dims = [int(d) for d in shape.replace(' ', '').split(',') if d]
    size = math.prod(dims) * tf.as_dtype(dtype).size
    towers = [i for i, d in enumerate(plan.towers) if ran_as_planned(d, device)]
    per_tower = -(-batch_size // len(plan.towers))
    slices = '%d images a tower' % per_tower
    if accumulate > 1:
        slices += ', in micro-batches of %d' % -(-per_tower // accumulate)
    where = ('tower %d of %d, %s' % (towers[0], len(plan.towers), slices) if towers
             else 'no tower: %s' % ('it holds the variables' if _holds_variables(plan, device)
                                    else 'the host ops'))
    fewer = ('give each tower fewer images: more towers, a smaller {batch_size}, or '
             '{accumulate} K to keep the global batch in K micro-batches')
    if not towers and _holds_variables(plan, device):
        fewer = 'put the variables elsewhere ({param_device}), or ' + fewer
    return OutOfMemoryError('out of memory on %s (%s) allocating %s of %s (%s)%s: ' + fewer,
                            short_device(device), where, _dtype_name(dtype),
                            '[%s]' % ','.join(map(str, dims)), _bytes(size),
                            _share(plan, towers))


@contextlib.contextmanager
def memory_said(plan, batch_size, accumulate=1):
    """Within: a ResourceExhaustedError that says a device's memory ran out becomes its
    OutOfMemoryError (out_of_memory); anything else passes as it is."""
    try:
        yield
    except tf.errors.ResourceExhaustedError as e:
        said = out_of_memory(e, plan, batch_size, accumulate)
        if said is None:
            raise
        raise said from e


def _holds_variables(plan, device):
    held = plan.variables if isinstance(plan.variables, str) else None
    return bool(held) and ran_as_planned(held, device)


def _share(plan, towers):
    """'; towers 0,1 share GPU 0's memory' where the device is a logical GPU, else ''."""
    for gpu, sharing in sorted(plan.shared_gpus().items()):
        if towers and towers[0] in sharing:
            return "; towers %s share GPU %d's memory" % (','.join(map(str, sharing)), gpu)
    return ''


def _dtype_name(name):
    """TensorFlow's 'float' -> 'a float32 tensor'."""
    return 'a %s tensor' % tf.as_dtype(name).name


def _bytes(size):
    for unit, scale in (('TiB', 2 ** 40), ('GiB', 2 ** 30), ('MiB', 2 ** 20), ('KiB', 2 ** 10)):
        if size >= scale:
            return '%.1f %s' % (size / scale, unit)
    return '%d B' % size
