"""Where a NaN came from: the step the NaN guard stopped at, replayed with every number watched.

When the guard (guard.py) stops a run, `origin_said` replays the failed step in a
graph of its own: the same model, data and settings, restored from the run's
newest checkpoint (or from the start, which the seed makes the same run) and
stepped to the failed step, the batches in the order the run read them. On the
way every step fetches whether each number of interest is finite; the first
step where one is not gives the verdict, in the order the numbers are made:

  input     an example of the batch, as the towers read it (after --mean/--std)
  forward   the first op of a tower whose output is not finite, and its layer
  loss      finite towers, but not the loss: its weight decay term
  gradient  the first gradient made that is not, and its variable
  update    finite gradients, but the learning rate, a variable or an optimizer
            slot after the apply is not

The replay writes nothing but its verdict (nan.json in the logdir, beside
run.json); the run's checkpoints stay as they were. It costs the steps from the
checkpoint to the failure, and only when the guard trips. On GPUs a replay
repeats the failure only where the kernels do (--deterministic); where it does
not, the verdict says so.
"""
import json
import os

import numpy as np
import tensorflow as tf

from towers.callbacks.base import Callback
from towers.callbacks.guard import NonFiniteStep

tf1 = tf.compat.v1

# The file in a logdir that keeps the verdict.
ORIGIN_FILE = 'nan.json'

_FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


class origin_said:
    """Within: a NonFiniteStep of the trainer's run gains where it came from, replayed
    (a run of this process's only: a cluster's steps span processes)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if not isinstance(error, NonFiniteStep) or not self.trainer.run.in_one_process \
                or self.trainer.given_source is not None:
            return False
        origin = replay(self.trainer, error.step)
        raise error.with_origin(origin['line']) from error


def replay(trainer, step):
    """The verdict on `step` of trainer's run, replayed in a Trainer of its own: a dict with
    line (one sentence), kind, step and replayed_from, and what it names; written to the
    logdir's nan.json where the run has a logdir."""
    watch = Watch(step)
    replica = type(trainer)(trainer.model, trainer.data, trainer.config, callbacks=[watch],
                            log=lambda line: None, stop_requested=watch.stop)
    replica._train()  # no logdir lock or record of its own: it writes nothing
    origin = dict(watch.verdict or _unrepeated(step), step=step,
                  replayed_from=watch.start)
    if trainer.logdir:
        path = os.path.join(trainer.logdir, ORIGIN_FILE)
        with open(path + '.tmp', 'w') as f:
            json.dump(origin, f, indent=1, sort_keys=True)
        os.replace(path + '.tmp', path)
    return origin


def read_origin(logdir):
    """The verdict a replay left in logdir (a dict, as replay returns it), or None."""
    path = os.path.join(logdir, ORIGIN_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding='utf-8') as f:
        return json.load(f)


def _unrepeated(step):
    return {'kind': 'unrepeated',
            'line': 'replayed, step %d stayed finite: the kernels differ from run to run here '
                    '(on GPUs; {deterministic} makes a replay repeat them)' % step}


class Watch(Callback):
    """Fetches, at every step, whether each number of interest is finite; the first step
    where one is not sets `verdict` and asks the replay to stop."""

    order = 0

    def __init__(self, until):
        self.until, self.start, self.step, self.verdict = until, None, None, None
        self._fetches, self._dtypes = {}, {}

    def setup_graph(self, trainer):
        graph, towers = trainer.graph.graph, trainer.graph.towers
        position = {op.name: i for i, op in enumerate(graph.get_operations())}
        fetches = {'counts': [t.count for t in towers],
                   'learning_rate': tf.math.is_finite(trainer.graph.learning_rate),
                   'loss': tf.math.is_finite(trainer.graph.loss)}
        for i, tower in enumerate(towers):
            if tower.images.dtype in _FLOATS:
                with tf.device(tower.images.device):
                    axes = list(range(1, tower.images.shape.rank))
                    fetches['input_%d' % i] = tf.reduce_all(
                        tf.math.is_finite(tower.images), axis=axes)
            fetches['forward_%d' % i] = _finite_outputs(self._dtypes,
                [op for op in graph.get_operations() if op.name.startswith(tower.scope)
                 and 'gradients' not in op.name and op._control_flow_context is None])
            grads = sorted(((position[g.op.name], g, v) for g, v in tower.grads_and_vars
                            if g is not None and not isinstance(g, tf.IndexedSlices)),
                           key=lambda pgv: pgv[0])
            fetches['gradient_%d' % i] = {v.op.name: _all_finite(g) for _, g, v in grads}
        with tf.control_dependencies([trainer.graph.train_op]):
            fetches['update'] = {v.op.name: _all_finite(v.read_value())
                                 for v in tf1.global_variables() if v.dtype.base_dtype in _FLOATS}
        self._fetches = fetches

    def fetches(self, trainer):
        return {'watch': self._fetches}

    def before_train(self, trainer):
        self.start = trainer.step

    def after_step(self, trainer, values):
        self.step = trainer.step
        self.verdict = self.verdict or _verdict(values['watch'], trainer.step, self._dtypes)

    def stop(self):
        return 'replayed' if self.verdict or self.step >= self.until else None


