"""PlacementAudit: a tower op that ran off its tower's device stops the run, in one line.

The session config allows soft placement, as the classic tutorial does: an op
with no kernel for its device (say, an op with no GPU kernel for float16) runs on
the host instead of failing. Unseen, that would make a "GPU" tower copy its
activations to the CPU and back every step. So the first step of every run
returns its partition graphs (what TensorFlow really placed; no trace) and each tower
op is held against where the device plan put it (towers/deviceplan.py); a
variable's reads go with the variable, as the plan says. allow_soft_placement
(--allow-soft-placement) is the explicit way to train on: the moves are then
logged, once.
"""
import re

from towers.callbacks.base import Callback
from towers.deviceplan import planned_device, ran_as_planned
from towers.errors import TowersError
from towers.session import placement_options

_TOWER = re.compile(r'^tower_\d+/')
_TRANSFERS = ('_Send', '_Recv', '_HostSend', '_HostRecv')


def moved_ops(graph, run_metadata):
    """[(op name, planned device, device it ran on)] of the tower ops that ran elsewhere."""
    moved = []
    for partition in run_metadata.partition_graphs:
        for node in partition.node:
            if not _TOWER.match(node.name) or node.op in _TRANSFERS:
                continue
            try:
                op = graph.get_operation_by_name(node.name)
            except KeyError:
                continue  # made by grappler: it sits where the ops it replaced sat
            planned = planned_device(op)
            if planned and not ran_as_planned(planned, node.device):
                moved.append((node.name, planned, node.device))
    return sorted(moved)


class PlacementAudit(Callback):
    """Place the run's first step; refuse (or, allowed, report) tower ops that moved."""

    order = 1

    def __init__(self, allow_soft_placement=False):
        self.allow_soft_placement, self._first = allow_soft_placement, None

    def before_train(self, trainer):
        self._first = trainer.step + 1

    def wants_trace(self, trainer):
        """The first step's partition graphs, untraced: what moved_ops reads."""
        return placement_options() if trainer.step + 1 == self._first else False

    def after_step(self, trainer, values):
        if trainer.step != self._first or 'run_metadata' not in values:
            return
        moved = moved_ops(trainer.graph.graph, values['run_metadata'])
        if not moved:
            return
        name, planned, ran = moved[0]
        what = ('%d tower op(s) ran off their planned device, e.g. %s on %s instead of %s'
                % (len(moved), name, ran, planned))
        if self.allow_soft_placement:
            trainer.log('soft placement: %s' % what)
            return
        raise TowersError('%s (TensorFlow has no kernel for it there and moved it); '
                          'give {allow_soft_placement} to train so all the same', what)
