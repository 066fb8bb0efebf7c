"""`towers bench`: what the tower machinery and each input mode cost, in images/sec.

Measured as tf_cnn_benchmarks does: a few warm-up steps are run and dropped,
then every step of a fixed window is timed, from asking the input source for
the step (a feed's Python gather counts) to the end of the run; the result is
the mean of the per-step images/sec with its standard error. All rows share
one model and one *global* batch, and are compared as ratios measured in the
same process. All rows are built first and then timed in turns, block by
block, because absolute speed on a shared machine drifts over a minute.

With several precisions (towers/precision.py) every (tower count, input)
runs in each, and each is given as a ratio to the first. Before the table,
a line per mixed precision says how fast it measured here against float32
(towers/tools/probe.py, through precision_support) and what the hardware has,
so that a slow row reads as what it is.
"""
import dataclasses
import math
import time

import numpy as np
import tensorflow as tf

from towers.config import check_loss_scale
from towers.data.sampler import EpochSampler
from towers.deviceplan import local_plan
from towers.devices import process_split
from towers.errors import SettingError, TowersError
from towers.graph import build_training_graph
from towers.inputs import make_input, train_augmentation
from towers.model import ClassifierModel
from towers.names import INPUT_MODES
from towers.precision import Precision
from towers.session import open_session, run_steps, trace_options
from towers.tools import stepgraph
from towers.tools import trace as tracing
from towers.tools.benchtable import add_ratios, table_lines, variables_line, xla_line
from towers.tools.hardware import precision_support

tf1 = tf.compat.v1

# train's --optimizer default (towers/cli/train_flags.py), which bench's rows step with too, so
# that a row times train's step (Adam's update also reads and writes two slots a variable).
TRAIN_OPTIMIZER = 'adam'


