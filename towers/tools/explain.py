"""`towers explain`: where each part of a training step runs, read off the real graph.

The training graph is built as `towers train` builds it and one step is run
with RunOptions(output_partition_graphs, FULL_TRACE). TensorFlow's placer has
then split it into one partition per device, joined by _Send/_Recv pairs: the
partitions say which op ran where, the step stats give every tensor's real
shape, and TensorFlow's profiler counts each op's FLOPs at those shapes. So
every number below comes from the graph that trains, not from a formula that
could drift from it:

  per device     its tower and slice of the global batch, ops, FLOPs, the
                 variables it holds and their bytes
  where          the gradient averaging (or all-reduce) and the apply ops run
  per step       bytes that cross between each pair of devices, by kind:
                 variables (read by a tower elsewhere), gradients, input, other

On a cluster (`--workers N [--ps P]`, in-graph replication) every task is a
server of this process on 127.0.0.1 and the chief's one graph runs one step
over them: the partitions and the bytes are then per task and device, and the
bytes between tasks are what would cross the network.
"""
import collections
import contextlib
import io
import re

import numpy as np
import tensorflow as tf

from towers import data
from towers.cluster.launch import local_cluster
from towers.cluster.placement import in_graph_plan
from towers.cluster.server import server_config, start_server
from towers.cluster.spec import Cluster
from towers.data.sampler import EpochSampler
from towers.deviceplan import short_device
from towers.errors import SettingError
from towers.graph import build_training_graph
from towers.inputs import DatasetInput, SyntheticInput, make_input
from towers.memory import step_peaks
from towers.model import ClassifierModel
from towers.names import INPUT_MODES
from towers.precision import Precision
from towers.session import open_session, run_steps, trace_options
from towers.tools.trace import AVERAGE_SCOPES

tf1 = tf.compat.v1

_APPLY_TYPE = re.compile(r'(Resource)?(Sparse)?Apply')
_TRANSFER = ('_Send', '_Recv', '_HostSend', '_HostRecv')


def local_in_graph(workers, ps=0, towers_per_task=1, num_gpus=None):
    """(plan, target) of in-graph replication over a cluster served by this process.

    Every task's server runs here, on free ports of 127.0.0.1; they live as long
    as the process (TensorFlow has no way to stop one). num_gpus: each task's GPUs
    (0: its towers on virtual CPUs; None: the GPUs this process sees).
    """
    jobs = local_cluster(workers, ps)
    tasks = [Cluster(jobs, job, index) for job in jobs for index in range(len(jobs[job]))]
    servers = [start_server(task, server_config(task, towers_per_task, num_gpus=num_gpus))
               for task in tasks]
    _SERVERS.extend(servers)  # kept alive: a collected Server stops serving
    chief = tasks[0]  # local_cluster lists the workers first
    return in_graph_plan(chief, towers_per_task, num_gpus=num_gpus), servers[0].target


_SERVERS = []


def explain(model_fn, input_shape, num_classes, plan, batch_size=100, input_mode='feed',
            optimizer='sgd', sync_bn=False, target='', precision=None, accumulate=1):
    """Build the training graph, run one step, and say where everything ran.

    Args:
      plan: the towers.deviceplan.DevicePlan (local_plan, or local_in_graph's
        for a cluster served here, with its target).
      target: the Session target ('' in this process).
      precision: what the towers compute in (a towers.precision.Precision or
        its name; None: fp32).
      accumulate: each tower's micro-batches, one after another (train's --accumulate):
        the ops and FLOPs are the step's, all K micro-batches'.
    Returns:
      dict: devices {device: {tower, examples, ops, flops, variables,
      variable_bytes, low_precision_ops, peak_bytes: the most bytes the step's tensors held
      there at once (towers/memory.py)}}, averaging [devices], apply
      [devices], transfers [{from, to, bytes, kinds {kind: bytes}}],
      bytes_per_step, bytes_between_tasks, batch_size, precision (its name)
      and compute_dtype (e.g. 'bfloat16'; low_precision_ops counts the ops
      that computed in it).
    """
    precision = Precision.of(precision)
    if INPUT_MODES[input_mode].runs_ahead:
        raise SettingError('explain runs {input} feed or synthetic (where the input comes '
                           'from changes only the input transfers), not %s', input_mode)
    source = zeros_input(input_mode, input_shape, num_classes, batch_size)
    model = ClassifierModel(model_fn, input_shape, num_classes, optimizer=optimizer)
    graph = build_training_graph(model, plan, seed=0, source=source, learning_rate=0.01,
                                 sync_bn=sync_bn, precision=precision, accumulate=accumulate)
    options = trace_options()  # with the partition graphs TensorFlow placed
    config = tf1.ConfigProto()
    config.CopyFrom(plan.config)
    # Placement happens before grappler; without its rewrites (fused kernels,
    # pruning) the partitions name the graph's own ops, which FLOPs are keyed by.
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    # Each tower's count of real examples, from the graph itself.
    fetches = {'train_op': graph.train_op, 'examples': [t.count for t in graph.towers]}
    with open_session(graph, config, target=target) as sess, \
            run_steps(sess, source, fetches, 0, 1, run_options=lambda step: options) as steps:
        values = steps.run_one()
    examples, metadata = values['examples'], values['run_metadata']
    with graph.graph.as_default():
        variables = tf1.global_variables()
    placed = _placement(metadata)
    low = _ops_in(metadata, precision.dtype) if precision.mixed else {}
    transfers = _transfers(metadata)
    transfers['bytes_between_tasks'] = sum(t['bytes'] for t in transfers['transfers']
                                           if _task(t['from']) != _task(t['to']))
    devices = _devices(graph, placed, variables,
                       op_flops(model, plan, batch_size, num_classes, sync_bn, precision),
                       [int(n) for n in examples])
    peaks = {short_device(d): size for d, size in step_peaks(metadata).items()}
    for device, entry in devices.items():
        entry['low_precision_ops'] = low.get(device, 0)
        entry['peak_bytes'] = peaks.get(device, 0)
    return {'batch_size': batch_size, 'precision': precision.name,
            'compute_dtype': precision.dtype.name, 'devices': devices,
            'averaging': sorted({d for n, d in placed.items() if n.startswith(AVERAGE_SCOPES)}),
            # From the partitions TensorFlow ran: a dynamic loss scale's applies sit in a
            # tf.cond's branch function, which the graph's own op list does not show.
            'apply': sorted({short_device(node.device)
                             for partition in metadata.partition_graphs
                             for node in partition.node if _APPLY_TYPE.match(node.op)}),
            **transfers}


