"""Where the variables live and how the towers' gradients meet: --variable-update.

One abstract interface, VariableStrategy, and three small strategies behind
it, as tf_cnn_benchmarks has its VariableMgr classes:

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
"""
import abc
import contextlib
import re

import tensorflow as tf

from towers.errors import SettingError, TowersError
from towers.gradients import build_train_op, combine, process_gradients
from towers.names import SPREAD, VARIABLE_UPDATES
from towers.tower import tower_update_ops

tf1 = tf.compat.v1

_REPLICA = re.compile(r'^replica_\d+/')


def variable_name(var):
    """A variable's name as checkpoints and the user's regexes see it.

    A replicated run's copies are named replica_<i>/NAME; a regex such as
    ^conv1/ must match them as it matches the master NAME.
    """
    return _REPLICA.sub('', var.op.name)


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
    """Where variables go for a --param-device: that device; for 'spread' a LeastLoaded
    chooser over the tower devices, for a list of devices (a cluster's ps tasks) one
    over those (a device function)."""
    if isinstance(param_device, (list, tuple)):
        return LeastLoaded(param_device)
    return LeastLoaded(tower_devices) if param_device == SPREAD else param_device


def host_device(param_device):
    """Where single ops such as the step counter go: the parameter device, or /cpu:0
    (the chief's, in a cluster) when the variables are spread."""
    return '/cpu:0' if param_device == SPREAD or not isinstance(param_device, str) \
        else param_device


class VariableStrategy(abc.ABC):
    """What a --variable-update decides; the graph builder (graph.py) asks in this order.

    Args:
      tower_devices: one device string per tower.
      param_device: a device, or 'spread'; only parameter_server uses it.

    Attributes:
      name: the --variable-update name.
      replicas: True when each tower has copies of its own (then every tower
        differentiates only its own copies, and has an optimizer of its own).
    """

    name = None
    replicas = False

    def __init__(self, tower_devices, param_device='/cpu:0'):
        self.tower_devices = list(tower_devices)

    @abc.abstractmethod
    def tower_variables(self, index, device):
        """Where tower `index`, built on `device`, gets its variables.

        Returns:
          (scope, variable_device): a variable scope name for copies of its
          own, or None to share the one scope (tower 0 creates, the others
          reuse); and the device (or device function) for its variables.
        """

    @abc.abstractmethod
    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        """Combine the towers' gradients and apply them.

        Args:
          towers: the training Towers, grads_and_vars set.
          optimizers: one optimizer, or one per tower when `replicas`.
          global_step: incremented exactly once per step.
          weight_decay, processors: for gradients.process_gradients.
        Returns:
          (train_op, the grads_and_vars applied to the master variables).
        """

    def step_results(self, loss, metrics, batch):
        """What the step reports, from this process's towers: (loss, metrics, batch).

        The loss and metrics are means over this process's share of the batch,
        batch its size. A strategy across processes makes them the whole global
        batch's; the others hand them back as they are.
        """
        return loss, metrics, batch

    @abc.abstractmethod
    def saved_variables(self):
        """{checkpoint name: variable} of the default graph: one copy of each."""

    @abc.abstractmethod
    def sync_op(self):
        """An op that makes every copy equal to its master; run after init and restores."""


class ParameterServer(VariableStrategy):
    """One copy of each variable, on param_device or spread over the towers ('spread')."""

    name = 'parameter_server'

    def __init__(self, tower_devices, param_device='/cpu:0'):
        super().__init__(tower_devices)
        self.param_device = variable_placement(param_device, tower_devices)

    def tower_variables(self, index, device):
        return None, self.param_device

    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        """average_gradients -> decay -> processors -> one apply_gradients."""
        return build_train_op(towers, optimizers[0], global_step, weight_decay, processors)

    def saved_variables(self):
        return {v.op.name: v for v in tf1.global_variables()}

    def sync_op(self):
        return tf.no_op(name='sync_replicas')


class Replicated(VariableStrategy):
    """One copy per tower; the same all-reduced update applied to every copy."""

    name = 'replicated'
    replicas = True

    def tower_variables(self, index, device):
        return replica_scope(index), device

    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        return apply_per_replica(self._all_reduced(towers), towers, optimizers, global_step,
                                 weight_decay, processors)

    def _all_reduced(self, towers):
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

    def saved_variables(self):
        return masters()

    def sync_op(self):
        return sync_replicas()


class Independent(VariableStrategy):
    """One copy per tower, each trained on its own slice: no synchronisation at all."""

    name = 'independent'
    replicas = True

    def tower_variables(self, index, device):
        return replica_scope(index), device

    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        _check_replicas(towers)
        return apply_per_replica([list(t.grads_and_vars) for t in towers], towers, optimizers,
                                 global_step, weight_decay, processors)

    def saved_variables(self):
        return masters()

    def sync_op(self):
        return sync_replicas()


STRATEGIES = {s.name: s for s in (ParameterServer, Replicated, Independent)}  # VARIABLE_UPDATES


def make_strategy(name, tower_devices, param_device='/cpu:0'):
    """The strategy of a --variable-update name."""
    if name not in STRATEGIES:
        raise SettingError('unknown {variable_update} %r; choose one of: %s', name,
                           ', '.join(VARIABLE_UPDATES))
    return STRATEGIES[name](tower_devices, param_device)


# What the two strategies with a copy per tower share.

def replica_scope(index):
    """Tower 0 holds the masters under the plain names; tower i its copies in replica_<i>."""
    return 'replica_%d' % index if index else None


def apply_per_replica(per_tower, towers, optimizers, global_step, weight_decay, processors):
    """Each tower's optimizer applies its gradients to its own copies.

    Args:
      per_tower: per tower, [(grad, its own variable)].
    Returns:
      (train_op with tower 0's batch-norm updates, tower 0's applied grads_and_vars).
    """
    applies = []
    for i, grads in enumerate(per_tower):
        grads = process_gradients(grads, weight_decay, processors)
        # Each copy's optimizer slots (and Adam's beta powers) sit in its replica scope.
        with (tf1.name_scope('replica_%d/' % i) if i else contextlib.nullcontext()):
            applies.append(optimizers[i].apply_gradients(
                grads, global_step=global_step if i == 0 else None))
        if i == 0:
            applied = grads
    return tf.group(*applies, *tower_update_ops(towers[0]), name='train_op'), applied


def masters():
    """{name: variable} of the master copies (what a checkpoint holds)."""
    return {v.op.name: v for v in tf1.global_variables() if variable_name(v) == v.op.name}


def sync_replicas():
    """Copy every master variable onto its replicas (after init or a restore)."""
    named = masters()
    assigns = []
    for var in tf1.global_variables():
        if variable_name(var) != var.op.name:
            master = named.get(variable_name(var))
            if master is None:
                raise TowersError('replica %s has no master variable' % var.op.name)
            with tf.device(var.device):
                assigns.append(tf1.assign(var, master.read_value()))
    return tf.group(*assigns, name='sync_replicas')


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
