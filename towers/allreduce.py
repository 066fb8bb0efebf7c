"""All-reducing the towers' gradients in one process: --variable-update replicated.

Every tower holds a copy of the variables, so every tower needs the same
update: the weighted sum of all towers' gradients, sum_i w_i * g_i (w_i the
tower's share of the batch), which is the one-device gradient of the whole
batch. Each tower weights its own gradients, then they are summed over the
towers in one of three ways:

  nccl   where the towers are GPUs: NVIDIA's NCCL (nccl_ops.all_sum), as
         tf_cnn_benchmarks and tensorpack replicate on GPUs: no device gathers
         N-1 copies of everything
  host   where the towers are CPUs of one process, which share one memory: each
         variable's sum is formed once, on a device chosen by bytes, and every
         tower reads it (a "copy" between virtual CPUs moves no bytes); measured
         faster here than a ring (mnist_convnet on 2 towers, 2-core AMD EPYC:
         2113 images/sec against 1945 for a ring per gradient, 1852 packed)
  ring   TensorFlow's collective ring all-reduce over the towers' devices (the
         collective ops --sync-bn uses), what CPUs on separate hosts would run

nccl and ring are packed as tf_cnn_benchmarks packs them: each tower's
gradients flattened and concatenated, per dtype, into buffers of at most
BUFFER_BYTES, one all-reduce per buffer, then split back. All three hand every
tower bit-identical sums (each is reduced once and the result copied), so the
copies stay equal step after step.
"""
import tensorflow as tf
from tensorflow.python.ops import collective_ops, nccl_ops

from towers.gradients import weighted as scaled
from towers.spread import LeastLoaded

tf1 = tf.compat.v1

BUFFER_BYTES = 32 << 20  # gradients are packed into all-reduce buffers of at most this
GROUP_KEY = 2  # the towers' gradient all-reduce (sync-bn's collectives use group 1)
IMPLEMENTATIONS = ('nccl', 'host', 'ring')


def packs(tensors, max_bytes=BUFFER_BYTES):
    """[[index, ...]]: consecutive tensors of one dtype, at most max_bytes a pack.

    A tensor larger than max_bytes is a pack of its own.
    """
    return byte_packs([(t.dtype, t.shape.num_elements() * t.dtype.size) for t in tensors],
                      max_bytes)


def byte_packs(kinds_and_sizes, max_bytes):
    """packs() of [(dtype, bytes)]: what towers plan cuts from a model's sizes alone."""
    groups, current, size = [], [], 0
    for i, (kind, nbytes) in enumerate(kinds_and_sizes):
        if current and (kind != kinds_and_sizes[current[0]][0] or size >= max_bytes):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        groups.append(current)
    return groups


def sum_packed(tensors, reduce_pack, max_bytes=BUFFER_BYTES):
    """Each of `tensors` reduced, through reduce_pack(flat buffer) -> reduced buffer per pack
    of at most max_bytes (see packs)."""
    out = [None] * len(tensors)
    for indices in packs(tensors, max_bytes):
        for i, piece in _unpacked(reduce_pack(_packed(tensors, indices)), tensors, indices):
            out[i] = piece
    return out


def _packed(tensors, indices):
    """One flat buffer of tensors[i] for i in indices."""
    return tf.concat([tf.reshape(tensors[i], [-1]) for i in indices], axis=0)


def _unpacked(buffer, tensors, indices):
    """[(i, buffer's piece shaped as tensors[i])], the inverse of _packed."""
    pieces = tf.split(buffer, [tensors[i].shape.num_elements() for i in indices])
    return [(i, tf.reshape(piece, tensors[i].shape)) for i, piece in zip(indices, pieces)]


class TowerAllReduce:
    """The towers' weighted gradient sum, all-reduced, one list per tower.

    Args:
      devices: the towers' devices, one per tower.
      implementation: 'nccl', 'host' or 'ring'.
    """

    def __init__(self, devices, implementation):
        if implementation not in IMPLEMENTATIONS:
            raise ValueError('all-reduce %r: use one of %s' % (implementation, IMPLEMENTATIONS))
        self.devices, self.implementation = list(devices), implementation
        self._next_key = 1

    def __call__(self, per_tower, weights):
        """per tower [(grad, var)] -> per tower [(sum over the towers of w_k * grad_k, var)].

        Every tower lists the same variables (its own copies) in the same order;
        a gradient None on tower 0 is None everywhere (the model does not use
        that variable). IndexedSlices are summed dense.
        """
        present = [j for j, (g, _) in enumerate(per_tower[0]) if g is not None]
        weighted = []
        for grads, weight, device in zip(per_tower, weights, self.devices):
            with tf.device(device):
                dense = [tf.convert_to_tensor(grads[j][0]) for j in present]
                weighted.append([scaled(g, weight) for g in dense])
        summed = self._sum(weighted) if len(self.devices) > 1 else weighted
        out = []
        for grads, sums in zip(per_tower, summed):
            reduced = dict(zip(present, sums))
            out.append([(reduced.get(j), var) for j, (_, var) in enumerate(grads)])
        return out

    def _sum(self, weighted):
        """Per tower, the sums over the towers of its weighted gradients."""
        if self.implementation == 'host':
            return self._host_sum(weighted)
        out = [[None] * len(weighted[0]) for _ in weighted]
        for indices in packs(weighted[0]):
            buffers = []
            for tower, device in zip(weighted, self.devices):
                with tf.device(device):
                    buffers.append(_packed(tower, indices))
            for tower, buffer, device, sums in zip(weighted, self._reduce(buffers),
                                                   self.devices, out):
                with tf.device(device):
                    for i, piece in _unpacked(buffer, tower, indices):
                        sums[i] = piece
        return out

    def _host_sum(self, weighted):
        """Each variable's sum on one tower's device (spread by bytes), read by every tower."""
        chooser = LeastLoaded(self.devices)
        out = [[None] * len(weighted[0]) for _ in weighted]
        for j, first in enumerate(weighted[0]):
            with tf.device(chooser.place(first.shape.num_elements() * first.dtype.size)):
                total = tf.add_n([tower[j] for tower in weighted])
            for k, device in enumerate(self.devices):
                with tf.device(device):
                    out[k][j] = tf.identity(total)
        return out

    def _reduce(self, buffers):
        """One buffer per tower, each on its tower's device -> their sum, on each."""
        if self.implementation == 'nccl':
            return nccl_ops.all_sum(buffers)
        key, self._next_key = self._next_key, self._next_key + 1
        out = []
        for buffer, device in zip(buffers, self.devices):
            with tf.device(device):
                out.append(collective_ops.all_reduce(buffer, len(buffers), GROUP_KEY, key, 'Add',
                                                     'Id', communication_hint='ring'))
        return out