def zeros_input(input_mode, input_shape, num_classes, batch_size):
    """An InputSource of the mode over one batch of zeros: where the input comes from
    matters to a graph's placement, not what it holds (the dataset input's are bytes,
    as records and image files give)."""
    if INPUT_MODES[input_mode].tf_data:
        return DatasetInput(np.zeros([batch_size] + list(input_shape), np.uint8),
                            np.zeros([batch_size], np.int64), num_classes, batch_size)
    images = np.zeros([batch_size] + list(input_shape), np.float32)
    zeros = data.DataSet(images, np.zeros([batch_size], np.int64), num_classes=num_classes)
    return make_input(input_mode, zeros, EpochSampler(batch_size, batch_size), batch_size,
                      num_classes)


def _task(device):
    """'/job:worker/task:1/cpu:0' -> '/job:worker/task:1'; '' in one process."""
    return device.rsplit('/', 1)[0] if device.startswith('/job:') else ''


def _placement(metadata):
    """op name -> short device, for every op of the step (not the transfers)."""
    placed = {}
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if node.op not in _TRANSFER:
                placed[node.name] = short_device(node.device)
    return placed


def _ops_in(metadata, dtype):
    """short device -> how many of the step's ops computed in dtype (their T)."""
    counts = collections.Counter()
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if 'T' in node.attr and node.attr['T'].type == dtype.as_datatype_enum \
                    and node.op not in _TRANSFER:
                counts[short_device(node.device)] += 1
    return counts


def inference_counts(model_fn, input_shape):
    """(trainable parameters, multiply-accumulates of the convolutions and matmuls, all
    FLOPs) of one image's forward pass, from one graph; the FLOPs by TensorFlow's profiler,
    the MACs the figure papers publish."""
    graph = tf.Graph()
    with graph.as_default():
        model_fn(tf1.placeholder(tf.float32, [1] + list(input_shape)), False)
        parameters = sum(v.shape.num_elements() for v in tf1.trainable_variables())
    options = tf1.profiler.ProfileOptionBuilder.float_operation()
    options['output'] = 'none'
    types = {op.name: op.type for op in graph.get_operations()}
    macs = flops = 0
    stack = list(_profile(graph, options).children)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        flops += node.float_ops
        if types.get(node.name) in ('Conv2D', 'MatMul'):
            macs += node.float_ops // 2
    return parameters, macs, flops


def _profile(graph, options):
    """TensorFlow's profiler on the graph, without the note it writes to stderr for ops whose
    shapes are not static (the fed placeholders', counted as they are): TensorFlow's words to
    its developers, not a user's business."""
    with contextlib.redirect_stderr(io.StringIO()):
        return tf1.profiler.profile(graph, options=options)


def op_flops(model, plan, batch_size, num_classes, sync_bn=False, precision=None):
    """op name -> FLOPs, by TensorFlow's profiler.

    Its FLOP counts need static shapes, which a fed batch does not have; the
    same graph over a synthetic input has them (each tower's slice a fixed
    [n_i, H, W, C]), and names its ops alike.
    """
    graph = build_training_graph(model, plan, seed=0,
                                 source=SyntheticInput(batch_size, num_classes),
                                 learning_rate=0.01, sync_bn=sync_bn, precision=precision)
    options = tf1.profiler.ProfileOptionBuilder.float_operation()
    options['output'] = 'none'
    root = _profile(graph.graph, options)
    flops, stack = {}, list(root.children)
    while stack:
        node = stack.pop()
        if node.float_ops:
            flops[node.name] = node.float_ops
        stack.extend(node.children)
    return flops


