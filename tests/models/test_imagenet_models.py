"""The tf_cnn_benchmarks nets: their reference parameter counts and FLOPs, and N towers that
train as one device on each (at a small input, so that it runs here)."""
import numpy as np
import pytest
import tensorflow as tf

from tests.harness import fed, open_graph, saved_variables, train_steps
from towers import models
from towers.deviceplan import local_plan
from towers.graph import build_training_graph
from towers.model import ClassifierModel
from towers.precision import Precision
from towers.tools.explain import inference_counts

tf1 = tf.compat.v1


def _parameters(model_fn, shape):
    """The trainable parameters of the net, built for inference: the same variables without
    the training graph's batch-norm updates.

    Each trainable variable the net asks tf1.get_variable for is counted once by its name and
    handed back as a placeholder of its shape: without real variables' handles, initializers
    and reads ResNet-152 is 2,858 ops (7,853 with them, 12,193 for training), built in 2.5 s
    instead of 7.6 here. A variable made other than by get_variable is still made, and
    counted too."""
    asked = {}

    def placeholder(getter, name, shape, dtype, trainable, **kwargs):
        if trainable:
            asked[name] = tf.TensorShape(shape).num_elements()
        return tf1.placeholder(dtype, shape)

    with tf.Graph().as_default():
        with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=placeholder):
            model_fn(tf1.placeholder(tf.float32, [None] + list(shape)), False)
        return sum(asked.values()) + sum(v.shape.num_elements()
                                         for v in tf1.trainable_variables())


def _designed(name):
    shape, classes = models.DESIGNS[name]
    return models.build_model(name, shape, classes), shape


@pytest.mark.parametrize('name,count', [
    # torchvision's counts, the same nets (v1.5 moves a stride, not a weight).
    ('resnet50', 25_557_032), ('resnet101', 44_549_160), ('resnet152', 60_192_808),
    # conv 11x11x3x64, 5x5x64x192, 3x3x192x384, 3x3x384x384, 3x3x384x256 with biases
    # (2,322,112 + 884,992), fc 9216x4096, 4096x4096, 4096x1000 with biases.
    ('alexnet', 3_207_104 + 37_752_832 + 16_781_312 + 4_097_000),
    # 227*227*3 -> 1 -> 4096 -> 1000, with biases.
    ('trivial', 154_588 + 8_192 + 4_097_000)])
def test_parameters_match_the_reference_architectures(name, count):
    assert _parameters(*_designed(name)) == count


def test_vgg16_and_inception3_have_keras_applications_parameters():
    """keras.applications builds the same two nets (Keras only as the reference, here)."""
    import keras
    from keras.src.backend.common import global_state
    # Built in a StatelessScope that does not initialise them, Keras' variables have their
    # shapes and no values: leaving a plain one draws all 162 million random values, for
    # nothing (3.5 to 4 CPU-s here, of the 4 to 7 this test took). Keras keeps the variables
    # it has not initialised in a global list, for the next scope left to draw (a functional
    # model's build leaves one): the list is put back as it was.
    waiting = list(global_state.get_global_attribute('uninitialized_variables', []))
    try:
        with keras.StatelessScope(initialize_variables=False):
            vgg = keras.applications.VGG16(weights=None)
            inception = keras.applications.InceptionV3(weights=None)
    finally:
        global_state.set_global_attribute('uninitialized_variables', waiting)
    assert _parameters(*_designed('vgg16')) == vgg.count_params() == 138_357_544
    trainable = sum(int(np.prod(w.shape)) for w in inception.trainable_weights)
    assert _parameters(*_designed('inception3')) == trainable == 23_817_352


@pytest.mark.parametrize('name,published', [
    # Multiply-accumulates of one 224x224 (299 for inception3) forward pass, as the papers
    # and torchvision's model zoo publish them (ResNet-50 ~4.1 G).
    ('resnet50', 4.09e9), ('vgg16', 15.47e9), ('inception3', 5.71e9)])
def test_flops_per_image_match_the_published_figures(name, published):
    _, macs, flops = inference_counts(*_designed(name))
    assert abs(macs / published - 1) < 0.02, macs
    assert flops > 2 * macs  # every other op (batch norm, ReLU, pooling) counts too


# At the smallest input each net allows, so that steps run here.
SMALL = {'resnet50': (32, 32, 3), 'resnet20': (32, 32, 3), 'inception3': (75, 75, 3),
         'vgg16': (32, 32, 3), 'alexnet': (67, 67, 3), 'trivial': (8, 8, 3)}


def _graph(name, devices, batches, update='parameter_server', precision=None, sync_bn=False,
           optimizer='momentum', **options):
    shape = SMALL[name]
    model = ClassifierModel(models.build_model(name, shape, 5, **options), shape, 5,
                            optimizer=optimizer)
    return build_training_graph(model, local_plan(devices, variable_update=update), seed=1,
                                source=fed(batches), learning_rate=0.01, precision=precision,
                                sync_bn=sync_bn, evaluation=False)


def _steps(sess, graph, steps):
    """Train the open TrainGraph `steps` steps from its source; [loss of each step]."""
    return [step['loss'] for step in train_steps(sess, graph, steps, {'loss': graph.loss})]


def _train(name, devices, batches, initial=None, update='parameter_server', precision=None,
           read=True, **options):
    """Train the net a step a batch from `initial` {saved name: value} (None: its own initial
    values); ({saved name: value} after, or None where not to read them, [loss of each
    step]). Only what a test checks is read (VGG-16's variables and slots: 67 million
    values)."""
    graph = _graph(name, devices, batches, update, precision, **options)
    with open_graph(graph, initial) as sess:
        losses = _steps(sess, graph, len(batches))
        return (sess.run(saved_variables(graph)) if read else None), losses


