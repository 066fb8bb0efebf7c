"""The lines a run says before its first step: what it trains, on what, and how.

Said once the Session is open (the steps already done, the logical GPUs' memory
come from it), read from a Trainer (towers/trainer.py) as it stands then.
"""
import tensorflow as tf

from towers import exactness
from towers.accumulation import accumulation_line
from towers.deviceplan import xla_reaches
from towers.logicalgpus import logical_gpu_line, session_gpu_memory
from towers.names import XLA_CPU_FLAG

tf1 = tf.compat.v1


def first_lines(trainer):
    """Yield the lines: the steps and towers, then only what applies to this run (gradient
    accumulation, XLA that reaches nothing, logical GPUs), whether a resume is exact, and
    where the variables live."""
    config, plan, graph = trainer.config, trainer.plan, trainer.graph
    towers = trainer.tower_devices
    yield ('training %d steps on %d tower(s) %s, global batch %d, %s input%s%s'
           % (trainer.num_steps, len(towers), ','.join(towers), config.batch_size,
              trainer.source.name,
              ', ' + graph.precision.name if graph.precision.mixed else '',
              ', XLA auto-clustering on' if config.xla else ''))
    if config.accumulate > 1:
        yield accumulation_line(config.accumulate, config.sync_bn,
                                bool(graph.graph.get_collection(tf1.GraphKeys.UPDATE_OPS)))
    if config.xla and not xla_reaches(towers):
        yield ('XLA: TensorFlow clusters nothing on CPU towers unless TF_XLA_FLAGS holds %s '
               'before its first Session (towers train --xla sets it)' % XLA_CPU_FLAG)
    if plan.shared_gpus():
        yield logical_gpu_line(plan, session_gpu_memory(trainer.sess))
    yield exactness.resume_line(towers)
    yield 'variables: %s; maps %s' % (plan.describe(), plan.data_format)
