"""How towers that share a GPU are said: which logical GPUs of which GPU, and their memory.

A DevicePlan knows which towers share a GPU (DevicePlan.shared_gpus, from
towers/devices.py's split); these turn that into the lines a run, `towers explain
--plan-only` and the variables line print.
"""
import tensorflow as tf


def logical_gpu_line(plan, memory):
    """One line for a plan whose towers split GPUs into logical GPUs, else None: e.g.
    'logical GPUs: 2 towers on GPU 0 (/gpu:0, /gpu:1), 39.2 GiB each'.

    Args:
      memory: {'/gpu:i': bytes} the Session gave each logical GPU (session_gpu_memory).
    """
    if not plan.shared_gpus():
        return None
    towers = {}
    for device, gpu in zip(plan.towers, plan.gpus):
        towers.setdefault(gpu, []).append(device)
    # TensorFlow gives every logical GPU of a GPU an equal share of its memory.
    return 'logical GPUs: %s' % '; '.join(
        '%d tower(s) on GPU %d (%s), %s' % (
            len(devices), gpu, ', '.join(devices),
            '%.1f GiB each' % (memory[devices[0]] / 2 ** 30) if devices[0] in memory
            else 'an equal share of its memory each')
        for gpu, devices in sorted(towers.items()))


def session_gpu_memory(sess):
    """{'/gpu:i': the bytes TensorFlow gave the Session's GPU i}."""
    return {'/gpu:%d' % tf.DeviceSpec.from_string(d.name).device_index: d.memory_limit_bytes
            for d in sess.list_devices() if d.device_type == 'GPU'}


def share_text(shared):
    """'towers 0,1 share GPU 0', from DevicePlan.shared_gpus()."""
    return '; '.join('towers %s share GPU %d' % (','.join(map(str, towers)), gpu)
                     for gpu, towers in sorted(shared.items()))
