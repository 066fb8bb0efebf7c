"""What a training logdir holds, written and read in one place.

  model.ckpt-STEP.*, checkpoint   Saver checkpoints: one copy of each variable
                                  (whatever the strategy) and the data order
  best/                           the best checkpoint on validation, best.json
  run.json                        which model and dataset made them, so that
                                  `towers eval` and `towers export` need no
                                  flags repeated

Nothing a fault can leave behind is read as good: a checkpoint is listed in
the `checkpoint` state file only once all its files are whole (the graph,
then the variables, then the list), a save that fails (a full disk) removes
what it had begun, weights that hold NaN or Inf are never saved, a state file
that cannot be read stops the run instead of starting it over, and a reader
takes the newest checkpoint that reads back whole. What a killed run left half
written is removed when the next run takes the logdir. The Trainer, the
callbacks and the tools all use these functions.
"""
import glob
import json
import math
import os
import re
import shutil

import tensorflow as tf

from towers.data.atomic import atomic_output
from towers.errors import TowersError, op_error_summary
from towers.names import BEST_DIR, CHECKPOINT_NAME, RUN_FILE

tf1 = tf.compat.v1

STATE_FILE = 'checkpoint'  # TensorFlow's list of a folder's checkpoints, newest last
# A checkpoint's data files: prefix.data-00000-of-00002, prefix.data-00001-of-00002.
_DATA_FILE = re.compile(r'\.data-(\d{5})-of-(\d{5})$')


def write_run(logdir, **info):
    """Record how a run was made (model, dataset, ...) in logdir/run.json, atomically."""
    with atomic_output(os.path.join(logdir, RUN_FILE), suffix='.json') as out:
        out.write(json.dumps(info, indent=1, sort_keys=True).encode())


def read_run(logdir):
    """The run.json of a logdir; TowersError if there is none."""
    path = os.path.join(logdir, RUN_FILE)
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except FileNotFoundError:
        raise TowersError('%s has no %s: point {logdir} at a folder `towers train --logdir` '
                          'wrote' % (logdir, RUN_FILE)) from None
    except PermissionError as e:
        raise TowersError('cannot read %s: %s' % (path, e.strerror)) from None
    except ValueError as e:
        raise TowersError('cannot read %s: %s' % (path, e)) from None


def checkpoint_state(folder):
    """The CheckpointState of folder's `checkpoint` file, or None when it has none.

    TensorFlow's get_checkpoint_state also answers None for a state file it
    cannot read or parse, and a run would then start over on top of the
    checkpoints listed there, and drop them from the list; this raises.

    Raises:
      TowersError: the state file is there but cannot be read or is damaged.
    """
    path = os.path.join(folder, STATE_FILE)
    try:
        with open(path, 'rb') as f:
            f.read(1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TowersError('cannot read %s: %s; make it readable (it lists the checkpoints '
                          'there), or use another {logdir}' % (path, e.strerror)) from None
    try:
        state = tf1.train.get_checkpoint_state(folder)
    except ValueError:  # parsed, but names no checkpoint
        state = None
    if state is None:
        raise TowersError('%s is damaged: it does not list checkpoints; move the folder '
                          'aside (its checkpoints are still there) and train into another '
                          '{logdir}' % path)
    return state


def reads_back(prefix):
    """Whether the checkpoint's index reads back and its data files hold every tensor.

    The data files are read when restoring, after the choice was made: here
    they must all be there, together at least as large as the tensors the
    index lists, so that one cut short (a copy that stopped, a disk error) is
    passed over.
    """
    try:
        reader = tf1.train.NewCheckpointReader(prefix)
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError):
        return False
    needed = sum(dtypes[name].size * math.prod(shape) for name, shape in shapes.items()
                 if dtypes[name].is_numpy_compatible and dtypes[name] != tf.string)
    shards = {}
    for path in glob.glob(glob.escape(prefix) + '.data-*'):
        match = _DATA_FILE.search(path)
        if match:
            shards[int(match.group(1))] = (int(match.group(2)), os.path.getsize(path))
    counts = {count for count, _ in shards.values()}
    if len(counts) != 1 or sorted(shards) != list(range(counts.pop())):
        return False
    return sum(size for _, size in shards.values()) >= needed


