"""`towers export`: a SavedModel of one tower that plain TensorFlow serves.

Built from a training checkpoint (towers/checkpoints.py reads it): images ->
probabilities and classes, no optimizer slots, no step; the moving averages
for a run trained with --ema. float32 whatever the run trained in: a
--precision bf16 or fp16 run's checkpoint holds float32 master weights, and the
exported graph computes in float32 on them. The folder appears whole or not at all.
"""
import os
import shutil
import tempfile

import tensorflow as tf

from towers.checkpoints import check_checkpoint, restore_map
from towers.errors import TowersError
from towers.model import normalize

tf1 = tf.compat.v1

SIGNATURE = 'serving_default'


def export_saved_model(model_fn, input_shape, checkpoint, export_dir, ema=False,
                       normalization=None):
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
      normalization: (mean, std) per channel the run's training input applied
        (--mean/--std): the SavedModel applies it to the [0, 1] images it takes.
    """
    if os.path.exists(export_dir):
        raise TowersError('%s already exists; export into a new folder' % export_dir)
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix='.export.')
    try:
        with tf.Graph().as_default() as graph:
            images = tf1.placeholder(tf.float32, [None] + list(input_shape), name='images')
            logits = model_fn(normalize(images, normalization), False)
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
