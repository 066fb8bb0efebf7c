"""`towers bench`: what the tower machinery costs, in images/sec.

Measured as tf_cnn_benchmarks does: a few warm-up steps are run and dropped,
then every step of a fixed window is timed; the result is the mean of the
per-step images/sec with its standard error. All configurations share one
model and one *global* batch, and in-memory synthetic data (a variable on the
host, filled once) so that no input cost blurs the comparison.
"""
import math
import time

import numpy as np
import tensorflow as tf

from towers.devices import resolve_devices, resolve_param_device, session_config
from towers.errors import TowersError
from towers.graph import build_training_graph, make_optimizer

tf1 = tf.compat.v1


def synthetic_inputs(batch_size, input_shape, num_classes):
    """An input_fn: one fixed random batch held in host memory.

    The batch is a placeholder_with_default over a variable, so it takes the
    same path through the graph as fed data but costs no feed per step.
    """
    def input_fn():
        with tf.device('/cpu:0'):
            images = tf1.get_local_variable(
                'synthetic_images', initializer=tf1.random_uniform_initializer(),
                shape=[batch_size] + list(input_shape), dtype=tf.float32)
            labels = tf1.get_local_variable(
                'synthetic_labels', shape=[batch_size], dtype=tf.int64,
                initializer=tf1.random_uniform_initializer(0, num_classes))
            return (tf1.placeholder_with_default(images.read_value(), images.shape, 'images'),
                    tf1.placeholder_with_default(labels.read_value(), labels.shape, 'labels'))
    return input_fn


def mean_stderr(values):
    """Mean and standard error of the mean of a list of numbers."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), float('nan')
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))


def measure(model_fn, input_shape, num_classes, tower_devices, batch_size,
            warmup_steps=10, timed_steps=50, param_device='/cpu:0', optimizer='sgd'):
    """Train on synthetic data and time each step after warm-up.

    Returns:
      (mean, stderr) of images/sec over the timed steps.
    """
    graph = build_training_graph(
        model_fn, input_shape, tower_devices, lambda: make_optimizer(optimizer, 0.01),
        param_device=param_device, seed=0,
        input_fn=synthetic_inputs(batch_size, input_shape, num_classes))
    rates = []
    with tf1.Session(graph=graph.graph,
                     config=session_config(tower_devices, param_device)) as sess:
        sess.run(graph.init_op)
        for step in range(warmup_steps + timed_steps):
            start = time.perf_counter()
            sess.run(graph.train_op)
            elapsed = time.perf_counter() - start
            if step >= warmup_steps:
                rates.append(batch_size / elapsed)
    return mean_stderr(rates)


def run_bench(model_fn, input_shape, num_classes, tower_counts, batch_size,
              warmup_steps=10, timed_steps=50, param_device='cpu', log=print):
    """Measure each tower count on the same global batch; print a table with ratios.

    Args:
      tower_counts: e.g. [1, 2, 4]; a count the machine cannot run is skipped
        with a line saying why.
      param_device: as resolve_param_device takes it ('cpu', 'gpu', a name),
        resolved for each tower count.
    Returns:
      list of dicts: towers, devices, mean, stderr, ratio (to the first row).
    Raises:
      TowersError: batch_size < 1, timed_steps < 2 (no standard error), a
        negative warm-up, or no count could run.
    """
    if batch_size < 1 or timed_steps < 2 or warmup_steps < 0:
        raise TowersError('bench needs --batch-size >= 1, --window >= 2 and --warmup >= 0; got '
                          '%d, %d and %d' % (batch_size, timed_steps, warmup_steps))
    rows = []
    for count in tower_counts:
        try:
            devices = resolve_devices(num_towers=count)
            params = resolve_param_device(param_device, devices)
        except TowersError as e:
            log('%d towers: skipped (%s)' % (count, e))
            continue
        mean, stderr = measure(model_fn, input_shape, num_classes, devices, batch_size,
                               warmup_steps, timed_steps, params)
        rows.append({'towers': count, 'devices': ','.join(devices), 'mean': mean,
                     'stderr': stderr})
    if not rows:
        raise TowersError('no tower count could run; try --towers 1')
    base = rows[0]['mean']
    log('%-7s %-28s %-20s %s' % ('towers', 'devices', 'images/sec', 'ratio to %d tower(s)'
                                 % rows[0]['towers']))
    for row in rows:
        row['ratio'] = row['mean'] / base
        log('%-7d %-28s %-20s %.3f' % (row['towers'], row['devices'],
                                       '%.1f ± %.1f' % (row['mean'], row['stderr']),
                                       row['ratio']))
    return rows
