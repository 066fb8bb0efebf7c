"""--mean/--std normalise the training input; evaluation and the SavedModel, which take
images in [0, 1], apply the same normalisation before the model."""
import numpy as np
import tensorflow as tf

from towers import checkpoints, models
from towers.data import DataSet
from towers.deviceplan import local_plan
from towers.evaluation import evaluate
from towers.graph import build_eval_graph
from towers.model import ClassifierModel
from towers.tools.export import export_saved_model

tf1 = tf.compat.v1
SHAPE, CLASSES = (8, 8, 3), 4
NORMALIZATION = ((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))


def _checkpoint(tmp_path):
    """A checkpoint of small_convnet's variables, at their random start."""
    model_fn = models.build_model('small_convnet', SHAPE, CLASSES)
    with tf.Graph().as_default():
        tf1.set_random_seed(1)
        model_fn(tf.zeros((1,) + SHAPE), False)
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return model_fn, saver.save(sess, str(tmp_path / 'model.ckpt'))


def _images(count=10):
    return np.random.RandomState(0).uniform(size=(count,) + SHAPE).astype(np.float32)


def _normalized(images):
    mean, std = (np.asarray(v, np.float32) for v in NORMALIZATION)
    return (images - mean) / std


def _evaluate(model_fn, checkpoint, images, normalization):
    labels = np.arange(len(images)) % CLASSES
    model = ClassifierModel(model_fn, SHAPE, CLASSES, normalization=normalization)
    built = build_eval_graph(model, local_plan(['/cpu:0']))
    with tf1.Session(graph=built.graph) as sess:
        checkpoints.restore(sess, built.saver, checkpoint, built.variables)
        return evaluate(sess, built, DataSet(images, labels, num_classes=CLASSES), 4)


def test_evaluation_normalises_as_training_did(tmp_path):
    model_fn, checkpoint = _checkpoint(tmp_path)
    images = _images()
    normalised = _evaluate(model_fn, checkpoint, images, NORMALIZATION)
    by_hand = _evaluate(model_fn, checkpoint, _normalized(images), None)
    raw = _evaluate(model_fn, checkpoint, images, None)
    np.testing.assert_allclose(normalised['loss'], by_hand['loss'], rtol=1e-6)
    assert abs(normalised['loss'] - raw['loss']) > 1e-3  # so it is not a no-op


def test_the_saved_model_normalises_as_training_did(tmp_path):
    model_fn, checkpoint = _checkpoint(tmp_path)
    images = _images()

    def probabilities(export_dir, fed):
        with tf.Graph().as_default(), tf1.Session() as sess:
            meta = tf1.saved_model.loader.load(sess, ['serve'], export_dir)
            signature = meta.signature_def['serving_default']
            return sess.run(signature.outputs['probabilities'].name,
                            {signature.inputs['images'].name: fed})
    export_saved_model(model_fn, SHAPE, checkpoint, str(tmp_path / 'normalising'),
                       normalization=NORMALIZATION)
    export_saved_model(model_fn, SHAPE, checkpoint, str(tmp_path / 'plain'))
    np.testing.assert_allclose(probabilities(str(tmp_path / 'normalising'), images),
                               probabilities(str(tmp_path / 'plain'), _normalized(images)),
                               rtol=1e-5, atol=1e-7)


def test_a_run_records_its_normalisation_for_eval(tmp_path, capsys):
    import json

    from towers.cli import main
    logdir = str(tmp_path / 'run')
    assert main(['train', '--model', 'small_convnet', '--input', 'dataset', '--mean', '0.13',
                 '--std', '0.3', '--steps', '2', '--batch-size', '8', '--eval-every', '0',
                 '--devices', 'cpu', '--logdir', logdir, '--no-tensorboard']) == 0
    with open(logdir + '/run.json') as f:
        assert json.load(f)['normalization'] == [[0.13], [0.3]]
    capsys.readouterr()
    assert main(['eval', '--devices', 'cpu', '--logdir', logdir]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith('(1000 images)')
