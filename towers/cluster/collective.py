"""Collective mode: every worker builds its own towers; the workers meet in an all-reduce.

Between-graph data parallelism on TensorFlow's collective ops, without ps
tasks: each worker holds a copy of the variables on its own CPU, reads a
disjoint share of every global batch, averages its own towers' gradients
(weighted by share, as in one process), then all-reduces the sum of
b_k * g_k over the workers, packed into few buffers, and divides by the
global batch B = sum b_k: exactly the one-device gradient of the whole batch.
Every worker applies that same update, so the copies stay equal. The chief's
initial values (or its restored checkpoint) are broadcast to all before the
first step; only the chief saves checkpoints and writes events.

Collective instance keys are handed out in the order the graph is built,
which is the same on every worker, so the k-th collective of each meets the
k-th of the others.
"""
import tensorflow as tf
from tensorflow.python.ops import collective_ops

from towers.allreduce import sum_packed
from towers.deviceplan import device_kind
from towers.gradients import average_gradients, process_gradients
from towers.tower import tower_update_ops
from towers.variables import VariableStrategy

tf1 = tf.compat.v1

# The workers' groups, one per device type (a group's members are all CPUs or all GPUs);
# the towers of one process use TowerContext.GROUP_KEY.
GROUP_KEYS = {'CPU': 100, 'GPU': 101}
FINGERPRINT_KEYS = (1, 2)  # reserved: the workers' first collectives, whatever their graphs
FIRST_KEY = 10  # the others, in the order they are built


class Collectives:
    """All-reduces over the workers, with instance keys in the order they are made.

    On GPUs they ask TensorFlow for NCCL (communication_hint='nccl'); on CPUs
    it picks its ring.

    Args:
      num_workers: the group's size.
      timeout: seconds a collective may wait for the others (a backstop: each
        step also has its own timeout).
    """

    def __init__(self, num_workers, timeout):
        self.num_workers, self.timeout, self._next = num_workers, timeout, FIRST_KEY

    def all_reduce(self, tensor, merge='Add', key=None, kind='CPU'):
        """The reduction of tensor over the workers' devices of `kind` ('CPU' or 'GPU'; key:
        a reserved instance key, or the next)."""
        if key is None:
            key, self._next = self._next, self._next + 1
        return collective_ops.all_reduce(tensor, self.num_workers, GROUP_KEYS[kind], key, merge,
                                         'Id', timeout=self.timeout,
                                         communication_hint='nccl' if kind == 'GPU' else 'auto')

    def sum_packed(self, tensors, kind='CPU'):
        """The sum over the workers of each tensor, packed into buffers of one dtype."""
        return sum_packed(tensors, lambda flat: self.all_reduce(flat, kind=kind))


class AcrossWorkers(VariableStrategy):
    """This worker's copy of the variables, its towers' average, the workers' all-reduce.

    Args:
      plan: this worker's DevicePlan: its copy of the variables on its first GPU
        (or its CPU), where the all-reduce runs too.
      collectives: the workers' Collectives.
      is_chief: whether this worker's values are the ones broadcast to all.
    """

    name = 'collective'

    def __init__(self, plan, collectives, is_chief):
        super().__init__(plan)
        self.collectives, self.is_chief = collectives, is_chief
        # Everything the workers sum meets where the copy is: GPU tensors on GPUs.
        self.device, self.kind = plan.variables, device_kind([plan.variables])

    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        """Local average -> sum of b_k * g_k over the workers / B -> decay, processors -> apply."""
        local = average_gradients([t.grads_and_vars for t in towers],
                                  weights=[t.weight for t in towers])
        with tf1.name_scope('all_reduce'), tf.device(self.device):
            count = tf.cast(tf.add_n([t.count for t in towers]), tf.float32)
            present = [(g, v) for g, v in local if g is not None]
            summed = self.collectives.sum_packed(
                [tf.convert_to_tensor(g) * count for g, _ in present] + [tf.reshape(count, [1])],
                self.kind)
            total = summed[-1][0]
            grads = [(g / total, v) for g, (_, v) in zip(summed, present)]
        grads = process_gradients(grads, weight_decay, processors)
        apply_op = optimizers[0].apply_gradients(grads, global_step=global_step)
        return tf.group(apply_op, *tower_update_ops(towers[0]), name='train_op'), grads

    def step_results(self, loss, metrics, batch):
        """The global batch's loss, metrics and size, from every worker's share."""
        # A few float64 scalars: on the host's CPUs, with the votes and the fingerprint.
        with tf1.name_scope('all_reduce_results'), tf.device(self.plan.host):
            count = tf.cast(batch, tf.float64)
            names = sorted(metrics)
            local = tf.stack([tf.cast(loss, tf.float64) * count]
                             + [tf.cast(metrics[n], tf.float64) * count for n in names]
                             + [count])
            total = self.collectives.all_reduce(local)
            size = tf.maximum(total[-1], 1.0)
            loss = tf.cast(total[0] / size, tf.float32, name='loss')
            metrics = {n: tf.identity(total[1 + i] / size, name=n) for i, n in enumerate(names)}
            return loss, metrics, tf.cast(total[-1], tf.int32, name='batch')

    def saved_variables(self):
        return {v.op.name: v for v in tf1.global_variables()}

    def sync_op(self):
        """Every worker takes the chief's values: an all-reduce of the chief's, zeros elsewhere.

        Each variable meets the others on its own kind of device: the model's on the
        copy's (GPUs), the step counter and the like on the host's CPUs.
        """
        assigns = []
        with tf1.name_scope('broadcast_chief'):
            for kind in ('CPU', 'GPU'):
                variables = sorted((v for v in tf1.global_variables()
                                    if device_kind([v.device or self.plan.host]) == kind),
                                   key=lambda v: (v.dtype.name, v.op.name))
                if not variables:
                    continue
                with tf.device(self.device if kind == self.kind else self.plan.host):
                    mine = [v.read_value() if self.is_chief
                            else tf.zeros(v.shape, v.dtype.base_dtype) for v in variables]
                    values = self.collectives.sum_packed(mine, kind)
                assigns += [tf1.assign(v, value) for v, value in zip(variables, values)]
        return tf.group(*assigns, name='sync_replicas')
