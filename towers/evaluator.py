"""The evaluator task: every new whole checkpoint of the chief's logdir, evaluated once.

What Estimator's evaluator and Kubeflow's TFJob Evaluator replica do, for a
towers run: a task of type `evaluator` (TF_CONFIG, or --task-type evaluator)
joins no server and trains nothing. It reads the chief's logdir (a shared
filesystem), so it never slows or blocks training. Each checkpoint the chief
lists is restored into an inference graph and evaluated over the whole
validation set (the test set when the run holds none back), exactly as
`towers eval` does. Its results go to:

  LOGDIR/eval/events.*          TensorBoard scalars, '<split>/<metric>' at the step
  LOGDIR/eval/eval.jsonl        one line per checkpoint: step, checkpoint, split, metrics
  LOGDIR/eval/best/             the best checkpoint by --best-metric, and best.json

It ends once the checkpoint of the run's last step (run.json's num_steps) is
evaluated, or once the chief has let go of the logdir (a run stopped early)
and nothing is left to evaluate. A restarted evaluator skips the steps its
eval.jsonl already holds. A checkpoint the chief removed before it was read
(it keeps only its newest) is skipped with a line.
"""
import json
import os
import shutil
import time

import tensorflow as tf

from towers import checkpoints, graph
from towers.data.atomic import atomic_output
from towers.errors import TowersError
from towers.evaluation import evaluate, format_metrics, split_size
from towers.logdir import in_use_by
from towers.model import ClassifierModel
from towers.names import BEST_DIR, BEST_FILE, RUN_FILE

tf1 = tf.compat.v1

EVAL_DIR = 'eval'
RESULTS_FILE = 'eval.jsonl'
POLL_S = 1.0


def wait_for_run(logdir, timeout, poll=POLL_S):
    """The chief's run.json, once it is there; TowersError after timeout seconds without."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(os.path.join(logdir, RUN_FILE)):
        if time.monotonic() > deadline:
            raise TowersError('no %s in %s after %.0f s: start the chief with this {logdir} '
                              '(the evaluator reads what it writes)', RUN_FILE, logdir, timeout)
        time.sleep(poll)
    return checkpoints.read_run(logdir)


def listed(logdir):
    """The checkpoints the chief's state file lists, oldest first: [(step, prefix)]."""
    state = checkpoints.checkpoint_state(logdir)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    paths = [p if os.path.isabs(p) else os.path.join(logdir, p) for p in paths]
    return sorted((int(p.rsplit('-', 1)[1]), p) for p in paths)


