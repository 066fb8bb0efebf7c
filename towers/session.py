"""The session harness: a Session ready to train, and the loop that steps it.

Everything that runs a training graph goes through these two: the Trainer,
`towers bench`, `check` and `explain`, and the tests.

  open_session(built, config, load)   a Session with the variables initialised,
                                      loaded (a checkpoint, given values) and
                                      the replicas synced to their masters
  run_steps(sess, source, fetches,    the steps, fed by an InputSource that is
            start_step, num_steps)    started first and always stopped
"""
import contextlib
import time

import tensorflow as tf

from towers.data.errors import bad_record
from towers.errors import TowersError, op_error_summary

tf1 = tf.compat.v1


def open_session(built, config, load=None, target=''):
    """A Session on a built training graph, ready for its first step.

    Runs, in order: built.init_op (every variable, the local ones too), then
    load(sess) (a restore, or values a test sets), then built.sync_op (the
    replicas take their masters' values; a no-op with one copy).

    Args:
      built: a towers.graph.TrainGraph, or anything with graph, init_op and
        sync_op.
      config: the tf.compat.v1.ConfigProto (towers.devices.session_config).
      load: callable(sess), or None.
      target: the Session's target: '' in this process, 'grpc://host:port'
        (the chief's server) in a cluster.
    Returns:
      The tf.compat.v1.Session, which the caller closes (`with` does).
    """
    sess = tf1.Session(target, graph=built.graph, config=config)
    try:
        prepare_session(sess, built, load)
    except BaseException:
        sess.close()
        raise
    return sess


def prepare_session(sess, built, load=None):
    """init_op, then load(sess), then sync_op: what open_session runs on a new Session."""
    # A Saver restores in graph mode only under its graph (else it tries eagerly).
    with built.graph.as_default():
        sess.run(built.init_op)
        if load is not None:
            load(sess)
        sess.run(built.sync_op)


def load_variables(sess, variables, values):
    """Set variables to values: {name: variable} and {name: numpy array} (a subset).

    In one run, as Variable.load sets one: each variable's initializer fed the value
    instead of its initial value (a run per variable prepares the graph anew each
    time, 80 ms apiece on ResNet-50's graph).
    """
    chosen = [(variables[name], value) for name, value in values.items()]
    sess.run([variable.initializer for variable, _ in chosen],
             {variable.initializer.inputs[1]: value for variable, value in chosen})


def trace_options():
    """RunOptions for one fully traced sess.run, with the partition graphs TensorFlow placed."""
    return tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True)


def placement_options():
    """RunOptions for the placement audit's sess.run: the partition graphs TensorFlow placed
    (each node with its device), and no trace. A trace at HARDWARE_TRACE or above starts
    CUPTI on a GPU: error lines in every log there, and a slow first step."""
    return tf1.RunOptions(output_partition_graphs=True)


def step_options(wants):
    """The RunOptions of a step from the callbacks' wants_trace answers, or None.

    Each answer is False (nothing), True (a full trace: trace_options) or the
    RunOptions it needs (placement_options); the step gets all they ask for,
    so the audit's first step traced for --trace carries both.
    """
    options = None
    for want in wants:
        if want is False or want is None:
            continue
        options = options or tf1.RunOptions()
        options.MergeFrom(trace_options() if want is True else want)
    return options


def run_step(sess, source, step, fetches, options=None, run_metadata=None, feed=None):
    """Run one train step fed by source; None when its data has ended.

    Args:
      sess: the Session.
      source: the InputSource the graph was built with.
      step: the global step about to run.
      fetches: what to run (a dict, list or single tensor/op; the train op among them).
      options, run_metadata: passed to sess.run (e.g. to trace the step).
      feed: more {placeholder: value} to feed, or None.
    Returns:
      The values of fetches, or None at the end of the source's data.
    Raises:
      TowersError: the source failed (e.g. its loader raised), ended early,
        read corrupt records, or found a file of its data gone.
    """
    try:
        with input_errors(step):
            extra, source_feed = source.step(step)
        feed = {**(source_feed or {}), **feed} if feed else source_feed
        with input_errors(batch_step(step, extra)):
            values = sess.run({'fetches': fetches, 'extra': extra}, feed, options=options,
                              run_metadata=run_metadata)
    except tf.errors.OutOfRangeError:
        source.end_of_data()
        return None
    source.fetched(values['extra'])
    return values['fetches']


