"""`towers bench`: what the tower machinery and each input mode cost, in images/sec.

Measured as tf_cnn_benchmarks does: a few warm-up steps are run and dropped,
then every step of a fixed window is timed, from asking the input source for
the step (a feed's Python gather counts) to the end of the run; the result is
the mean of the per-step images/sec with its standard error. All rows share
one model and one *global* batch, and are compared as ratios measured in the
same process, because absolute numbers on a shared machine drift.
"""
import math
import time

import numpy as np
import tensorflow as tf

from data.sampler import EpochSampler
from towers.devices import resolve_devices, resolve_param_device, session_config
from towers.errors import TowersError
from towers.graph import build_training_graph, make_optimizer
from towers.inputs import INPUT_MODES, make_input, run_step

tf1 = tf.compat.v1


def mean_stderr(values):
    """Mean and standard error of the mean of a list of numbers."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), float('nan')
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))


def measure(model_fn, input_shape, tower_devices, batch_size, source, warmup_steps=10,
            timed_steps=50, param_device='/cpu:0', optimizer='sgd', clock=time.perf_counter):
    """Train from `source` and time each step after warm-up.

    Returns:
      (mean, stderr) of images/sec over the timed steps.
    """
    graph = build_training_graph(
        model_fn, input_shape, tower_devices, lambda: make_optimizer(optimizer, 0.01),
        param_device=param_device, seed=0, source=source)
    rates = []
    num_steps = warmup_steps + timed_steps
    with tf1.Session(graph=graph.graph,
                     config=session_config(tower_devices, param_device)) as sess:
        sess.run(graph.init_op)
        source.start(sess, 0, num_steps)
        try:
            for step in range(num_steps):
                start = clock()
                images = run_step(sess, source, step, [graph.batch, graph.train_op])[0]
                elapsed = clock() - start
                if step >= warmup_steps:
                    rates.append(images / elapsed)
        finally:
            source.stop(sess)
    return mean_stderr(rates)


def run_bench(model_fn, input_shape, num_classes, tower_counts, batch_size, modes=('synthetic',),
              dataset=None, warmup_steps=10, timed_steps=50, param_device='cpu', log=print):
    """Measure every input mode at every tower count; print one table.

    Args:
      tower_counts: e.g. [1, 2, 4]; a count the machine cannot run is skipped
        with a line saying why.
      modes: input modes (towers.inputs.INPUT_MODES); all but 'synthetic' read
        `dataset` (images [N, H, W, C] float32, labels [N]).
      param_device: as resolve_param_device takes it ('cpu', 'gpu', a name),
        resolved for each tower count.
    Returns:
      list of dicts: input, towers, devices, mean, stderr, and the ratios
      vs_synthetic (same tower count; None without a synthetic row) and
      vs_first (same input, first tower count).
    Raises:
      TowersError: batch_size < 1, timed_steps < 2 (no standard error), a
        negative warm-up, an unknown mode, or no count could run.
    """
    if batch_size < 1 or timed_steps < 2 or warmup_steps < 0:
        raise TowersError('bench needs --batch-size >= 1, --window >= 2 and --warmup >= 0; got '
                          '%d, %d and %d' % (batch_size, timed_steps, warmup_steps))
    unknown = [m for m in modes if m not in INPUT_MODES]
    if unknown:
        raise TowersError('unknown --input %s; choose from %s'
                          % (','.join(unknown), ','.join(INPUT_MODES)))
    sampler = EpochSampler(dataset.num_examples, batch_size) if dataset is not None else None
    rows = []
    for count in tower_counts:
        try:
            devices = resolve_devices(num_towers=count)
            params = resolve_param_device(param_device, devices)
        except TowersError as e:
            log('%d towers: skipped (%s)' % (count, e))
            continue
        for mode in modes:
            source = make_input(mode, dataset, sampler, batch_size, num_classes)
            mean, stderr = measure(model_fn, input_shape, devices, batch_size, source,
                                   warmup_steps, timed_steps, params)
            rows.append({'input': mode, 'towers': count, 'devices': ','.join(devices),
                         'mean': mean, 'stderr': stderr})
    if not rows:
        raise TowersError('no tower count could run; try --towers 1')
    _add_ratios(rows)
    log('%-10s %-7s %-28s %-20s %-13s %s' % ('input', 'towers', 'devices', 'images/sec',
                                             'vs synthetic', 'vs %d tower(s)' % rows[0]['towers']))
    for row in rows:
        vs_synthetic = '%.3f' % row['vs_synthetic'] if row['vs_synthetic'] else '-'
        log('%-10s %-7d %-28s %-20s %-13s %.3f' % (
            row['input'], row['towers'], row['devices'],
            '%.1f ± %.1f' % (row['mean'], row['stderr']), vs_synthetic, row['vs_first']))
    return rows


def _add_ratios(rows):
    synthetic = {r['towers']: r['mean'] for r in rows if r['input'] == 'synthetic'}
    first = {}
    for row in rows:
        first.setdefault(row['input'], row['mean'])
        row['vs_first'] = row['mean'] / first[row['input']]
        row['vs_synthetic'] = (row['mean'] / synthetic[row['towers']]
                               if row['towers'] in synthetic else None)
