"""The placement audit: a tower op TensorFlow moved off its planned device is caught."""
import types

import pytest
import tensorflow as tf

from towers import models
from towers.callbacks import PlacementAudit, default_callbacks
from towers.callbacks.placement import moved_ops
from towers.config import TrainConfig
from towers.deviceplan import DevicePlan, planned_device
from towers.errors import TowersError
from towers.graph import build_training_graph
from towers.inputs import SyntheticInput
from towers.model import ClassifierModel
from towers.session import open_session, placement_options, run_steps

tf1 = tf.compat.v1


def _first_step(plan):
    """(TrainGraph, RunMetadata) of one step of small_convnet on the plan, run as the
    audit's: its partition graphs, no trace."""
    model = ClassifierModel(models.build_model('small_convnet', (28, 28, 1), 10), (28, 28, 1),
                            10, optimizer='sgd')
    graph = build_training_graph(model, plan, seed=0, source=SyntheticInput(8, 10))
    with open_session(graph, plan.config) as sess, \
            run_steps(sess, graph.source, {'train_op': graph.train_op}, 0, 1,
                      run_options=lambda step: placement_options()) as steps:
        return graph, steps.run_one()['run_metadata']


def test_towers_that_ran_where_planned_pass():
    config = tf1.ConfigProto(allow_soft_placement=True, device_count={'CPU': 2})
    graph, metadata = _first_step(DevicePlan(['/cpu:0', '/cpu:1'], config=config))
    assert moved_ops(graph.graph, metadata) == []


def _moved_to_the_cpu():
    # Planned on a GPU this machine does not have: soft placement runs it on the CPU.
    config = tf1.ConfigProto(allow_soft_placement=True)
    return _first_step(DevicePlan(['/gpu:0'], config=config))


def test_soft_placement_off_the_planned_gpu_is_refused_in_one_line_or_reported_when_allowed():
    graph, metadata = _moved_to_the_cpu()
    assert not metadata.step_stats.dev_stats  # untraced: the partition graphs say it all
    moved = moved_ops(graph.graph, metadata)
    assert moved and all(planned == '/device:GPU:0' and ran.endswith('/device:CPU:0')
                         for _, planned, ran in moved)
    # Grappler fuses conv1's Conv2D, BiasAdd and Relu into one op named for the last.
    assert any(name == 'tower_0/conv1/Relu' for name, _, _ in moved)
    lines = []
    trainer = types.SimpleNamespace(step=0, graph=graph, log=lines.append)
    audit = PlacementAudit()
    audit.before_train(trainer)
    wanted = audit.wants_trace(trainer)  # the first step: its partition graphs, no trace
    assert wanted.output_partition_graphs
    assert wanted.trace_level == tf1.RunOptions.NO_TRACE
    trainer.step = 1
    assert not audit.wants_trace(trainer)  # and no other
    with pytest.raises(TowersError, match=r'^\d+ tower op\(s\) ran off their planned device, '
                                          r'e\.g\. tower_0/\S+ on \S+CPU:0 instead of '
                                          r'/device:GPU:0 .*give allow_soft_placement'):
        audit.after_step(trainer, {'run_metadata': metadata})
    allowed = PlacementAudit(allow_soft_placement=True)
    allowed.before_train(types.SimpleNamespace(step=0))
    allowed.after_step(trainer, {'run_metadata': metadata})
    assert len(lines) == 1 and lines[0].startswith('soft placement: %d tower op(s) ran off'
                                                   % len(moved))


def test_every_run_audits_its_first_step():
    audits = [c for c in default_callbacks(TrainConfig()) if isinstance(c, PlacementAudit)]
    assert len(audits) == 1 and not audits[0].allow_soft_placement
    allowed = default_callbacks(TrainConfig(allow_soft_placement=True))
    assert [c.allow_soft_placement for c in allowed if isinstance(c, PlacementAudit)] == [True]


def test_an_op_that_uses_a_variable_is_planned_where_the_variable_is():
    """A batch norm's moving-average update is built under its tower's device scope; the
    placer puts it with the variable (here a ps task's), and so does the plan."""
    with tf.Graph().as_default():
        with tf1.device('/job:ps/task:0/device:CPU:0'):
            moving = tf1.get_variable('moving', [3], use_resource=True)
        with tf1.device('/job:worker/task:0/device:CPU:0'):
            update = tf1.assign(moving, moving * 0.5)
            decayed = moving * 0.5
    assert planned_device(update.op) == '/job:ps/task:0/device:CPU:0'
    assert planned_device(decayed.op) == '/job:worker/task:0/device:CPU:0'
