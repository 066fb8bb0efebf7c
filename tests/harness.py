"""The tests' one way to run a training graph: the library's own session harness.

Every test that trains a TrainGraph by hand goes through open_session (init,
initial values, replica sync) and run_steps (the source started, the steps,
the source stopped), as the Trainer, bench, check and explain do, so a test
never drives a Session in a way the library does not.
"""
import gc
import hashlib
import os
import sys

import tensorflow as tf
from tensorflow.python.eager import context

from towers.inputs import FeedInput
from towers.session import load_variables, open_session, run_steps

tf1 = tf.compat.v1


def fed(batches):
    """A FeedInput that feeds step k the k-th of [(images, labels)]."""
    return FeedInput(batches=lambda step: batches[step])


def saved_variables(graph):
    """{checkpoint name: variable} of a TrainGraph (one copy of each, whatever the strategy)."""
    with graph.graph.as_default():
        return graph.strategy.saved_variables()


def open_graph(graph, initial=None):
    """A Session on the TrainGraph (its plan's config), `initial` {saved name: value}
    loaded before the sync."""
    variables = saved_variables(graph)
    load = (lambda sess: load_variables(sess, variables, initial)) if initial else None
    return open_session(graph, graph.plan.config, load=load)


def run_graph(graph, steps, initial=None, fetches=None):
    """Train the TrainGraph `steps` steps from its own source.

    Args:
      initial: {saved name: value} set before the replicas sync, or None.
      fetches: {name: tensor} to fetch each step besides the train op.
    Returns:
      (saved {name: value} after, every global variable {name: value} after,
      [{name: value} of fetches, per step]).
    """
    with open_graph(graph, initial) as sess:
        per_step = train_steps(sess, graph, steps, fetches)
        with graph.graph.as_default():
            everything = {v.op.name: v for v in tf1.global_variables()}
        return sess.run(saved_variables(graph)), sess.run(everything), per_step


def train_steps(sess, graph, steps, fetches=None):
    """Train the TrainGraph open in sess `steps` steps from its source's start; [{name: value}
    of fetches ({name: tensor} besides the train op), per step]."""
    fetches = dict(fetches or {}, train_op=graph.train_op)
    with run_steps(sess, graph.source, fetches, 0, steps) as loop:
        return [{k: v for k, v in values.items() if k in fetches and k != 'train_op'}
                for values in loop]


def snapshot(folder, times=True):
    """{relative path: (size, SHA-256[, mtime_ns])} of every file under folder.

    Equal snapshots mean nothing there changed; with times, not even rewritten
    in place (a refused run must not touch a file, let alone change it).
    """
    files = {}
    for directory, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, 'rb') as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            info = os.stat(path)
            files[os.path.relpath(path, folder)] = (
                (info.st_size, digest, info.st_mtime_ns) if times else (info.st_size, digest))
    return files


def record_eager_starts(monkeypatch, events):
    """Appends 'eager' to events at each Context.ensure_initialized, which every eager op and
    device list calls (TensorFlow has no public hook for when eager starts). A tf.function of
    an earlier test that is garbage-collected meanwhile removes itself from the context through
    it: not a call of the code under test, and not recorded."""
    gc.collect()
    initialized = context.Context.ensure_initialized

    def ensure_initialized(self):
        if sys._getframe(1).f_code.co_name != 'remove_function':
            events.append('eager')
        return initialized(self)
    monkeypatch.setattr(context.Context, 'ensure_initialized', ensure_initialized)


def ancestors(op):
    """op and every op it waits for (whose output it reads, or a control input), transitively."""
    seen, stack = set(), [op]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    return seen