def _train_from_its_start(graph, steps):
    """Train the TrainGraph `steps` steps from its own initial values; (saved {name: value}
    before, after, [loss of each step]). One graph, where a one-device graph built to hand
    it initial values would take as long again (a big net's graph takes longer to build than
    its steps to run)."""
    variables = saved_variables(graph)
    with open_graph(graph) as sess:
        initial = sess.run(variables)
        losses = _steps(sess, graph, steps)
        return initial, sess.run(variables), losses


def _batches(name, count=2, size=6):
    rng = np.random.RandomState(0)
    return [(rng.rand(size, *SMALL[name]).astype(np.float32), rng.randint(0, 5, size))
            for _ in range(count)]


def _assert_close(got, expected, rtol, atol, name):
    """np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol), its condition
    checked first in a few passes over the arrays: its own checks (NaNs and infinities where
    they are, then the condition) took 4x as long, 1.1 of VGG-16's 12 CPU-s here (67
    million values), and now run only to say what failed. A finite atol says expected holds
    no NaN or infinity; a NaN or an infinity in got then fails the condition too."""
    if not (np.isfinite(atol)
            and np.all(np.abs(got - expected) <= atol + rtol * np.abs(expected))):
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.exact
@pytest.mark.parametrize('name', ['alexnet', 'trivial', 'vgg16'])
def test_two_towers_train_the_nets_without_batch_norm_as_one_device(name):
    """Without dropout (each tower draws its own mask), N towers compute one device's steps."""
    options = {} if name == 'trivial' else {'dropout_rate': 0.0}
    batches = _batches(name)
    initial, expected, expected_losses = _train_from_its_start(
        _graph(name, ['/cpu:0'], batches, **options), len(batches))
    got, losses = _train(name, ['/cpu:0', '/cpu:1'], batches, initial, **options)
    assert losses[1] != losses[0]  # it trained
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    # Float rounding of sums in another order: a tower's conv gradient sums half the batch,
    # and oneDNN's AVX2 kernels order a sum by its size (one element of 307,200 in AlexNet's
    # conv2 momentum came 1.04x past 1e-6 of the largest, one of VGG-16's biases 1.8x; AVX-512
    # and Eigen stayed inside). A tower weighted wrongly is off by tenths.
    for variable in expected:
        _assert_close(got[variable], expected[variable], rtol=1e-4,
                      atol=1e-5 * np.abs(expected[variable]).max(), name=variable)


@pytest.mark.parametrize('name,precision,update,sync_bn', [
    ('inception3', Precision('fp16', 1.0), 'parameter_server', False),
    ('resnet50', 'bf16', 'replicated', False),
    ('resnet20', 'bf16', 'replicated', True)],
    ids=['inception3-fp16', 'resnet50-bf16', 'resnet20-bf16-sync'])
def test_two_towers_train_the_batch_norm_nets(name, precision, update, sync_bn):
    """Inception v3 in fp16, each tower its own batch statistics and tower 0's moving
    averages; ResNet-50 in bf16, replicated; the CIFAR ResNet-20 in bf16, replicated, with
    --sync-bn. (--sync-bn's pooled moments more than double ResNet-50's two-tower graph,
    13,739 ops to 32,395, and this test's CPU, 20 s to 47 s here; ResNet-20 pools the same
    way at 19 batch norms instead of 53.)

    fp16 with a fixed loss scale of 1: at 75x75 the last batch norms see 1x1 maps of three
    images, whose gradients overflow float16 when scaled by 128, and a dynamic scale spends
    the first steps halving down to one that fits. (That N towers with --sync-bn equal one
    device is tested on small nets, tests/test_sync_bn.py: at 32x32 ResNet-50's last maps
    are 1x1, and three values per tower make a batch norm chaotic.)
    """
    # Plain SGD: a step moves a variable by its gradient alone, so that every variable moving
    # still says each got a gradient (and each moving average its update); momentum's slots,
    # a copy of every trainable variable, were 17% of ResNet-50's graph (16,621 ops to
    # 13,739) and about a tenth of this test's CPU. Slots on replicas and in a precision:
    # tests/test_variables.py, tests/test_precision.py.
    graph = _graph(name, ['/cpu:0', '/cpu:1'], _batches(name), update, precision, sync_bn,
                   optimizer='sgd')
    initial, trained, losses = _train_from_its_start(graph, 2)
    assert np.all(np.isfinite(losses)) and losses[1] != losses[0]
    moved = [v for v in initial if not np.array_equal(trained[v], initial[v])]
    assert len(moved) == len(initial)  # every variable, the moving averages included


@pytest.mark.parametrize('name,precision,update', [
    ('vgg16', 'bf16', 'parameter_server'), ('alexnet', 'fp16', 'replicated'),  # (dynamic)
    ('trivial', 'bf16', 'replicated')])
def test_the_nets_without_batch_norm_train_in_a_mixed_precision(name, precision, update):
    """Two steps on two towers in bf16 or fp16 (loss-scaled): finite losses, the second
    after an update. (The batch norm nets: above.) One image a tower: nothing here pools
    over a batch, and an image is 0.9 s of each of VGG-16's bf16 steps here, emulated."""
    _, losses = _train(name, ['/cpu:0', '/cpu:1'], _batches(name, size=2), None, update,
                       precision, read=False)
    assert np.all(np.isfinite(losses)) and losses[1] != losses[0], losses