def mean_stderr(values):
    """Mean and standard error of the mean of a list of numbers."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), float('nan')
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))


class _Trainer:
    """One configuration, built and warm, stepped a block at a time."""

    def __init__(self, model_fn, input_shape, plan, source, num_steps, optimizer='sgd',
                 xla=False, precision=None):
        model = ClassifierModel(model_fn, input_shape, num_classes=None, optimizer=optimizer)
        self.graph = build_training_graph(model, plan, seed=0, source=source,
                                          learning_rate=0.01, precision=precision,
                                          evaluation=False)
        self.rates, self._options_next = [], None
        # XLA's auto-clustering of the whole step (tf_cnn_benchmarks' --xla), as train's.
        self.sess = open_session(self.graph, plan.with_xla(xla).config)
        self.steps = run_steps(self.sess, source,
                               {'batch': self.graph.batch, 'train_op': self.graph.train_op},
                               0, num_steps, run_options=self._run_options)
        self.steps.__enter__()  # the source runs until close()

    def _run_options(self, step):
        return self._options_next

    def _run_with(self, options):
        """Run one step under RunOptions; its RunMetadata."""
        self._options_next = options
        try:
            return self.steps.run_one()['run_metadata']
        finally:
            self._options_next = None

    def trace(self, path, log):
        """Run one step fully traced; write it to path and log where the time went."""
        metadata = self._run_with(trace_options())
        for line in tracing.report(metadata, path, self.steps.step):
            log(line)

    def step_graph(self):
        """Run one step; the StepGraph of what TensorFlow ran (fusions, casts)."""
        return stepgraph.summarize(self._run_with(stepgraph.graph_options()).partition_graphs)

    def run(self, steps, clock, timed=True):
        self.steps.clock = clock
        for _ in range(steps):
            values = self.steps.run_one()
            if timed:
                self.rates.append(values['batch'] / values['seconds'])

    def close(self):
        try:
            self.steps.__exit__(None, None, None)
        finally:
            self.sess.close()


def measure_interleaved(configs, warmup_steps=10, timed_steps=50, rounds=5,
                        clock=time.perf_counter, trace_path=None, log=print, graphs=None):
    """Time several configurations in turns, so drift hits them all alike.

    Every configuration is built and warmed up first; then the timed steps run
    in `rounds` blocks, one block per configuration in turn.

    Args:
      configs: list of dicts with the keyword arguments of _Trainer except
        num_steps (model_fn, input_shape, plan, source, ...), or callables
        num_steps -> a runner with the same run(steps, clock, timed), rates and
        close() (e.g. a peer's training loop).
      trace_path: trace one step of the first configuration, after its
        warm-up and before any timing, into this Chrome-trace file.
      graphs: a list to receive, per configuration, the StepGraph of one
        step run after its warm-up (None for a runner without step_graph()).
    Returns:
      one (mean, stderr) of images/sec per configuration.
    """
    rounds = max(1, min(rounds, timed_steps))
    blocks = [timed_steps // rounds + (r < timed_steps % rounds) for r in range(rounds)]
    trainers = []
    try:
        for config in configs:
            # The traced step and the inspected one are more (a staged input is
            # started for every step).
            num_steps = warmup_steps + timed_steps + bool(trace_path) + (graphs is not None)
            trainers.append(config(num_steps) if callable(config)
                            else _Trainer(num_steps=num_steps, **config))
            trainers[-1].run(warmup_steps, clock, timed=False)
            if graphs is not None:
                inspect = getattr(trainers[-1], 'step_graph', None)
                graphs.append(inspect() if inspect else None)
        if trace_path:
            trainers[0].trace(trace_path, log)
        for block in blocks:
            for trainer in trainers:
                trainer.run(block, clock)
        return [mean_stderr(t.rates) for t in trainers]
    finally:
        for trainer in trainers:
            trainer.close()


def measure(model_fn, input_shape, plan, source, warmup_steps=10, timed_steps=50,
            clock=time.perf_counter):
    """Train from `source` on the DevicePlan and time each step after warm-up.

    Returns:
      (mean, stderr) of images/sec over the timed steps.
    """
    config = dict(model_fn=model_fn, input_shape=input_shape, plan=plan, source=source)
    return measure_interleaved([config], warmup_steps, timed_steps, rounds=1, clock=clock)[0]


def measure_one_worker(model_fn, input_shape, num_classes, towers, batch_size, warmup_steps,
                       timed_steps, precision=None, threads=None, devices=None):
    """(mean, stderr) images/sec of one worker's step: its towers on a synthetic batch, with
    `threads` intra- and inter-op threads (None: TensorFlow's choice), as a task runs them;
    devices: the towers' kind, 'cpu' or 'gpu' (None: GPUs where there are any).

    TensorFlow sizes a process's thread pools at its first Session, for good: threads holds
    only where this is that Session (as in `towers plan`)."""
    plan = local_plan(towers, devices=devices)
    if threads:
        session = tf1.ConfigProto()
        session.CopyFrom(plan.config)
        session.intra_op_parallelism_threads = session.inter_op_parallelism_threads = threads
        plan = dataclasses.replace(plan, config=session)
    config = dict(model_fn=model_fn, input_shape=input_shape, plan=plan,
                  precision=precision,
                  source=make_input('synthetic', None, None, batch_size, num_classes))
    return measure_interleaved([config], warmup_steps, timed_steps, rounds=1)[0]


def check_window(batch_size, warmup_steps, timed_steps):
    """The settings every timing shares: a batch, a warm-up, a window with a standard error."""
    if batch_size < 1 or timed_steps < 2 or warmup_steps < 0:
        raise SettingError('bench needs {batch_size} >= 1, {timed_steps} >= 2 and {warmup_steps} '
                           '>= 0; got %d, %d and %d', batch_size, timed_steps, warmup_steps)


def precisions_of(names, loss_scale=None):
    """The Precision of each name, once each; fp16's loss_scale (None, 'dynamic' or a number).

    Raises:
      SettingError: no name, an unknown one, or a loss_scale without fp16.
    """
    names = list(dict.fromkeys(names))
    if not names:
        raise SettingError('{precision} names no precision')
    if loss_scale is not None and 'fp16' not in names:
        check_loss_scale(names[0], loss_scale)  # says it scales the float16 loss only
    return [Precision(n, loss_scale if n == 'fp16' else None) for n in names]


def run_bench(model_fn, input_shape, num_classes, tower_counts, batch_size, modes=('synthetic',),
              dataset=None, warmup_steps=10, timed_steps=50, param_device='auto', log=print,
              trace=None, name_of=str, precisions=('fp32',), loss_scale=None, devices=None,
              optimizer=TRAIN_OPTIMIZER, data_format=None, xla=False):
    """Measure every input mode at every tower count in every precision; print one table.

    Args:
      tower_counts: e.g. [1, 2, 4]; a count the machine cannot run is skipped
        with a line saying why.
      modes: input modes (towers.names.INPUT_MODES); all but 'synthetic' read
        `dataset` (images [N, H, W, C] float32, labels [N]).
      param_device: as resolve_param_device takes it ('auto', 'cpu', 'gpu', a
        name), resolved for each tower count; a first line says where they are.
      trace: a Chrome-trace file for one step of the first row (--trace).
      name_of: how a skipped count's message spells settings (the CLI: as flags).
      precisions: names of towers.names.PRECISIONS, each timed against the first.
      loss_scale: fp16's loss scale (None or 'dynamic': dynamic; or a number).
      devices: the towers' kind, 'cpu' or 'gpu'; None: GPUs where there are any.
      optimizer: the step's optimizer, 'sgd', 'momentum' or 'adam' (train's default, so
        that a row times train's step).
      data_format: the towers' layout, 'NHWC' or 'NCHW'; None: the plan's.
      xla: every row under XLA's auto-clustering (DevicePlan.with_xla); a line after the
        table says what one step of each compiled.
    Returns:
      list of dicts: input, towers, precision, devices, mean, stderr (with xla:
      xla_clusters, the compiled clusters one step ran), and the
      ratios vs_synthetic (same tower count and precision; None without a
      synthetic row), vs_first (same input and precision, first tower count)
      and vs_precision (same tower count and input, first precision).
    Raises:
      TowersError: batch_size < 1, timed_steps < 2 (no standard error), a
        negative warm-up, an unknown mode or precision, a loss_scale without
        fp16, or no count could run.
    """
    check_window(batch_size, warmup_steps, timed_steps)
    unknown = [m for m in modes if m not in INPUT_MODES]
    if unknown:
        raise SettingError('unknown {input} %s; choose from %s', ','.join(unknown),
                           ','.join(INPUT_MODES))
    chosen = precisions_of(precisions, loss_scale)
    sampler = EpochSampler(dataset.num_examples, batch_size) if dataset is not None else None
    # The rows read the data as train would: its default augmentation for these images.
    augment = train_augmentation(None, dataset, input_shape) if dataset is not None else None
    rows, configs, homes = [], [], {}
    per_gpu = process_split(tower_counts, devices)  # every row under the largest's split
    for count in tower_counts:
        try:
            plan = local_plan(count, param_device, devices=devices, per_gpu=per_gpu,
                              data_format=data_format)
        except TowersError as e:
            log('%d towers: skipped (%s)' % (count, e.named(name_of)))
            continue
        homes.setdefault(plan.describe(), []).append(count)
        for mode in modes:
            for precision in chosen:
                rows.append({'input': mode, 'towers': count, 'precision': precision.name,
                             'devices': ','.join(plan.towers)})
                configs.append(dict(
                    model_fn=model_fn, input_shape=input_shape, plan=plan,
                    precision=precision, optimizer=optimizer, xla=xla,
                    source=make_input(mode, dataset, sampler, batch_size, num_classes,
                                      augment=augment)))
    if not rows:
        raise TowersError('no tower count could run; try {towers} 1')
    log(variables_line(homes))
    if augment is not None and any(INPUT_MODES[mode].has_images for mode in modes):
        log(augment.line())
    devices = list(dict.fromkeys(d for row in rows for d in row['devices'].split(',')))
    for precision in chosen:
        if precision.mixed:
            log(precision_support(precision.name, devices))
    # Every row in turns, block by block: the ratios then compare like with like. Under XLA,
    # one step of each row says what it compiled (its partition graphs' _XlaRun nodes).
    graphs = [] if xla else None
    for row, (mean, stderr) in zip(rows, measure_interleaved(
            configs, warmup_steps, timed_steps, trace_path=trace, log=log, graphs=graphs)):
        row.update(mean=mean, stderr=stderr)
    add_ratios(rows)
    for line in table_lines(rows, [p.name for p in chosen]):
        log(line)
    if xla:
        for row, graph in zip(rows, graphs):
            row['xla_clusters'] = graph.xla_clusters
        log(xla_line(rows))
    return rows
