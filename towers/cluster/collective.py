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

from towers.allreduce import BUFFER_BYTES, sum_packed
from towers.cluster.emulate import parse_size
from towers.deviceplan import device_kind
from towers.errors import SettingError
from towers.gradients import average_gradients, process_gradients, tower_update_ops
from towers.names import AUTO_BUCKETS
from towers.variables import VariableStrategy

tf1 = tf.compat.v1

# The workers' groups, one per device type (a group's members are all CPUs or all GPUs);
# the towers of one process use TowerContext.GROUP_KEY.
GROUP_KEYS = {'CPU': 100, 'GPU': 101}
FINGERPRINT_KEYS = (1, 2)  # reserved: the workers' first collectives, whatever their graphs
FIRST_KEY = 10  # the others, in the order they are built


def bucket_bytes(setting, sizes):
    """The all-reduce's bucket size in bytes for --all-reduce-bucket `setting` ('auto', a
    size such as 256kB, or 0) over gradients of `sizes` bytes: 'auto' is an AUTO_BUCKETS-th
    of them, so that every model is cut into about as many buckets."""
    if str(setting).strip() == 'auto':
        return max(1, -(-int(sum(sizes)) // AUTO_BUCKETS))
    try:
        return int(parse_size(setting, 'all_reduce_bucket', zero=True))
    except SettingError:
        raise SettingError('{all_reduce_bucket} is auto, a positive size such as 256kB or 4MB, '
                           'or 0, not %r', setting) from None


def bucket_order(count, gradients):
    """What the overlapped all-reduce's buckets carry, in order: the batch size first, then
    the gradients last layer first (the order the backward pass makes them); `towers plan`
    cuts its buckets from the same order."""
    return [count] + list(gradients)[::-1]


class Collectives:
    """All-reduces over the workers, with instance keys in the order they are made.

    On GPUs they ask TensorFlow for NCCL (communication_hint='nccl') unless told
    not to; on CPUs it picks its ring.

    Args:
      num_workers: the group's size.
      timeout: seconds a collective may wait for the others (a backstop: each
        step also has its own timeout).
      nccl: NCCL between the workers' GPUs; False where workers share a GPU, between
        which NCCL cannot all-reduce (TensorFlow's ring then carries the GPUs' sums).
    """

    def __init__(self, num_workers, timeout, nccl=True):
        self.num_workers, self.timeout, self._next = num_workers, timeout, FIRST_KEY
        self.nccl = nccl

    def all_reduce(self, tensor, merge='Add', key=None, kind='CPU'):
        """The reduction of tensor over the workers' devices of `kind` ('CPU' or 'GPU'; key:
        a reserved instance key, or the next)."""
        if key is None:
            key, self._next = self._next, self._next + 1
        return collective_ops.all_reduce(tensor, self.num_workers, GROUP_KEYS[kind], key, merge,
                                         'Id', timeout=self.timeout,
                                         communication_hint='nccl' if kind == 'GPU' and self.nccl
                                         else 'auto')

    def sum_packed(self, tensors, kind='CPU', max_bytes=BUFFER_BYTES):
        """The sum over the workers of each tensor, packed into buffers of one dtype and at
        most max_bytes, in order."""
        return sum_packed(tensors, lambda flat: self.all_reduce(flat, kind=kind), max_bytes)


class AcrossWorkers(VariableStrategy):
    """This worker's copy of the variables, its towers' average, the workers' all-reduce.

    The gradients meet in buckets of about a bucket's bytes, in reverse order of the
    variables (the order the backward pass makes their gradients, last layer first),
    each all-reduced as soon as its own gradients are ready: the network carries the
    last layers' sums while the first layers' gradients are still being computed. The
    buckets (and so the instance keys) are cut from the variables' sizes alone, the same
    on every worker. With 0 every gradient waits for the whole backward pass and they
    meet in buffers of up to 32 MB (BUFFER_BYTES), in order, as tf_cnn_benchmarks packs
    them.

    Args:
      plan: this worker's DevicePlan: its copy of the variables on its first GPU
        (or its CPU), where the all-reduce runs too.
      collectives: the workers' Collectives.
      is_chief: whether this worker's values are the ones broadcast to all.
      bucket: --all-reduce-bucket: 'auto', a size ('256kB'), or '0' for one pass after the
        backward (see bucket_bytes).
    """

    name = 'collective'

    def __init__(self, plan, collectives, is_chief, bucket='0'):
        super().__init__(plan)
        self.collectives, self.is_chief = collectives, is_chief
        self.bucket = bucket
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
            weighted = [tf.convert_to_tensor(g) * count for g, _ in present]
            size = bucket_bytes(self.bucket, [g.shape.num_elements() * g.dtype.size
                                              for g in weighted])
            if size:  # last layer first; the batch size rides in the first
                summed = self.collectives.sum_packed(
                    bucket_order(tf.reshape(count, [1]), weighted), self.kind, size)
                total, summed = summed[0][0], summed[:0:-1]
            else:
                summed = self.collectives.sum_packed(weighted + [tf.reshape(count, [1])],
                                                     self.kind)
                total, summed = summed[-1][0], summed[:-1]
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