def _all_finite(tensor):
    with tf.device(tensor.device):
        return tf.reduce_all(tf.math.is_finite(tensor))


def _finite_outputs(dtypes, ops):
    """{op name: whether its float outputs are all finite}, in the order ops were made; each
    one's type of its first float output into dtypes."""
    finite = {}
    for op in ops:
        outputs = [t for t in op.outputs if t.dtype in _FLOATS and t.shape.rank is not None]
        if outputs:
            dtypes[op.name] = outputs[0].dtype.name
            with tf.device(op.device):
                finite[op.name] = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t))
                                                 for t in outputs])
    return finite


def _verdict(watched, step, dtypes):
    """The first non-finite number of this step, in the order the step makes them, or None.
    dtypes: {op name: the type of its first float output}."""
    counts = [int(c) for c in watched['counts']]
    for i in range(len(counts)):
        finite = watched.get('input_%d' % i)
        bad = [] if finite is None else np.flatnonzero(~np.asarray(finite)[:counts[i]])
        if len(bad):
            example = sum(counts[:i]) + int(bad[0])
            return {'kind': 'input', 'tower': i, 'example': example,
                    'line': 'replayed, the input of step %d already holds NaN or Inf: example '
                            '%d of the batch (tower %d), as the towers read it: mend the data '
                            '(or {mean}/{std})' % (step, example, i)}
    first = [(list(f).index(name), i, name) for i in range(len(counts))
             for f in [watched['forward_%d' % i]] for name, ok in f.items() if not ok]
    if first:
        _, i, name = min(first)
        layer, dtype = '/'.join(name.split('/')[1:-1]), dtypes[name]
        advice = ('float16 overflowed: scale the loss ({loss_scale} dynamic)'
                  if dtype == 'float16' else 'lower {learning_rate}')
        return {'kind': 'forward', 'tower': i, 'op': name, 'dtype': dtype,
                'line': 'replayed, step %d first went non-finite in the forward pass of tower '
                        '%d, at %s (op %s, %s), its input finite: %s'
                        % (step, i, layer or 'its input', name, dtype, advice)}
    if not watched['loss']:
        return {'kind': 'loss',
                'line': "replayed, step %d's towers were finite and the loss is not: its "
                        'weight decay term, the weights grown past float32: lower '
                        '{learning_rate} or {weight_decay}' % step}
    for i in range(len(counts)):
        bad = [name for name, ok in watched['gradient_%d' % i].items() if not ok]
        if bad:
            return {'kind': 'gradient', 'tower': i, 'variable': bad[0],
                    'line': 'replayed, step %d\'s forward pass was finite and its first '
                            'non-finite gradient is that of %s in tower %d: clip with '
                            '{clip_norm}, or lower {learning_rate}' % (step, bad[0], i)}
    bad = [name for name, ok in watched['update'].items() if not ok]
    if not watched['learning_rate'] or bad:
        what = ('the learning rate is not finite' if not watched['learning_rate']
                else 'its update made %s non-finite' % bad[0])
        return {'kind': 'update', 'variable': None if not bad else bad[0],
                'line': 'replayed, step %d\'s gradients were finite and %s: lower '
                        '{learning_rate}' % (step, what)}
    return None
