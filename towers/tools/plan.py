"""`towers plan`: how a model would scale over N workers, from one step measured here.

A synchronous step on N workers of G devices each is the compute of one
worker's step followed by what the strategy sends over the network: the
gradients leave after the last tower's backward pass, and the next step's
forward pass waits for the update. Collective mode's all-reduce in buckets
(--all-reduce-bucket, the default) overlaps the two instead: see overlapped().
Weak scaling, as the anchors measure it: every worker keeps its batch b, so
the global batch is N*b.

  step(N)     = compute + communication(N)    (overlapped: see overlapped())
  images/sec  = N * b / step(N)
  efficiency  = compute / step(N): images/sec against N workers that never
                wait for the network (the anchors' "percent of linear")

compute is the mean step of one worker (G towers, batch b) timed on this
machine, or, given the target device's sustained FLOP/s, the FLOPs of one
tower's step (TensorFlow's profiler, as `towers explain` counts them) over it.

Each host has one link of B bytes/s in each direction and a one-way latency
a. S is the bytes of the gradients (the float32 trainable variables, in every
precision); S_p the share of them on ps task p, placed as towers places them
(each variable to the least loaded ps task).

  parameter-server  the pull, then the push, each bound by its busiest link:
                    a worker reads every variable once, whatever its G towers
                    (through its CPU: S in), and pushes its towers' sum (S
                    out); ps task p sends N*S_p and receives N*S_p:
                    2 * max(S, N*max S_p) / B + 4a
  collective        (--all-reduce-bucket 0) a ring all-reduce of each buffer
                    of gradients (packed up to 32 MB, towers/cluster/
                    collective.py), then one of the step's loss and metrics:
                    2(N-1)/N * S / B + 2(N-1) * a * (buffers + 1)
  in-graph          the chief's one graph: every tower reads the variables
                    and sends its own gradient to the ps tasks (to the chief,
                    without ps tasks), and the chief feeds every worker its
                    slice of the batch (I bytes per worker):
                    (max(G*S, N*G*max S_p) + max(G*S, N*G*max S_p)
                    + (N-1)*I) / B + 4a

The in-graph bytes are what `towers explain --workers N --ps P` counts in the
real partitions (tests/tools/test_explain.py checks the two agree to the byte).
Bytes crossing a link cost size/B', where B' = B * 1448/1514 is what TCP/IP
carries of a link of B: each 1500-byte frame (1514 with its Ethernet header, as
Linux counts and shapes it) holds 1448 bytes of payload (FRAMING). gRPC's own
framing and serialising are left out, which is why a measured step may be a
little slower than its prediction. Checked on an emulated cluster (`towers
launch --emulate-link`, which counts each host's bytes): each task's bytes by
tests/cluster/test_plan_emulated.py, the step by `towers plan --verify`
(towers/tools/linkbench.py), which runs the modes and worker counts planned.
"""
import math
import re

import numpy as np
import tensorflow as tf

from towers.allreduce import BUFFER_BYTES, byte_packs
from towers.cluster.collective import bucket_order
from towers.cluster.emulate import SCALES
from towers.deviceplan import local_plan
from towers.errors import SettingError
from towers.model import ClassifierModel
from towers.names import CLUSTER_MODES
from towers.spread import LeastLoaded
from towers.tools.explain import bytes_text, op_flops
from towers.tools.trace import pyplot_for, save_png

tf1 = tf.compat.v1


# Link bytes per byte of payload: a 1500-byte MTU's TCP segment carries 1448 bytes (with
# timestamps) in a 1514-byte frame. Measured on the emulated links: mnist_convnet's 13.10 MB
# all-reduce crossed as 13.73 MB at 200 Mbit. Above about 500 Mbit the emulation's token
# bucket lets TCP's 64 kB segments through whole, with 0.3% of headers (its parameter-server
# pull, 13.13 MB at 1 Gbit): there it carries more payload than a wire would.
FRAMING = 1514 / 1448


def parse_flops(text):
    """'4.5T' -> 4.5e12 FLOP/s (units k, M, G, T)."""
    match = re.match(r'^(\d+(?:\.\d+)?)\s*([kKMGT]?)(?:FLOP/s|FLOPS)?$', str(text).strip())
    flops = SCALES[match.group(2)] * float(match.group(1)) if match else 0.0
    if flops <= 0:
        raise SettingError('{device_flops} is a positive FLOP/s such as 4.5T or 800G, not %r',
                           text)
    return flops


def ring_bytes(workers, nbytes):
    """What each worker sends, and receives, in a ring all-reduce of nbytes over `workers`:
    its share of the reduce-scatter, then of the all-gather, 2(N-1)/N * nbytes."""
    return 2 * (workers - 1) / workers * nbytes


def shard_bytes(sizes, ps):
    """The gradient bytes on each of ps tasks, each variable to the least loaded one."""
    chooser = LeastLoaded(range(ps))
    for size in sizes:
        chooser.place(size)
    return chooser.load


