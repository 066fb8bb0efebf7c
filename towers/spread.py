"""Variables over several devices by bytes: --param-device spread, and a cluster's ps tasks.

Each variable goes to the device holding the fewest bytes so far, as
tf_cnn_benchmarks' greedy load balancing of its ps tasks; the device plan
(towers/deviceplan.py) holds a Spread where its variables are spread.
"""
import weakref

import tensorflow as tf


def variable_bytes(op):
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
        """A device function (or replica_device_setter's ps_strategy) for variable ops."""
        return self.place(variable_bytes(op))


class Spread:
    """A device function for variables, each to the device with the fewest bytes so far.

    The bytes are counted per graph (a LeastLoaded each), so one plan places a
    training graph's variables and, later, an evaluation graph's alike.
    """

    def __init__(self, devices):
        self.devices = tuple(devices)
        self._choosers = weakref.WeakKeyDictionary()  # graph -> its LeastLoaded

    def __call__(self, op):
        return self._choosers.setdefault(op.graph, LeastLoaded(self.devices))(op)

    def __repr__(self):
        return 'Spread(%s)' % ', '.join(self.devices)