class Evaluator:
    """Evaluates a logdir's checkpoints as the chief writes them.

    Args:
      logdir: the chief's logdir.
      run: its run.json (which model, input shape, classes, precision).
      model_fn: the model run.json names.
      split: (name, dataset): what to evaluate on ('validation' or 'test', and a DataSet
        or a split streamed from disk).
      plan: the device plan of this task's evaluation towers.
      batch_size: global evaluation batch.
      best_metric: keep the best checkpoint by this metric in eval/best/; None keeps none.
      log: where lines go.
    """

    def __init__(self, logdir, run, model_fn, split, plan, batch_size, best_metric, log=print):
        self.logdir, self.run, self.log = logdir, run, log
        self.split_name, self.dataset = split
        self.batch_size = batch_size
        self.folder = os.path.join(logdir, EVAL_DIR)
        os.makedirs(self.folder, exist_ok=True)
        model = ClassifierModel(model_fn, run['input_shape'], run['num_classes'],
                                normalization=run.get('normalization'))
        self.best_metric = best_metric
        if best_metric == 'auto':
            self.best_metric = 'accuracy' if 'accuracy' in model.METRICS else 'loss'
        self.built = graph.build_eval_graph(model, plan, ema=run.get('ema', False),
                                            precision=run.get('precision', 'fp32'))
        self.sess = tf1.Session(graph=self.built.graph, config=plan.config)
        self.done = self._results()
        self.best = self._read_best()
        with self.built.graph.as_default():  # (a FileWriter needs a graph, not eager mode)
            self.writer = tf1.summary.FileWriter(self.folder)

    def close(self):
        self.writer.close()
        self.sess.close()

    def _results(self):
        """{step: its line} of eval.jsonl, from an evaluator that ran before."""
        try:
            with open(os.path.join(self.folder, RESULTS_FILE), encoding='utf-8') as f:
                lines = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return {}
        except ValueError as e:
            raise TowersError('%s is damaged (%s): move it aside to evaluate every checkpoint '
                              'anew', os.path.join(self.folder, RESULTS_FILE), e) from None
        return {line['step']: line for line in lines}

    def _read_best(self):
        try:
            with open(os.path.join(self.folder, BEST_DIR, BEST_FILE), encoding='utf-8') as f:
                best = json.load(f)
        except (OSError, ValueError):
            return None
        return best if isinstance(best, dict) and best.get('metric') == self.best_metric \
            else None

    def run_until_done(self, wait, poll=POLL_S):
        """Evaluate each new checkpoint until the chief's last; returns the lines written.

        wait: seconds to wait for a chief that never takes the logdir (one that
        stopped before this evaluator started) before ending.
        """
        written, seen_chief = [], False
        final = self.run.get('num_steps')
        deadline = time.monotonic() + wait
        while True:
            chief = in_use_by(self.logdir)  # before listing: its last save comes before it lets go
            seen_chief = seen_chief or bool(chief)
            for step, prefix in listed(self.logdir):
                if step not in self.done:
                    line = self.evaluate(step, prefix)
                    if line:
                        written.append(line)
            newest = max(self.done, default=-1)
            if final is not None and newest >= final:
                self.log('evaluator: the last step\'s checkpoint (%d) is evaluated; done'
                         % newest)
                return written
            if not chief and seen_chief:
                self.log('evaluator: the chief let go of %s at step %d; done'
                         % (self.logdir, newest))
                return written
            if not chief and time.monotonic() > deadline:
                self.log('evaluator: no run has held %s for %.0f s, and its last step (%s) has '
                         'no checkpoint; done at step %d' % (self.logdir, wait, final, newest))
                return written
            time.sleep(poll)

    def evaluate(self, step, prefix):
        """Evaluate one checkpoint; its result line, or None when it could not be read."""
        if not checkpoints.reads_back(prefix):
            self.done[step] = None
            self.log('evaluator: skipped %s: removed or cut short before it was read (the '
                     'chief keeps only its newest checkpoints)' % prefix)
            return None
        with self.built.graph.as_default():
            try:
                checkpoints.restore(self.sess, self.built.saver, prefix, self.built.variables)
            except (TowersError, tf.errors.OpError) as e:  # removed while it was read
                self.done[step] = None
                self.log('evaluator: skipped %s: %s' % (prefix, str(e).splitlines()[0]))
                return None
            values = evaluate(self.sess, self.built, self.dataset, self.batch_size)
        line = dict(values, step=step, checkpoint=prefix, split=self.split_name,
                    examples=split_size(self.dataset), time=time.time())
        with open(os.path.join(self.folder, RESULTS_FILE), 'a', encoding='utf-8') as f:
            f.write(json.dumps(line, sort_keys=True) + '\n')
        self.writer.add_summary(tf1.Summary(value=[
            tf1.Summary.Value(tag='%s/%s' % (self.split_name, name), simple_value=value)
            for name, value in sorted(values.items())]), step)
        self.writer.flush()
        self.done[step] = line
        self.log('evaluator: %s at step %d: %s (%d images)' % (
            self.split_name, step, format_metrics(values), split_size(self.dataset)))
        if self.best_metric and self._improves(values[self.best_metric]):
            self._keep_best(step, prefix, values[self.best_metric])
        return line

    def _improves(self, value):
        if self.best is None:
            return True
        lower = self.best_metric.endswith(('loss', 'error'))
        return value < self.best['value'] if lower else value > self.best['value']

    def _keep_best(self, step, prefix, value):
        """Copy the checkpoint into eval/best/ (whole, then listed), then best.json."""
        best = os.path.join(self.folder, BEST_DIR)
        os.makedirs(best, exist_ok=True)
        name = os.path.basename(prefix)
        try:
            for source in tf.io.gfile.glob(prefix + '.*'):
                if source.endswith(('.index', '.meta')) or '.data-' in source:
                    shutil.copyfile(source, os.path.join(best, os.path.basename(source)))
        except OSError as e:  # removed while copied: the best stays the one before
            self.log('evaluator: could not keep %s as the best: %s' % (prefix, e.strerror))
            return
        tf1.train.update_checkpoint_state(best, name, all_model_checkpoint_paths=[name])
        for stale in tf.io.gfile.glob(os.path.join(best, '*.ckpt-*')):
            if not os.path.basename(stale).startswith(name + '.'):
                checkpoints.remove_path(stale)
        self.best = {'metric': self.best_metric, 'value': value, 'step': step,
                     'split': self.split_name, 'checkpoint': name}
        with atomic_output(os.path.join(best, BEST_FILE), suffix='.json') as out:
            out.write(json.dumps(self.best, indent=1, sort_keys=True).encode())
        self.log('evaluator: best %s %s %.4f so far: %s' % (
            self.split_name, self.best_metric, value, os.path.join(best, name)))