def communication(mode, workers, sizes, bandwidth, latency, towers=1, ps=0, input_bytes=0):
    """Seconds a step spends on the network, and the formula with its numbers.

    Args:
      sizes: bytes of each trainable variable (its gradient), in build order.
      bandwidth: bytes/s of each host's link, each way; latency: seconds one way.
      towers: G, devices per worker.
      input_bytes: I, one worker's slice of the batch (in-graph: fed by the chief).
    """
    n, g, size, b, a = workers, towers, sum(sizes), bandwidth, latency
    if mode not in CLUSTER_MODES:
        raise SettingError('{cluster_mode} is in-graph, collective or parameter-server, not %r',
                           mode)
    facts = CLUSTER_MODES[mode]
    if facts.copy_per_worker:  # the workers' ring all-reduce
        if n == 1:
            return 0.0, 'one worker: nothing crosses the network'
        buffers = max(1, math.ceil(size / BUFFER_BYTES))
        moved = ring_bytes(n, size)
        seconds = moved / b + 2 * (n - 1) * a * (buffers + 1)
        return seconds, '2(N-1)/N*S/B + 2(N-1)*a*(buffers+1) = %s/B + %d*a' % (
            bytes_text(moved), 2 * (n - 1) * (buffers + 1))
    if facts.needs_ps and ps < 1:
        raise SettingError('{cluster_mode} %s needs {ps} of at least 1', mode)
    # Without ps tasks (in-graph only) the chief holds every variable and reads its own.
    shard = max(shard_bytes(sizes, ps)) if ps else size
    if not facts.one_graph:  # a worker's graph of its own: its one read and one push
        pull = push = max(size, n * shard)
        seconds = (pull + push) / b + 4 * a
        return seconds, '2*max(S, N*S_p)/B + 4a = (%s + %s)/B + 4a' % (bytes_text(pull),
                                                                         bytes_text(push))
    holders = n if ps else n - 1
    pull = push = max(g * size if holders else 0, holders * g * shard)
    fed = (n - 1) * input_bytes
    seconds = (pull + push + fed) / b + (4 * a if holders else 0)
    formula = '2*max(G*S, N*G*S_p)/B%s + 4a = (%s + %s%s)/B + 4a' % (
        ' + (N-1)*I/B' if fed else '', bytes_text(pull), bytes_text(push),
        ' + %s' % bytes_text(fed) if fed else '')
    return seconds, formula


def bytes_between_tasks(mode, workers, sizes, towers=1, ps=0, input_bytes=0):
    """All the bytes that cross the network per step (every link, both ways): what every
    task sends, by task_bytes."""
    return int(round(sum(sent for _, sent, _ in task_bytes(mode, workers, sizes, towers, ps,
                                                           input_bytes))))


def task_bytes(mode, workers, sizes, towers=1, ps=0, input_bytes=0):
    """[(task, bytes it sends, bytes it receives)] per step, by the formulas, as
    `towers launch --emulate-link` counts them on each host's link.

    collective: each worker sends and receives the ring's 2(N-1)/N * S; parameter-server:
    a worker receives S (its one read) and sends S (its push), ps task p sends and receives
    N * S_p; in-graph: every tower reads its variables from where they are and sends its
    gradient back there (the chief's own towers read locally without ps tasks), and the
    chief sends each other worker its slice of I bytes.
    """
    n, g, size = workers, towers, sum(sizes)
    names = ['worker %d' % k for k in range(n)] + ['ps %d' % p for p in range(ps)]
    facts = CLUSTER_MODES[mode]
    if facts.copy_per_worker:
        ring = ring_bytes(n, size)
        return [(name, ring, ring) for name in names]
    shards = list(shard_bytes(sizes, ps)) if ps else []
    if not facts.one_graph:  # parameter-server: each worker's read and push
        return [(name, size, size) for name in names[:n]] + [
            (name, n * shard, n * shard) for name, shard in zip(names[n:], shards)]
    if ps:  # in-graph: every worker's towers read from the ps tasks and send back there
        workers_use = [(g * size, g * size)] * n
        ps_use = [(n * g * shard, n * g * shard) for shard in shards]
    else:  # the chief holds the variables
        workers_use = [((n - 1) * g * size, (n - 1) * g * size)] + [(g * size, g * size)] * (
            n - 1)
        ps_use = []
    fed = [((n - 1) * input_bytes, 0)] + [(0, input_bytes)] * (n - 1)
    return [(name, sent + out, received + into) for name, (sent, received), (out, into)
            in zip(names, workers_use, fed)] + [
        (name, sent, received) for name, (sent, received) in zip(names[n:], ps_use)]


