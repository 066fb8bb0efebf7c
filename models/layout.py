"""The layout the layers build in: NHWC (channels last) or NCHW (channels first).

Every model takes NHWC images and keeps NHWC-shaped variables. Built inside
`with layout.data_format('NCHW')`, check_inputs turns the images to NCHW once,
every conv, pool and batch norm runs channels first, and flatten turns the map
back to NHWC before the dense layers, so a checkpoint is the same in either
layout and an NCHW run computes what an NHWC run does (to float rounding). A
scope, as tensorpack's argscope(data_format=...) is: the layers' signatures
stay those of the NHWC models every tutorial shows.

Two scopes, so that no model is switched to NCHW behind its back: the tower
builder says what the device plan *prefers* (NCHW on GPU towers, where cuDNN's
float32 kernels prefer it, as in tf_cnn_benchmarks), and a model that is
written for both layouts opens `data_format(preferred())` around its layers
(build_model does it for every model of towers.models). A model_fn of one's
own that does not builds in NHWC, wherever it runs.
"""
import contextlib
import threading

import tensorflow as tf

from towers.names import DATA_FORMATS

_scopes = threading.local()


@contextlib.contextmanager
def data_format(name):
    """Build the layers inside in layout `name` ('NHWC' or 'NCHW'; None keeps the current)."""
    with _scope('current', name):
        yield


@contextlib.contextmanager
def prefer(name):
    """Inside, preferred() is name ('NHWC' or 'NCHW'; None keeps the preference)."""
    with _scope('preferred', name):
        yield


def current():
    """The layout layers build in now: 'NHWC' outside any data_format scope."""
    return getattr(_scopes, 'current', 'NHWC')


def preferred():
    """The layout the device plan asks of models written for both: 'NHWC' unless said."""
    return getattr(_scopes, 'preferred', 'NHWC')


@contextlib.contextmanager
def _scope(kind, name):
    if name is not None and name not in DATA_FORMATS:
        raise ValueError('data format must be NHWC or NCHW, got %r' % (name,))
    before = getattr(_scopes, kind, 'NHWC')
    setattr(_scopes, kind, name or before)
    try:
        yield
    finally:
        setattr(_scopes, kind, before)


def channels_first(x):
    """Whether x, a map the layers build on, has its channels on axis 1."""
    return current() == 'NCHW' and x.shape.rank == 4


def format_of(x):
    """The data_format argument of TensorFlow's ops for x: 'NCHW' or 'NHWC'."""
    return 'NCHW' if channels_first(x) else 'NHWC'


def channel_axis(x):
    return 1 if channels_first(x) else x.shape.rank - 1


def spatial_axes(x):
    return [2, 3] if channels_first(x) else list(range(1, x.shape.rank - 1))


def other_axes(x):
    """Every axis of x but the channels': what a per-channel sum or moment reduces."""
    return [axis for axis in range(x.shape.rank) if axis != channel_axis(x)]


def per_channel(vector, x):
    """A [C] tensor shaped to broadcast over x, whose channels are first or last."""
    return tf.reshape(vector, [-1, 1, 1]) if channels_first(x) else vector


def to_nhwc(x):
    """An NCHW map transposed to NHWC."""
    return tf.transpose(x, [0, 2, 3, 1])


def to_nchw(x):
    """An NHWC map transposed to NCHW."""
    return tf.transpose(x, [0, 3, 1, 2])


def pad(x, spatial=(0, 0), channels=(0, 0)):
    """x padded with zeros: (before, after) on the height and on the width, and on the
    channels, in whichever layout x has."""
    spatial, channels = list(spatial), list(channels)
    if channels_first(x):
        return tf.pad(x, [[0, 0], channels, spatial, spatial])
    return tf.pad(x, [[0, 0], spatial, spatial, channels])
