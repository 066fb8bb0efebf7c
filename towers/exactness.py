"""Exact float32 on GPUs: what `towers check`, `train --deterministic` and the tests ask for.

Two GPU defaults break "N towers equal one device to float precision" and the
exact resume: on Ampere and newer, TensorFlow computes float32 convolutions and
matmuls in TF32 (a 10-bit mantissa), and cuDNN may pick a different,
non-deterministic algorithm from one run to the next. Inside exact(), TF32 is
off and op determinism on. Both are the process's, as TensorFlow has them (no
graph or session has its own), so the commands that want them (check, train
--deterministic) run inside it, and leave them as they were after. Op determinism also changes
the CPU's kernels (a run with it and one without differ in the last bits, so
a run and its resume are both made with it or both without) and makes every
random op need a seed (a run's graph has one: --seed, default 0).
"""
import contextlib

import tensorflow as tf
from tensorflow.python.framework import config as tf_config


@contextlib.contextmanager
def exact():
    """TF32 off and op determinism on inside; both as they were on the way out."""
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    determinism = tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    tf_config.enable_op_determinism()
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
        if not determinism:
            tf_config.disable_op_determinism()


@contextlib.contextmanager
def exact_if(wanted, log):
    """exact() where wanted (a command's --deterministic), saying so in one line; else
    nothing changes."""
    if not wanted:
        yield
        return
    with exact():
        log('deterministic: %s' % describe())
        yield


def describe():
    """'TF32 off, op determinism on' (or on/off as they are)."""
    return 'TF32 %s, op determinism %s' % (
        'on' if tf.config.experimental.tensor_float_32_execution_enabled() else 'off',
        'on' if tf_config.is_op_determinism_enabled() else 'off')


def deterministic():
    """Whether this process runs with op determinism on (inside exact(), say)."""
    return tf_config.is_op_determinism_enabled()


def resume_line(tower_devices):
    """One line for a run's first lines: whether a resume of it continues bit-exactly.

    On CPUs the kernels give the same numbers run after run; on GPUs cuDNN picks its
    algorithms anew in each process and reductions add in whatever order their atomics
    land, so only op determinism makes a resume equal the straight run.
    """
    if deterministic():
        return 'exact: %s; this run and a resume of it are bit-exact' % describe()
    if any('gpu' in device.lower() for device in tower_devices):
        return ('not exact: op determinism off on GPU towers, so a resume continues, not '
                "bit-exactly (cuDNN's algorithms and the GPU's reductions vary from process "
                'to process); op determinism (train --deterministic) makes it exact')
    return 'exact: a resume continues bit-exactly (CPU kernels; op determinism off)'