def _devices(graph, placed, variables, flops, examples):
    """Per device: tower, slice, ops, FLOPs, variables held."""
    devices = collections.OrderedDict()

    def entry(device):
        return devices.setdefault(device, {'tower': None, 'examples': 0, 'ops': 0, 'flops': 0,
                                           'variables': 0, 'variable_bytes': 0})
    for device in sorted(set(placed.values())):
        entry(device)
    for name, device in placed.items():
        entry(device)['ops'] += 1
        entry(device)['flops'] += int(flops.get(name, 0))
    for i, tower in enumerate(graph.towers):
        device = placed.get(tower.loss.op.name, short_device(tower.device))
        entry(device).update(tower='tower_%d' % i, examples=examples[i])
    for var in variables:
        holder = entry(placed.get(var.op.name) or _requested(var))
        holder['variables'] += 1
        holder['variable_bytes'] += var.shape.num_elements() * var.dtype.base_dtype.size
    return devices


def _requested(var):
    return short_device(tf.DeviceSpec.from_string(var.device).to_string()) \
        if var.device else '/cpu:0'


def _transfers(metadata):
    """Bytes each _Send put on the wire, by device pair and kind."""
    sizes = {}
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            for slot in node.output:
                if not slot.tensor_description.dtype:
                    continue  # not described (a remote task's step stats may leave it out)
                shape = tf.TensorShape(slot.tensor_description.shape)
                dtype = tf.as_dtype(slot.tensor_description.dtype)
                if shape.is_fully_defined() and dtype != tf.resource:
                    sizes[(node.node_name, slot.slot)] = shape.num_elements() * dtype.size
    pairs = {}
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if node.op not in ('_Send', '_HostSend'):
                continue
            producer, _, slot = node.input[0].partition(':')
            size = sizes.get((producer, int(slot or 0)))
            if size is None:
                continue  # a resource handle or a control edge: no data
            key = (short_device(node.attr['send_device'].s.decode()),
                   short_device(node.attr['recv_device'].s.decode()))
            entry = pairs.setdefault(key, {'from': key[0], 'to': key[1], 'bytes': 0,
                                           'kinds': collections.Counter()})
            entry['bytes'] += size
            entry['kinds'][_kind(producer)] += size
    transfers = [dict(e, kinds=dict(e['kinds'])) for _, e in sorted(pairs.items())]
    return {'transfers': transfers, 'bytes_per_step': sum(t['bytes'] for t in transfers)}


def _kind(producer):
    if producer.endswith('ReadVariableOp') or '/read' in producer:
        return 'variables'
    if '/gradients/' in producer or producer.startswith(('gradients/', 'all_reduce')):
        return 'gradients'
    if producer.startswith(('split_batch', 'synthetic_')):
        return 'input'
    return 'other'


def report_lines(report, title):
    """The human-readable report."""
    lines = [title]
    for device, entry in report['devices'].items():
        what = ('%s, %d of %d examples' % (entry['tower'], entry['examples'],
                                           report['batch_size'])
                if entry['tower'] else 'no tower')
        roles = [r for r, devices in (('gradient averaging', report['averaging']),
                                      ('apply', report['apply'])) if device in devices]
        low = (' (%d in %s)' % (entry['low_precision_ops'], report['compute_dtype'])
               if entry.get('low_precision_ops') else '')
        peak = ('; step peak %s' % bytes_text(entry['peak_bytes'])
                if entry.get('peak_bytes') else '')
        lines.append('%-8s %s; %d ops%s, %s; %d variables, %s%s%s' % (
            device, what, entry['ops'], low, flops_text(entry['flops']), entry['variables'],
            bytes_text(entry['variable_bytes']), peak,
            '; ' + ', '.join(roles) if roles else ''))
    lines.append('between devices per step: %s' % bytes_text(report['bytes_per_step']))
    if any(device.startswith('/job:') for device in report['devices']):
        lines.append('between tasks per step (the network): %s'
                     % bytes_text(report['bytes_between_tasks']))
    for transfer in report['transfers']:
        kinds = ', '.join('%s %s' % (k, bytes_text(b)) for k, b in
                          sorted(transfer['kinds'].items(), key=lambda kv: -kv[1]))
        lines.append('  %s -> %s: %s (%s)' % (transfer['from'], transfer['to'],
                                              bytes_text(transfer['bytes']), kinds))
    return lines


def bytes_text(size):
    for unit, scale in (('MB', 1e6), ('kB', 1e3)):
        if size >= scale:
            return '%.2f %s' % (size / scale, unit)
    return '%d B' % size


def flops_text(flops):
    for unit, scale in (('GFLOP', 1e9), ('MFLOP', 1e6), ('kFLOP', 1e3)):
        if flops >= scale:
            return '%.2f %s' % (flops / scale, unit)
    return '%d FLOP' % flops
