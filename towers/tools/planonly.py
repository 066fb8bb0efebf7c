"""`towers explain --plan-only`: where every op of a training step would run, from the graph.

No Session runs, so the devices need not exist: TensorFlow builds a graph on
/gpu:3 or /job:worker/task:1/device:GPU:0 as readily on a CPU-only build as on
a GPU machine. What is read is what the device plan asked of each op (its own
device, or that of the op it is colocated with, as a variable's reads are),
before TensorFlow's placer; what the placer makes of it on a real machine is
`towers explain` without --plan-only (one real step, its partition graphs).

One graph per training process: one for a single process or in-graph
replication (the chief's graph holds every task's towers), one per worker for
the between-graph modes (collective, parameter-server), which build alike.
"""
import re

import tensorflow as tf

from towers.cluster import modes
from towers.cluster.spec import Cluster
from towers.deviceplan import canonical_device, planned_device, uses_variable
from towers.graph import build_training_graph
from towers.model import ClassifierModel
from towers.names import CLUSTER_MODES
from towers.tools.explain import zeros_input
from towers.tower import VARIABLE_OPS

tf1 = tf.compat.v1

_TOWER = re.compile(r'^tower_(\d+)/')
# The op types that combine the towers' or the workers' gradients.
ALL_REDUCE_TYPES = ('NcclAllReduce', 'CollectiveReduce', 'CollectiveReduceV2')
_STAGING_TYPES = {'Stage': 'put', 'Unstage': 'get'}


def cluster_runs(mode, workers, ps=0, towers_per_task=None, gpus_per_worker=0):
    """The ClusterRun of each task that builds a training graph, on made-up addresses.

    Nothing serves: a ClusterRun only plans until its session starts.
    """
    jobs = {'worker': ['planned-worker-%d:2222' % i for i in range(workers)]}
    if ps:
        jobs['ps'] = ['planned-ps-%d:2222' % i for i in range(ps)]
    builders = 1 if CLUSTER_MODES[mode].one_graph else workers  # in-graph: the chief's alone
    return [modes.MODES[mode](Cluster(jobs, 'worker', k), towers_per_task,
                              num_gpus=gpus_per_worker) for k in range(builders)]


def planned_step(model_fn, input_shape, num_classes, runs, batch_size=100, input_mode='feed',
                 optimizer='sgd', sync_bn=False, precision=None, accumulate=1):
    """Build each (plan, strategy) training graph and say where its ops would run.

    accumulate: each tower's micro-batches (train's --accumulate), in the graph built.

    Args:
      runs: [(DevicePlan, VariableStrategy or None)], one per training process.
    Returns:
      dict: devices {device: {ops, towers {tower_i: ops}, variables}},
      off_device [ops of a tower planned elsewhere than its tower's device],
      all_reduce {op type: {count, devices, hints}},
      staging {device: {put, get, images (the dtype they cross in)}},
      towers [each graph's tower devices], convolutions {data format: forward convs}.
    """
    report = {'devices': {}, 'off_device': [], 'all_reduce': {}, 'staging': {}, 'towers': [],
              'convolutions': {}}
    model = ClassifierModel(model_fn, input_shape, num_classes, optimizer=optimizer)
    for plan, strategy in runs:
        source = zeros_input(input_mode, input_shape, num_classes, batch_size)
        built = build_training_graph(model, plan, seed=0, source=source, learning_rate=0.01,
                                     strategy=strategy, sync_bn=sync_bn, precision=precision,
                                     accumulate=accumulate)
        report['towers'].append(list(plan.towers))
        _read(built.graph, plan, report)
    return report


def _read(graph, plan, report):
    """Add one graph's ops to the report, each where it is planned."""
    tower_devices = [canonical_device(d) for d in plan.towers]
    for op in graph.get_operations():
        device = planned_device(op)
        entry = report['devices'].setdefault(device, {'ops': 0, 'towers': {}, 'variables': 0})
        entry['ops'] += 1
        entry['variables'] += op.type in VARIABLE_OPS
        tower = _TOWER.match(op.name)
        if tower:
            name = 'tower_%s' % tower.group(1)
            entry['towers'][name] = entry['towers'].get(name, 0) + 1
            # A variable's reads stay where the variable is (TensorFlow's rule); the
            # value then crosses to the tower.
            if device != tower_devices[int(tower.group(1))] and not uses_variable(op):
                report['off_device'].append('%s on %s' % (op.name, device or 'no device'))
        if op.type in ALL_REDUCE_TYPES:
            found = report['all_reduce'].setdefault(op.type, {'count': 0, 'devices': [],
                                                              'hints': []})
            found['count'] += 1
            found['devices'] = sorted(set(found['devices']) | {device})
            hint = op.get_attr('communication_hint').decode() if op.type != 'NcclAllReduce' \
                else 'nccl'
            found['hints'] = sorted(set(found['hints']) | {hint})
        if op.type == 'Conv2D':
            layout = op.get_attr('data_format').decode()
            report['convolutions'][layout] = report['convolutions'].get(layout, 0) + 1
        if op.type in _STAGING_TYPES:
            staged = report['staging'].setdefault(device, {'put': 0, 'get': 0})
            staged[_STAGING_TYPES[op.type]] += 1
            if op.type == 'Stage':  # what crosses to the device: its images' dtype
                staged['images'] = op.inputs[0].dtype.name


def report_lines(report, title):
    """The human-readable plan."""
    lines = [title, 'plan only: nothing ran; each op where the plan asks for it, before '
                    "TensorFlow's placer (the devices need not exist here)"]
    for device in sorted(report['devices']):
        entry = report['devices'][device]
        towers = ', '.join('%s %d' % item for item in sorted(entry['towers'].items()))
        lines.append('%-34s %5d ops%s%s' % (device or '(no device: the placer chooses)',
                                            entry['ops'], '; ' + towers if towers else '',
                                            '; %d variables' % entry['variables']
                                            if entry['variables'] else ''))
    for kind, found in sorted(report['all_reduce'].items()):
        lines.append('all-reduce: %s x%d on %s (communication hint %s)' % (
            kind, found['count'], ', '.join(found['devices']), ', '.join(found['hints'])))
    for device, staged in sorted(report['staging'].items()):
        lines.append('staging on %s: %d put, %d get, images cross as %s'
                     % (device, staged['put'], staged['get'], staged['images']))
    if report['convolutions']:
        lines.append('convolutions: %s' % ', '.join(
            '%d %s' % (count, layout) for layout, count in sorted(report['convolutions'].items())))
    if report['off_device']:
        lines.append('tower ops planned off their tower: %d, e.g. %s' % (
            len(report['off_device']), report['off_device'][0]))
    else:
        lines.append("every tower's ops are planned on its tower's device")
    return lines
