"""Callbacks that report: the progress bar or log lines, TensorBoard, the stats file.

(--trace's callback, which reports one step, is with the trace tool:
towers/tools/trace.py.)

They read what each step fetched and what evaluation put in
trainer.epoch_stats; none of them changes training.
"""
import json
import os
import sys
import time
import uuid

import tensorflow as tf
import tqdm

from towers.callbacks.base import Callback, Throughput
from towers.data.atomic import atomic_output
from towers.evaluation import format_metrics
from towers.names import STATS_FILE

tf1 = tf.compat.v1


def _train_values(trainer, values):
    """The loss and the model's metrics among one step's values (not other callbacks' fetches)."""
    return {name: float(values[name]) for name in ['loss'] + sorted(trainer.graph.metrics)}


class Progress(Callback):
    """A tqdm bar with ETA and live loss on a terminal; plain log lines otherwise.

    Log lines (not a terminal, or quiet) come every `every` steps and at the last:
    'step 50/400 epoch 1.25: loss 0.3000 accuracy 0.9100 lr 0.001 | 1805.2 images/sec'.
    While the bar is up, the run's other log lines are written around it.
    """

    order = 10

    def __init__(self, every=50, quiet=False, stream=None):
        self.every, self.quiet, self.stream = every, quiet, stream
        self.bar, self._log = None, None

    def before_train(self, trainer):
        stream = self.stream or sys.stderr
        self.window = Throughput(trainer.warmup_steps)
        if self.quiet or not stream.isatty():
            return
        self.bar = tqdm.tqdm(total=trainer.num_steps, initial=trainer.step, unit='step',
                             file=stream, dynamic_ncols=True)
        self.trainer, self._log = trainer, trainer.log

        def log_around_bar(line):
            with tqdm.tqdm.external_write_mode():
                self._log(line)
        trainer.log = log_around_bar

    def after_step(self, trainer, values):
        self.window.add(values['batch'], values['seconds'])
        due = trainer.step % self.every == 0 or trainer.step == trainer.num_steps
        if self.bar is not None:
            self.bar.update(1)
            if due:
                rate = self.window.take()
                postfix = {k: '%.4f' % v for k, v in _train_values(trainer, values).items()}
                if rate:
                    postfix['img/s'] = '%.0f' % rate
                self.bar.set_postfix(postfix, refresh=False)
        elif due:
            rate = self.window.take()
            trainer.log('step %d/%d epoch %.2f: %s lr %.3g%s'
                        % (trainer.step, trainer.num_steps, trainer.epoch,
                           format_metrics(_train_values(trainer, values)), values['learning_rate'],
                           ' | %.1f images/sec' % rate if rate else ''))

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.trainer.log, self.bar = self._log, None