def newest_complete(folder):
    """The newest checkpoint in folder that reads back whole, or None.

    The state file lists a checkpoint only after it was written; one whose
    files were damaged or removed since is passed over for the one before it.

    Raises:
      TowersError: the state file cannot be read (checkpoint_state).
    """
    state = checkpoint_state(folder)
    if state is None:
        return None
    listed = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    for path in reversed(listed):
        path = path if os.path.isabs(path) else os.path.join(folder, path)
        if reads_back(path):
            return path
    return None


def to_restore(folder):
    """(the checkpoint to restore from folder, the newest listed) or (None, None).

    The newest complete one; when no listed one is whole, the newest listed,
    so that restoring it says what is wrong with it.
    """
    state = checkpoint_state(folder)
    if state is None:
        return None, None
    return newest_complete(folder) or state.model_checkpoint_path, state.model_checkpoint_path


def find_checkpoint(logdir, checkpoint=None, best=False):
    """The checkpoint to use: the one given, the best one, or the newest complete one.

    Raises:
      TowersError: none there, or both checkpoint and best asked for.
    """
    if best and checkpoint:
        raise TowersError('give {best} or {checkpoint}, not both')
    if checkpoint:
        if not tf1.train.checkpoint_exists(checkpoint):
            raise TowersError('no checkpoint at %s' % checkpoint)
        return checkpoint
    if best:
        folder = os.path.join(logdir, BEST_DIR)
        if not os.path.isdir(folder):
            raise TowersError('%s has no best checkpoint: it is kept when training evaluates '
                              'on validation data with {logdir}' % logdir)
        logdir = folder
    latest, _ = to_restore(logdir)
    if latest is None:
        raise TowersError('no checkpoint in %s; train with --logdir %s first' % (logdir, logdir))
    return latest


ANOTHER = 'use an older one with {checkpoint}'  # what eval and export can do instead


def check_checkpoint(checkpoint, variables, advice=ANOTHER):
    """Raise TowersError unless the checkpoint holds every variable, same shape.

    Args:
      checkpoint: a checkpoint prefix.
      variables: the graph's variables that will be restored, or a dict
        checkpoint name -> variable (a Saver's var_list).
      advice: what the caller can do about a checkpoint that does not read.
    Raises:
      TowersError: names the missing variables and those with other shapes
        (another model, optimizer or input shape).
    """
    saved = dict(_listed_shapes(checkpoint, advice))
    if not isinstance(variables, dict):
        variables = {v.op.name: v for v in variables}
    missing, reshaped = [], []
    for name, var in variables.items():
        shape = var.shape.as_list()
        if name not in saved:
            missing.append(name)
        elif saved[name] != shape:
            reshaped.append('%s %s here, %s there' % (name, shape, saved[name]))
    if missing or reshaped:
        problems = (['missing: ' + ', '.join(missing[:6]) + (' ...' if len(missing) > 6 else '')]
                    if missing else []) + (['other shapes: ' + '; '.join(reshaped[:4])]
                                           if reshaped else [])
        raise TowersError('checkpoint %s does not match this model (%s); use another {logdir} '
                          'or the flags it was trained with' % (checkpoint, ' | '.join(problems)))


def restore(sess, saver, checkpoint, variables, advice=ANOTHER, optional=None):
    """Restore a checkpoint with saver, or say plainly why it does not fit.

    Args:
      variables: the saver's var_list, checkpoint name -> variable.
      advice: as for check_checkpoint.
      optional: (names, a Saver of the other variables) from optional_saver:
        variables a checkpoint may lack as a whole (a loss scale, which a run of
        another precision has not), left as they are; or None.
    Returns:
      The names of the optional variables left at their initial values.
    """
    fresh = []
    if optional is not None:
        names, others = optional
        if not names & set(_listed(checkpoint, advice)):
            fresh, saver = sorted(names), others
            variables = {k: v for k, v in variables.items() if k not in names}
    check_checkpoint(checkpoint, variables, advice)
    try:
        saver.restore(sess, checkpoint)
    except tf.errors.OpError as e:
        raise TowersError('cannot read checkpoint %s (%s); it may be truncated: %s'
                          % (checkpoint, op_error_summary(e), advice)) from None
    return fresh


