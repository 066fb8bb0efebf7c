"""Parameter-server mode: what a worker's step moves to and from the ps, and the guard on
SyncReplicasOptimizer's shared token queue."""
import collections

import pytest
import tensorflow as tf

from towers import models
from towers.cluster import modes, syncreplicas
from towers.cluster.spec import Cluster
from towers.deviceplan import planned_device
from towers.graph import build_training_graph
from towers.inputs import SyntheticInput
from towers.model import ClassifierModel

tf1 = tf.compat.v1


def _between_jobs(graph, fetches):
    """{(from job, to job): bytes} a step of `fetches` moves between jobs, by the planned
    devices: each tensor once to each device of another job that uses it, as TensorFlow's
    Send/Recv pairs move it."""
    names = [f.name.split(':')[0] for f in fetches]
    step = tf1.graph_util.extract_sub_graph(graph.as_graph_def(), names)
    moved, sent = collections.Counter(), set()
    for node in step.node:
        op = graph.get_operation_by_name(node.name)
        to = planned_device(op)
        for tensor in op.inputs:
            source = planned_device(tensor.op)
            jobs = tuple(tf.DeviceSpec.from_string(d).job for d in (source, to))
            if tensor.dtype != tf.resource and jobs[0] != jobs[1] and (tensor, to) not in sent:
                sent.add((tensor, to))
                moved[jobs] += tensor.shape.num_elements() * tensor.dtype.size
    return dict(moved)


@pytest.mark.parametrize('model', ['small_convnet', 'resnet20'])
def test_a_worker_reads_each_variable_once_and_pushes_each_gradient_once(model):
    """S each way a step, whatever the worker's towers: its towers read through its CPU and
    are summed on the worker, not on the ps (which would send each tower's gradient there
    and the sum back before the push: 3S each way with two towers)."""
    cluster = Cluster({'worker': ('a:1', 'b:1'), 'ps': ('c:1',)}, 'worker', 1)
    run = modes.ParameterServer(cluster, towers_per_task=2)
    model = ClassifierModel(models.build_model(model, (28, 28, 1), 10), (28, 28, 1), 10,
                            optimizer='momentum')
    built = build_training_graph(model, run.plan, source=SyntheticInput(16, 10),
                                 strategy=run.strategy)
    size = sum(v.shape.num_elements() * 4
               for v in built.graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES))
    moved = _between_jobs(built.graph, [built.train_op, built.loss])
    assert set(moved) == {('ps', 'worker'), ('worker', 'ps')}
    # Beyond the gradients: the step's results (a few float64), the global step, the token.
    assert size <= moved['worker', 'ps'] <= size + 1024
    assert size <= moved['ps', 'worker'] <= size + 1024


def test_a_token_another_worker_left_behind_stops_the_step():
    """Tokens as the chief's queue runner hands them out: N (here 2) after each update,
    each the global step after it. A worker whose next take finds the other's token, with
    no update since its own, fails there instead of pushing a second gradient into the
    same update."""
    with tf.Graph().as_default():
        global_step = tf1.train.get_or_create_global_step()
        tokens = tf1.FIFOQueue(4, tf.int64, shapes=[])
        update = tf.group(tf1.assign_add(global_step, 1),
                          name='update')  # what the chief's update does to the step
        with tf.control_dependencies([update]):
            release = tokens.enqueue_many(tf.fill([2], tf.identity(global_step)))
        step = syncreplicas._own_token(tokens.dequeue().op, global_step, '/cpu:0')
        with tf1.Session() as sess:
            sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
            sess.run(release)  # update 1: a token for each of the two workers
            sess.run(step)  # this worker's
            sess.run(release)  # update 2
            sess.run(step)  # this worker's again: fine
            # The other worker never took its token of update 2; no update since.
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=syncreplicas.WITHOUT_A_WORKER):
                sess.run(step)
