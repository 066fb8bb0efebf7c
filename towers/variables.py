"""Where the variables live and how the towers' gradients meet: --variable-update.

Small classes behind one narrow interface, as tf_cnn_benchmarks has them:

  parameter_server  one copy of each variable, on the parameter device (the
                    classic tutorial's /cpu:0) or spread over the tower devices
                    (each variable to the device with the fewest bytes so far);
                    the gradients are averaged where the variable lives and
                    applied once.
  replicated        one copy per tower: tower 0's, with the plain names, is the
                    master; tower i's are named replica_<i>/... on its device.
                    Each variable's weighted gradient sum is formed on one
                    device (spread by bytes) and copied to every tower, and every
                    tower applies that same update to its copy with its own
                    optimizer, so the trained copies stay bit-equal. Batch-norm
                    moving averages are kept on the master only, from tower 0
                    as with parameter_server (evaluation and checkpoints read
                    the master; the replicas' are never used). Only the master
                    copies are saved, under the names parameter_server uses, so
                    a checkpoint restores into either strategy.
  independent       one copy per tower, each trained on its own slice with no
                    synchronisation: an upper bound for benchmarks only.

Each strategy tells the tower builder where tower i's variables go
(`tower_variables`), combines the towers' gradients into apply ops
(`build_train_op`), says what a checkpoint holds (`saved_variables`) and how
the copies are made equal after initialisation or a restore (`sync_op`).
"""
import contextlib

import tensorflow as tf

from towers.devices import SPREAD
from towers.errors import TowersError
from towers.gradients import build_train_op, combine, variable_name
from towers.tower import tower_update_ops

tf1 = tf.compat.v1

VARIABLE_UPDATES = ('parameter_server', 'replicated', 'independent')


def _bytes(op):
    """Bytes of the variable a VarHandleOp / VariableV2 op creates."""
    shape = tf.TensorShape(op.get_attr('shape'))
    return (shape.num_elements() or 0) * tf.as_dtype(op.get_attr('dtype')).size


class LeastLoaded:
    """A device chooser: each variable to the device holding the fewest bytes so far.

    Deterministic (ties go to the earliest device), so every run of the same
    model places its variables alike.
    """

    def __init__(self, devices):
        self.devices, self.load = list(devices), [0] * len(devices)

    def place(self, size):
        index = min(range(len(self.devices)), key=lambda i: (self.load[i], i))
        self.load[index] += size
        return self.devices[index]

    def __call__(self, op):
        return self.place(_bytes(op))


def variable_placement(param_device, tower_devices):
    """Where variables go for a --param-device: that device, or for 'spread' a
    LeastLoaded chooser over the tower devices (a device function)."""
    return LeastLoaded(tower_devices) if param_device == SPREAD else param_device


def host_device(param_device):
    """Where single ops such as the step counter go: the parameter device, or /cpu:0
    when the variables are spread."""
    return '/cpu:0' if param_device == SPREAD or not isinstance(param_device, str) \
        else param_device


class ParameterServer:
    """One copy of each variable, on param_device or spread over the towers ('spread')."""

    name = 'parameter_server'
    replicas = False

    def __init__(self, tower_devices, param_device='/cpu:0'):
        self.tower_devices = list(tower_devices)
        self.param_device = variable_placement(param_device, tower_devices)

    def tower_variables(self, index, device):
        """(variable scope name or None for the shared one, device for its variables)."""
        return None, self.param_device

    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        """average_gradients -> decay -> processors -> one apply_gradients."""
        return build_train_op(towers, optimizers[0], global_step, weight_decay, processors)

    def saved_variables(self):
        return {v.op.name: v for v in tf1.global_variables()}

    def sync_op(self):
        return tf.no_op(name='sync_replicas')


class Replicated(ParameterServer):
    """One copy per tower; the same all-reduced update applied to every copy."""

    name = 'replicated'
    replicas = True

    def __init__(self, tower_devices, param_device=None):
        super().__init__(tower_devices, tower_devices[0])

    def tower_variables(self, index, device):
        return ('replica_%d' % index if index else None), device

    def _combined(self, towers):
        """Per tower, [(the weighted sum of all towers' gradients, its own variable)]."""
        _check_replicas(towers)
        chooser = LeastLoaded(self.tower_devices)
        per_tower = [[] for _ in towers]
        with tf1.name_scope('all_reduce'):
            for column in zip(*[t.grads_and_vars for t in towers]):
                master = column[0][1]
                with tf.device(chooser.place(master.shape.num_elements()
                                             * master.dtype.size)):
                    total = combine([g for g, _ in column], [t.weight for t in towers])
                for i, (_, var) in enumerate(column):
                    with tf.device(self.tower_devices[i]):
                        per_tower[i].append((_copy(total), var))
        return per_tower

    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        applies = []
        for i, grads in enumerate(self._combined(towers)):
            grads = _process(grads, weight_decay, processors)
            # Each copy's optimizer slots (and Adam's beta powers) sit in its replica scope.
            with (tf1.name_scope('replica_%d/' % i) if i else contextlib.nullcontext()):
                applies.append(optimizers[i].apply_gradients(
                    grads, global_step=global_step if i == 0 else None))
            if i == 0:
                applied = grads
        return tf.group(*applies, *tower_update_ops(towers[0]), name='train_op'), applied

    def saved_variables(self):
        return {v.op.name: v for v in tf1.global_variables() if variable_name(v) == v.op.name}

    def sync_op(self):
        """Copy every master variable onto its replicas (after init or a restore)."""
        masters = self.saved_variables()
        assigns = []
        for var in tf1.global_variables():
            if variable_name(var) != var.op.name:
                master = masters.get(variable_name(var))
                if master is None:
                    raise TowersError('replica %s has no master variable' % var.op.name)
                with tf.device(var.device):
                    assigns.append(tf1.assign(var, master.read_value()))
        return tf.group(*assigns, name='sync_replicas')


class Independent(Replicated):
    """One copy per tower, each trained on its own slice: no synchronisation at all."""

    name = 'independent'

    def _combined(self, towers):
        _check_replicas(towers)
        return [list(t.grads_and_vars) for t in towers]


def make_strategy(name, tower_devices, param_device='/cpu:0'):
    """The strategy of a --variable-update name."""
    classes = {'parameter_server': ParameterServer, 'replicated': Replicated,
               'independent': Independent}
    if name not in classes:
        raise TowersError('unknown --variable-update %r; choose one of: %s'
                          % (name, ', '.join(VARIABLE_UPDATES)))
    return classes[name](tower_devices, param_device)


def _process(grads, weight_decay, processors):
    if weight_decay is not None:
        grads = weight_decay(grads)
    for process in processors:
        grads = process(grads)
    return grads


def _copy(grad):
    """grad on the current device (IndexedSlices stay sparse)."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(grad.values), tf.identity(grad.indices),
                                grad.dense_shape)
    return tf.identity(grad)


def _check_replicas(towers):
    """Tower i's variable j must be the replica of tower 0's variable j."""
    reference = [variable_name(v) for _, v in towers[0].grads_and_vars]
    for i, tower in enumerate(towers[1:], start=1):
        names = [variable_name(v) for _, v in tower.grads_and_vars]
        if names != reference:
            raise TowersError('tower %d built other variables than tower 0 (%s): build every '
                              'tower with the same model'
                              % (i, ', '.join(sorted(set(names) ^ set(reference))[:4])))