def optional_saver(variables, loss_scale):
    """(names, a Saver of the rest) for restore's optional, or None without a loss scale."""
    if loss_scale is None or not loss_scale.variables:
        return None
    names = {name for name, var in variables.items() if var in loss_scale.variables}
    return names, tf1.train.Saver({k: v for k, v in variables.items() if k not in names})


def _listed(checkpoint, advice):
    return [name for name, _ in _listed_shapes(checkpoint, advice)]


def _listed_shapes(checkpoint, advice):
    try:
        return tf1.train.list_variables(checkpoint)
    except tf.errors.OpError as e:
        raise TowersError('cannot read checkpoint %s (%s); it may be truncated: %s'
                          % (checkpoint, op_error_summary(e), advice)) from None


def restore_map(ema):
    """Checkpoint name -> variable for the default graph's variables.

    With ema, each trainable variable is read from its moving average's name
    in the checkpoint (how the tutorial's cifar10_eval restores).
    """
    if ema:
        return tf1.train.ExponentialMovingAverage(0.0).variables_to_restore()
    return {v.op.name: v for v in tf1.global_variables()}


def make_saver(variables, keep):
    """A Saver of {name: variable} keeping the newest `keep`, with relative paths.

    Relative paths in the state file: a logdir copied or moved still resumes
    from its own files, not from the folder it was written in.
    """
    return tf1.train.Saver(variables, max_to_keep=keep, save_relative_paths=True)


def save(saver, sess, folder, step):
    """Save a checkpoint at folder/model.ckpt-STEP; its path.

    The graph (.meta) is written first, then the variables (.index, .data),
    then the state file that lists the checkpoint; only then does the Saver
    delete the oldest one it keeps. (TensorFlow's own order writes the graph
    last, after the list names the checkpoint and after the oldest is gone.)
    A failed save (a full disk, a folder made read-only) is one TowersError
    line, and what it had begun writing is removed: the state file still
    names the previous checkpoint, whose files are untouched.
    """
    prefix = os.path.join(folder, CHECKPOINT_NAME)
    try:
        with sess.graph.as_default():
            saver.export_meta_graph('%s-%d.meta' % (prefix, step))
        return saver.save(sess, prefix, global_step=step, write_meta_graph=False)
    except tf.errors.OpError as e:
        _remove_partial(prefix, step)
        raise TowersError('cannot write checkpoint %s-%d: %s'
                          % (prefix, step, op_error_summary(e))) from None


def _remove_partial(prefix, step):
    # TensorFlow writes a checkpoint's files and the state file under
    # temporary names, then renames them; either may be left half-made.
    stem = glob.escape('%s-%d' % (prefix, step))
    state = glob.escape(os.path.join(os.path.dirname(prefix), STATE_FILE))
    for path in glob.glob(stem + '.*') + glob.glob(stem + '_temp*') + glob.glob(state + '.tmp*'):
        remove_path(path)


def remove_path(path):
    try:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    except OSError:
        pass  # what cannot be removed is not listed in the state file either


def weights_finite():
    """Scalar bool op: every float global variable of the default graph is finite."""
    with tf1.name_scope('weights_finite'):
        checks = []
        for var in tf1.global_variables():
            if var.dtype.base_dtype.is_floating:
                with tf.device(var.device):
                    checks.append(tf.reduce_all(tf.math.is_finite(var)))
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def check_weights(sess, finite_op, step, last_saved=None):
    """Refuse to save weights that hold NaN or Inf (a step can overflow them with a finite loss)."""
    if not sess.run(finite_op):
        raise TowersError('the weights hold NaN or Inf after step %d, so no checkpoint was '
                          'written%s; lower {learning_rate}'
                          % (step, ' (%s, saved before it, is intact)' % last_saved
                             if last_saved else ''))
