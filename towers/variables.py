"""How the towers' gradients meet and are applied: --variable-update.

Where the variables live is the run's DevicePlan (towers/deviceplan.py); the
strategies read it.

One abstract interface, VariableStrategy, and three small strategies behind
it, as tf_cnn_benchmarks has its VariableMgr classes:

  parameter_server  one copy of each variable, on the parameter device (the
                    classic tutorial's /cpu:0) or spread over the tower devices
                    (each variable to the device with the fewest bytes so far);
                    the gradients are averaged where the variable lives and
                    applied once.
  replicated        one copy per tower: tower 0's, with the plain names, is the
                    master; tower i's are named replica_<i>/... on its device.
                    Each tower weights its gradients by its share, an all-reduce
                    sums them over the towers (NCCL on GPUs, TensorFlow's
                    collective ring on CPUs: towers/allreduce.py), and every
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

from towers.allreduce import TowerAllReduce
from towers.errors import SettingError, TowersError
from towers.gradients import (
    build_train_op,
    check_same_variables,
    process_gradients,
    tower_update_ops,
)
from towers.names import VARIABLE_UPDATES

tf1 = tf.compat.v1

_REPLICA = re.compile(r'^replica_\d+/')


def variable_name(var):
    """A variable's name as checkpoints and the user's regexes see it.

    A replicated run's copies are named replica_<i>/NAME; a regex such as
    ^conv1/ must match them as it matches the master NAME.
    """
    return _REPLICA.sub('', var.op.name)


class VariableStrategy(abc.ABC):
    """How the towers' gradients meet and are applied; the graph builder (graph.py) asks
    in this order. Where the variables are is the plan's (towers/deviceplan.py).

    Args:
      plan: the run's DevicePlan.

    Attributes:
      name: the --variable-update name.
    """

    name = None

    def __init__(self, plan):
        self.plan = plan

    @property
    def replicas(self):
        """Whether each tower has copies of its own (then every tower differentiates only its
        own copies, and has an optimizer of its own): the plan's to say."""
        return self.plan.copies

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
    """One copy of each variable, where the plan puts it (a device, or spread by bytes)."""

    name = 'parameter_server'

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

    def build_train_op(self, towers, optimizers, global_step, weight_decay=None,
                       processors=()):
        _check_replicas(towers)
        all_reduce = TowerAllReduce(self.plan.towers, self.plan.all_reduce)
        with tf1.name_scope('all_reduce'):
            per_tower = all_reduce([t.grads_and_vars for t in towers],
                                   [t.weight for t in towers])
        return apply_per_replica(per_tower, towers, optimizers, global_step, weight_decay,
                                 processors)

    def saved_variables(self):
        return masters()

    def sync_op(self):
        return sync_replicas()


class Independent(VariableStrategy):
    """One copy per tower, each trained on its own slice: no synchronisation at all."""

    name = 'independent'

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


def make_strategy(plan):
    """The strategy of the plan's --variable-update."""
    name = plan.variable_update
    if name not in STRATEGIES:
        raise SettingError('unknown {variable_update} %r; choose one of: %s', name,
                           ', '.join(VARIABLE_UPDATES))
    return STRATEGIES[name](plan)


# What the two strategies with a copy per tower share.

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


def _check_replicas(towers):
    """Tower i's variable j must be the replica of tower 0's variable j."""
    check_same_variables([[v for _, v in tower.grads_and_vars] for tower in towers],
                         name=variable_name)
