"""What a run leaves behind, and what is done with it afterwards.

A training --logdir holds the Saver checkpoints and `run.json` (which model and
dataset made them), so that `towers eval --logdir DIR` and `towers export`
need no flags repeated. Export writes a SavedModel of one tower, images ->
probabilities and classes, that plain TensorFlow loads without this package.
"""
import json
import os
import shutil
import tempfile

import tensorflow as tf

from towers.data.atomic import atomic_output
from towers.errors import TowersError, op_error_summary
from towers.graph import restore_map

tf1 = tf.compat.v1

RUN_FILE = 'run.json'
SIGNATURE = 'serving_default'


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
        raise TowersError('%s has no %s: point --logdir at a folder `towers train --logdir` '
                          'wrote' % (logdir, RUN_FILE)) from None
    except ValueError as e:
        raise TowersError('cannot read %s: %s' % (path, e)) from None


def find_checkpoint(logdir, checkpoint=None):
    """The checkpoint to use: the one given, or the newest in logdir."""
    if checkpoint:
        if not tf1.train.checkpoint_exists(checkpoint):
            raise TowersError('no checkpoint at %s' % checkpoint)
        return checkpoint
    latest = tf1.train.latest_checkpoint(logdir)
    if latest is None:
        raise TowersError('no checkpoint in %s; train with --logdir %s first' % (logdir, logdir))
    return latest


def check_checkpoint(checkpoint, variables):
    """Raise TowersError unless the checkpoint holds every variable, same shape.

    Args:
      checkpoint: a checkpoint prefix.
      variables: the graph's variables that will be restored, or a dict
        checkpoint name -> variable (a Saver's var_list).
    Raises:
      TowersError: names the missing variables and those with other shapes
        (another model, optimizer or input shape).
    """
    try:
        saved = dict(tf1.train.list_variables(checkpoint))
    except tf.errors.OpError as e:
        raise TowersError('cannot read checkpoint %s (%s); it may be truncated: use an older '
                          'one with --checkpoint' % (checkpoint, op_error_summary(e))) from None
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
        raise TowersError('checkpoint %s does not match this model (%s); use another --logdir '
                          'or the flags it was trained with' % (checkpoint, ' | '.join(problems)))


def restore(sess, saver, checkpoint, variables):
    """Restore a checkpoint with saver, or say plainly why it does not fit.

    Args:
      variables: the saver's var_list, checkpoint name -> variable.
    """
    check_checkpoint(checkpoint, variables)
    try:
        saver.restore(sess, checkpoint)
    except tf.errors.OpError as e:
        raise TowersError('cannot read checkpoint %s (%s); it may be truncated: use an older '
                          'one with --checkpoint' % (checkpoint, op_error_summary(e))) from None


def save(saver, sess, prefix, step):
    """saver.save, with a full disk or an unwritable folder as a one-line TowersError."""
    try:
        return saver.save(sess, prefix, global_step=step)
    except tf.errors.OpError as e:
        raise TowersError('cannot write checkpoint %s-%d: %s' % (prefix, step, op_error_summary(e))) \
            from None



def export_saved_model(model_fn, input_shape, checkpoint, export_dir, ema=False):
    """Write a one-tower inference SavedModel from a training checkpoint.

    Signature 'serving_default': images [batch, H, W, C] float32 in [0, 1]
    -> probabilities [batch, K] float32 and classes [batch] int64. The
    folder appears whole or not at all.

    Args:
      model_fn: the model the checkpoint was trained with.
      input_shape: (H, W, C).
      checkpoint: a checkpoint prefix.
      export_dir: must not exist yet.
      ema: export the moving averages of the weights (a run trained with
        --ema) instead of the weights themselves.
    """
    if os.path.exists(export_dir):
        raise TowersError('%s already exists; export into a new folder' % export_dir)
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix='.export.')
    try:
        with tf.Graph().as_default() as graph:
            images = tf1.placeholder(tf.float32, [None] + list(input_shape), name='images')
            logits = model_fn(images, False)
            probabilities = tf.nn.softmax(logits, name='probabilities')
            classes = tf.argmax(logits, axis=1, name='classes')
            # Only the model's variables: optimizer slots and the step stay behind.
            variables = restore_map(ema)
            check_checkpoint(checkpoint, variables)
            saver = tf1.train.Saver(variables)
            with tf1.Session(graph=graph) as sess:
                saver.restore(sess, checkpoint)
                builder = tf1.saved_model.Builder(os.path.join(staging, 'model'))
                signature = tf1.saved_model.predict_signature_def(
                    inputs={'images': images},
                    outputs={'probabilities': probabilities, 'classes': classes})
                builder.add_meta_graph_and_variables(
                    sess, [tf1.saved_model.tag_constants.SERVING],
                    signature_def_map={SIGNATURE: signature})
                builder.save()
        os.replace(os.path.join(staging, 'model'), export_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return export_dir