class TensorBoard(Callback):
    """Event files in the logdir: the graph, and scalars every `every_steps` steps.

    Scalars: loss, each metric, learning_rate, images_per_sec, tower_<i>/loss,
    and after each evaluation <split>/loss and <split>/<metric>. With
    histograms, one histogram per trainable variable at the same steps. A
    resumed run marks its restart so TensorBoard drops the steps it redoes.
    """

    order = 30

    def __init__(self, every_steps=50, histograms=False):
        self.every_steps, self.histograms = every_steps, histograms
        self.writer, self.histogram_op, self._written_eval = None, None, None

    def setup_graph(self, trainer):
        if self.histograms:
            with tf1.name_scope('histograms'):
                self.histogram_op = tf1.summary.merge(
                    [tf1.summary.histogram(v.op.name, v) for v in tf1.trainable_variables()])

    def fetches(self, trainer):
        return {'tower_losses': [t.loss for t in trainer.graph.towers]}

    def before_train(self, trainer):
        self.window = Throughput(trainer.warmup_steps)
        with trainer.graph.graph.as_default():
            # Event files are named by the second and host: the suffix keeps a second
            # run started in the same second from truncating the first one's file.
            self.writer = tf1.summary.FileWriter(trainer.logdir, graph=trainer.graph.graph,
                                                 filename_suffix='.' + uuid.uuid4().hex[:8])
        if trainer.step:
            self.writer.add_session_log(tf1.SessionLog(status=tf1.SessionLog.START),
                                        trainer.step)

    def _scalars(self, values, step):
        summary = tf1.Summary(value=[tf1.Summary.Value(tag=tag, simple_value=float(value))
                                     for tag, value in values.items()])
        self.writer.add_summary(summary, step)

    def after_step(self, trainer, values):
        self.window.add(values['batch'], values['seconds'])
        if trainer.step % self.every_steps and trainer.step != trainer.num_steps:
            return
        scalars = dict(_train_values(trainer, values), learning_rate=values['learning_rate'])
        rate = self.window.take()
        if rate:
            scalars['images_per_sec'] = rate
        for i, loss in enumerate(values['tower_losses']):
            scalars['tower_%d/loss' % i] = loss
        self._scalars(scalars, trainer.step)
        if self.histogram_op is not None:
            self.writer.add_summary(trainer.sess.run(self.histogram_op), trainer.step)

    def after_epoch(self, trainer):
        self._write_evaluation(trainer)

    def after_train(self, trainer):
        self._write_evaluation(trainer)
        self.writer.flush()

    def _write_evaluation(self, trainer):
        if self._written_eval == trainer.step:
            return
        self._written_eval = trainer.step
        scalars = {'%s/%s' % (split, name): value
                   for split, results in trainer.epoch_stats.items()
                   for name, value in results.items()}
        if scalars:
            self._scalars(scalars, trainer.step)

    def close(self):
        if self.writer is not None:
            self.writer.close()


class StatsFile(Callback):
    """logdir/stats.jsonl: one JSON object per epoch (and for a last partial one).

    Keys: epoch, step, time (Unix seconds), train_loss and train_<metric>
    (means over the epoch's examples that this process trained on: after a
    resume mid-epoch, the steps since the resume), learning_rate (at the
    epoch's last step), images_per_sec (after warm-up, or null) and
    <split>_loss, <split>_<metric> for each evaluation. A run that ends
    mid-epoch writes a line for that part-epoch. A resumed run first drops the
    lines of steps past its checkpoint, which it is about to redo; a crash
    between an epoch's checkpoint and its line loses that line.
    """

    order = 40

    def before_train(self, trainer):
        self.path = os.path.join(trainer.logdir, STATS_FILE)
        self.window, self.sums, self.examples = Throughput(trainer.warmup_steps), {}, 0
        if os.path.exists(self.path):
            kept = [line for line in _read_lines(self.path) if line['step'] <= trainer.step]
            with atomic_output(self.path, suffix='.jsonl') as out:
                out.write(''.join(json.dumps(line) + '\n' for line in kept).encode())

    def after_step(self, trainer, values):
        self.window.add(values['batch'], values['seconds'])
        for name, value in _train_values(trainer, values).items():
            self.sums[name] = self.sums.get(name, 0.0) + value * values['batch']
        self.examples += int(values['batch'])
        self.learning_rate = float(values['learning_rate'])

    def after_epoch(self, trainer):
        self._write(trainer)

    def after_train(self, trainer):
        if self.examples and not trainer.stopped:
            self._write(trainer)

    def _write(self, trainer):
        line = {'epoch': round(trainer.epoch, 4), 'step': trainer.step, 'time': time.time(),
                'learning_rate': self.learning_rate, 'images_per_sec': self.window.take()}
        line.update(('train_' + name, total / self.examples) for name, total in self.sums.items())
        for split, results in trainer.epoch_stats.items():
            line.update(('%s_%s' % (split, name), value) for name, value in results.items())
        with open(self.path, 'a', encoding='utf-8') as f:
            f.write(json.dumps(line, sort_keys=True) + '\n')
            f.flush()
            os.fsync(f.fileno())
        self.sums, self.examples = {}, 0


def _read_lines(path):
    """The whole JSON lines of a stats file (a line cut by a crash is dropped)."""
    lines = []
    with open(path, encoding='utf-8') as f:
        for text in f:
            try:
                lines.append(json.loads(text))
            except ValueError:
                pass
    return lines