def batch_step(step, extra):
    """The step whose batch step's run reads, given the source's extra fetches.

    A staged source's run carries the StagingArea put of the next step's batch
    (towers/inputs/staging.py stage): its towers compute on a batch read a step
    earlier, so a file gone or corrupt in this run is the next step's to name.
    """
    puts = [fetch for fetch in extra or () if getattr(fetch, 'type', None) == 'Stage']
    return step + 1 if puts else step


@contextlib.contextmanager
def input_errors(step):
    """The input's own failures at a step, as one-line TowersErrors (run_step's, and a staged
    source's priming put)."""
    try:
        yield
    except tf.errors.DataLossError as e:
        # A shard damaged after its check (or read unchecked): say so in one line.
        raise TowersError('corrupt input data at step %d: %s'
                          % (step, op_error_summary(e))) from None
    except tf.errors.InvalidArgumentError as e:
        problem = bad_record(e.message)  # an image the input could not use (data/imagenet.py)
        if problem is None:
            raise
        raise TowersError('bad input record at step %d: %s; give --skip-bad-images to train '
                          'without it' % (step, problem)) from None
    except (tf.errors.NotFoundError, tf.errors.PermissionDeniedError) as e:
        # A file the input opens again each epoch (a records shard) was removed,
        # moved or made unreadable after the run checked it.
        raise TowersError('cannot read the input data at step %d: %s; put it back and run '
                          'again to resume' % (step, op_error_summary(e))) from None


def run_steps(sess, source, fetches, start_step, num_steps, run_options=None,
              clock=time.perf_counter, feed=None):
    """The StepLoop of train steps start_step .. num_steps - 1: `with run_steps(...) as steps`."""
    return StepLoop(sess, source, fetches, start_step, num_steps, run_options, clock, feed)


class StepLoop:
    """Train steps start_step .. num_steps - 1 from an InputSource.

    As a context manager it starts the source on entry and stops it on exit,
    also when the loop breaks or raises (then a failing stop is not allowed to
    hide the error in flight). Iterating it runs the steps: each yields a dict
    of the fetched values plus 'seconds' (the step's time, from asking the
    source for its batch to the end of the run) and, for a traced step,
    'run_metadata'. It ends early when the source's data does (a finite
    dataset input). `step` is the number of steps done so far.

    Args:
      sess: an open Session.
      source: the InputSource the graph was built with.
      fetches: {name: tensor or op} to run each step.
      start_step: the global step to start from (a resumed run's).
      num_steps: the step count to reach.
      run_options: callable(step) -> RunOptions or None, asked before each
        step (e.g. to trace one).
      clock: the timer.
      feed: callable(step) -> {placeholder: value} fed besides the source's,
        or None (a cluster's stop vote).
    """

    def __init__(self, sess, source, fetches, start_step, num_steps, run_options=None,
                 clock=time.perf_counter, feed=None):
        self.sess, self.source, self.fetches = sess, source, fetches
        self.step, self.num_steps = start_step, num_steps
        self.run_options, self.clock, self.feed = run_options, clock, feed

    def __enter__(self):
        self.source.start(self.sess, self.step, self.num_steps)
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is None:
            self.source.stop(self.sess)
            return False
        try:
            self.source.stop(self.sess)
        except Exception:  # noqa: BLE001 - the error in flight is the one to report
            pass
        return False

    def __iter__(self):
        while self.step < self.num_steps:
            values = self.run_one()
            if values is None:
                return
            yield values

    def run_one(self):
        """Run the next step; its values, or None at the end of the source's data."""
        options = self.run_options(self.step) if self.run_options else None
        # Options that only set a timeout (a cluster's steps) trace nothing: no metadata.
        traced = options is not None and (options.trace_level != tf1.RunOptions.NO_TRACE
                                          or options.output_partition_graphs)
        metadata = tf1.RunMetadata() if traced else None
        start = self.clock()
        values = run_step(self.sess, self.source, self.step, self.fetches, options, metadata,
                          self.feed(self.step) if self.feed else None)
        if values is None:
            return None
        values = dict(values, seconds=self.clock() - start)
        if metadata is not None:
            values['run_metadata'] = metadata
        self.step += 1
        return values