def overlapped(compute, workers, sizes, bandwidth, latency, bucket_bytes):
    """(step, network, formula) of collective mode's all-reduce in buckets, overlapped
    with the backward pass (towers/cluster/collective.py).

    The buckets are cut as the workers cut them: the gradients in reverse order, the
    batch size's 4 bytes first, a bucket closed once it holds bucket_bytes. Each is a ring
    all-reduce, t_j = 2(N-1)/N * s_j/B + 2(N-1)*a; W is all of them and the step's
    results. The network starts when the backward pass starts making gradients, after
    the forward pass (a third of a step: the backward is about twice the forward), and
    the last bucket (the first layers) only when it ends:

      step = max(C + t_last, C/3 + W)
    """
    n, a = workers, latency
    if n == 1:
        return compute, 0.0, 'one worker: nothing crosses the network'
    order = bucket_order(4, sizes)  # the batch size's 4 bytes, then the gradients reversed
    buckets = [sum(order[i] for i in group)
               for group in byte_packs([('float32', size) for size in order], bucket_bytes)]
    times = [ring_bytes(n, size) / bandwidth + 2 * (n - 1) * a for size in buckets]
    network = sum(times) + 2 * (n - 1) * a
    step = max(compute + times[-1], compute / 3 + network)
    return step, network, ('%d buckets; max(C + t_last, C/3 + W) = max(%.4f + %.4f, %.4f + '
                           '%.4f) s' % (len(buckets), compute, times[-1], compute / 3, network))


def predict(mode, worker_counts, compute, batch, sizes, bandwidth, latency, towers=1, ps=0,
            input_bytes=0, bucket_bytes=0):
    """One row per worker count: step, images/sec, efficiency, and the formula's terms.

    Args:
      ps: ps tasks (none in collective mode), or 'workers' for one per worker.
      bucket_bytes: collective mode's all-reduce buckets, overlapped with the backward pass
        (see overlapped); 0: the all-reduce after it, step = compute + network.
    """
    rows, bandwidth = [], bandwidth / FRAMING  # what the link carries of the payload
    for n in worker_counts:
        all_reduce = CLUSTER_MODES[mode].copy_per_worker
        tasks = 0 if all_reduce else n if ps == 'workers' else ps
        if all_reduce and bucket_bytes:
            step, network, formula = overlapped(compute, n, sizes, bandwidth, latency,
                                                bucket_bytes)
        else:
            network, formula = communication(mode, n, sizes, bandwidth, latency, towers, tasks,
                                             input_bytes)
            step = compute + network
        rows.append({'mode': mode, 'workers': n, 'devices': n * towers, 'ps': tasks,
                     'compute_s': compute, 'network_s': network, 'step_s': step,
                     'images_per_sec': n * batch / step, 'efficiency': compute / step,
                     'formula': formula,
                     'bytes_between_tasks': bytes_between_tasks(mode, n, sizes, towers, tasks,
                                                                input_bytes)})
    return rows


def even_sizes(total, pieces=1024):
    """A gradient of total bytes as many equal variables: shares even over any ps count."""
    return [total / pieces] * pieces


def model_sizes(model_fn, input_shape):
    """Bytes of each trainable variable of the model (its gradient's size), in build order."""
    with tf.Graph().as_default():
        model_fn(tf1.placeholder(tf.float32, [None] + list(input_shape)), training=True)
        return [v.shape.num_elements() * v.dtype.base_dtype.size
                for v in tf1.trainable_variables()]


def tower_flops(model_fn, input_shape, num_classes, batch):
    """FLOPs of one tower's training step on `batch` images (as `towers explain` counts them)."""
    model = ClassifierModel(model_fn, input_shape, num_classes)
    return sum(op_flops(model, local_plan(['/cpu:0']), batch, num_classes).values())


def table_lines(rows):
    lines = ['%-17s %8s %8s %11s %11s %11s %12s %10s' % (
        'mode', 'workers', 'devices', 'compute s', 'network s', 'step s', 'images/sec',
        'efficiency')]
    for row in rows:
        lines.append('%-17s %8d %8d %11.4f %11.4f %11.4f %12.1f %9.1f%%' % (
            row['mode'], row['workers'], row['devices'], row['compute_s'], row['network_s'],
            row['step_s'], row['images_per_sec'], 100 * row['efficiency']))
    return lines


def plot_rows(rows, path, title):
    """Efficiency against workers, one line per mode (needs matplotlib)."""
    pyplot = pyplot_for('plot')
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for mode in sorted({row['mode'] for row in rows}):
        mine = [row for row in rows if row['mode'] == mode]
        axes.plot([row['workers'] for row in mine], [100 * row['efficiency'] for row in mine],
                  marker='o', label=mode)
    axes.set_xscale('log', base=2)
    axes.set_xlabel('workers')
    axes.set_ylabel('predicted efficiency (% of linear)')
    axes.set_ylim(0, 105)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    save_png(pyplot, figure, path)


def slice_bytes(input_shape, batch):
    """I: one worker's slice of a fed batch: float32 images, int64 labels, and two int32
    counts (the slice's and the batch's)."""
    return int(batch * (np.prod(input_shape) * 4 + 8) + 2 * 4)
