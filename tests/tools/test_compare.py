"""towers bench --compare: the peers it times, the FLOPs it counts, the plot it draws."""
import functools
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.harness import record_eager_starts
from towers import data, models
from towers.gradients import average_gradients
from towers.models import layers
from towers.tools import compare, peers, rates

tf1 = tf.compat.v1

SHAPE = (28, 28, 1)


def _small_yardsticks(monkeypatch=None):
    """The yardsticks measured as the command measures them, on a conv of batch 16 and a 512
    matmul: at the hardware's sizes (batch 128, 2048) they cost a comparison 5 to 7 of its
    CPU-s, and a conv share reads against any measured rate (tests/tools/test_rates.py times
    them)."""
    small = functools.partial(rates.kernel_rates, conv=dict(batch=16), matmul_size=512)
    if monkeypatch:
        monkeypatch.setattr(rates, 'kernel_rates', small)
    else:
        rates.kernel_rates = small


def test_the_tutorials_average_is_towers_average_on_equal_shares():
    with tf.Graph().as_default():
        var = tf1.get_variable('v', [3], initializer=tf1.zeros_initializer())
        grads = [[(tf.constant([1.0, 2.0, 3.0]), var)], [(tf.constant([3.0, 0.0, -1.0]), var)]]
        (tutorial, _), = peers.tutorial_average_gradients(grads)
        (ours, _), = average_gradients(grads)
        with tf1.Session() as sess:
            tutorial, ours = sess.run([tutorial, ours])
    np.testing.assert_array_equal(tutorial, [2.0, 1.0, 1.0])
    np.testing.assert_array_equal(ours, tutorial)


def test_training_flops_are_counted_on_the_ops_a_step_runs():
    # One dense layer 8 -> 4 on a batch of 8: forward MatMul 2*8*8*4 = 512, BiasAdd 32,
    # weight-gradient MatMul 512, BiasAddGrad 8*4-4 = 28, the cross-entropy gradient's
    # Mul 32, the Mean 8 and its gradient 8: 1,132 / 8 = 141.5 per image. Neither the
    # initializers nor the input's gradient (no step computes them) are counted.
    model_fn = lambda images, training: layers.dense(images, 4, name='logits')  # noqa: E731
    assert compare.training_flops_per_image(model_fn, (2, 2, 2), 4, batch=8) == 141.5


def test_keras_twins_exist_for_the_simple_nets_and_the_imagenet_ones():
    assert peers.keras_twin('resnet20', (32, 32, 3), 10) is None
    twin = peers.keras_twin('mnist_convnet', SHAPE, 10)()
    # The same parameters as towers' mnist_convnet: 3,274,634.
    assert twin.count_params() == 3_274_634


@pytest.mark.parametrize('name', ['resnet50', 'vgg16'])
def test_the_keras_applications_twins_have_the_nets_parameters(name):
    """keras.applications' nets, topped as towers' (VGG-16 with its two dense layers). Keras'
    ResNet50 gives its convolutions biases (which the batch norm after each makes moot):
    the same parameters besides those."""
    import keras
    shape = (32, 32, 3)
    with tf.Graph().as_default():
        # In inference mode: the same variables, without the batch norms' update ops (ResNet-50
        # builds in three quarters of the CPU).
        models.build_model(name, shape, 7)(tf.zeros((1,) + shape), False)
        ours = sum(v.shape.num_elements() for v in tf.compat.v1.trainable_variables())
    twin = peers.keras_twin(name, shape, 7)()
    trainable = sum(int(np.prod(w.shape)) for w in twin.trainable_weights)
    trunk = twin.layers[0]
    conv_biases = sum(layer.filters for layer in trunk.layers
                      if isinstance(layer, keras.layers.Conv2D) and layer.use_bias)
    assert trainable - (conv_biases if name == 'resnet50' else 0) == ours


def test_compare_times_every_row_and_draws_the_plot(tmp_path, monkeypatch):
    _small_yardsticks(monkeypatch)
    # The first 64 images: every row steps through them as through all 4000 (no row's speed
    # is asserted), and the plain graph and Keras, which hold theirs as a tf.data constant,
    # build in a fraction of the time (2 of this test's 10 CPU-s).
    train = data.load_dataset('mnist_sample').train
    train = data.DataSet(train.images[:64], train.labels[:64])
    lines = []
    plot = tmp_path / 'speed.png'
    # In this process eager TensorFlow already runs on one CPU device: Keras can take
    # part at 1 tower only (the command line starts fresh: see the test below).
    tf.config.list_logical_devices()
    rows = compare.run_compare(
        'small_convnet', models.build_model('small_convnet', SHAPE, 10), SHAPE, 10, [1, 2],
        batch_size=8, dataset=train, modes=('synthetic', 'feed'),
        variable_updates=('parameter_server', 'replicated'), xla=True, warmup_steps=1,
        timed_steps=2, plot=str(plot), log=lines.append, devices='cpu')
    configs = [(r['config'], r['towers']) for r in rows]
    per_count = ['towers parameter_server/synthetic', 'towers parameter_server/feed',
                 'towers replicated/synthetic', 'towers replicated/feed',
                 'towers parameter_server/synthetic +xla', 'textbook', 'plain graph']
    assert configs == [(c, 1) for c in per_count + ['keras mirrored']] + [
        (c, 2) for c in per_count]
    assert ('keras mirrored at 2 towers: skipped (TensorFlow started with fewer logical '
            'devices; run the bench in a fresh process)') in lines
    flops = compare.training_flops_per_image(models.build_model('small_convnet', SHAPE, 10),
                                             SHAPE, 10)
    for count in (1, 2):
        mine = [r for r in rows if r['towers'] == count]
        # towers' best: its rows without XLA (the +xla row is a ratio like the peers).
        best = max(r['mean'] for r in mine
                   if r['config'].startswith('towers') and not r['config'].endswith('+xla'))
        for row in mine:
            assert row['mean'] > 0 and row['vs_best'] == pytest.approx(row['mean'] / best)
            assert row['gflops'] == pytest.approx(row['mean'] * flops / 1e9)
    assert any(line.startswith('towers best vs keras mirrored: 1: ') for line in lines)
    assert any(line.startswith('2 tower(s): conv / matmul on the same devices ')
               for line in lines)
    assert 0 < rows[0]['conv_share'] < 10
    # Every towers and textbook row says what its step ran; Keras' graph is its own.
    graphs = [line for line in lines if line.startswith('  ')]
    assert len(graphs) == len(rows) - 1
    assert all(' ops; fusions ' in line and '; casts ' in line for line in graphs)
    xla = [line for line in graphs if '+xla' in line]
    # On a CPU XLA clusters only with TF_XLA_FLAGS=--tf_xla_cpu_global_jit set before
    # TensorFlow started (the command sets it): the step graph says which it was.
    clustered = 'tf_xla_cpu_global_jit' in os.environ.get('TF_XLA_FLAGS', '')
    assert len(xla) == 2 and all(('XLA cluster' in line) == clustered for line in xla)
    assert plot.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert lines[-1] == 'plot: %s' % plot


class _Stop(Exception):
    pass


def test_cpu_towers_split_eager_before_any_eager_call_on_a_gpu_machine_too(monkeypatch):
    """Keras (eager) gets as many logical CPUs as the towers' Sessions, even where a GPU is seen
    (faked: TensorFlow's list of physical GPUs, which towers.devices.visible_gpus reads too),
    and before eager TensorFlow makes its devices at its first call."""
    physical = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, 'list_physical_devices', lambda kind=None: [
        tf.config.PhysicalDevice('/physical_device:GPU:0', 'GPU')] if kind == 'GPU'
        else physical(kind))
    events = []
    record_eager_starts(monkeypatch, events)
    # Recorded only: this process's eager devices stay as they are.
    monkeypatch.setattr(tf.config, 'set_logical_device_configuration',
                        lambda device, logical: events.append((device.device_type, len(logical))))

    def stop(*args, **kwargs):
        raise _Stop
    monkeypatch.setattr(compare, 'measure_interleaved', stop)  # the rows are built: enough
    with pytest.raises(_Stop):
        compare.run_compare('small_convnet', models.build_model('small_convnet', SHAPE, 10),
                            SHAPE, 10, [1, 2], batch_size=8,
                            dataset=data.load_dataset('mnist_sample').train,
                            variable_updates=('replicated',), devices='cpu', log=lambda line: 0)
    assert events[0] == ('CPU', 2), events


def test_gpu_towers_give_eager_the_logical_gpus_the_first_session_made(monkeypatch):
    """Each GPU split as the Sessions split it, each logical GPU with the memory a Session
    gave it: read from a Session opened first, as TensorFlow fixes the split at the first.
    (Faked GPUs, and the Session made without any: this machine may have none, or one whose
    split this process has fixed already.)"""
    physical = {kind: [tf.config.PhysicalDevice('/physical_device:%s:%d' % (kind, i), kind)
                       for i in range(count)] for kind, count in (('CPU', 1), ('GPU', 2))}
    monkeypatch.setattr(tf.config, 'list_physical_devices', lambda kind: physical[kind])
    sessions, calls = [], []
    monkeypatch.setattr(compare, 'session_config', lambda devices, per_gpu: sessions.append(
        (devices, per_gpu)) or tf.compat.v1.ConfigProto(device_count={'GPU': 0}))
    monkeypatch.setattr(compare, 'session_gpu_memory', lambda sess: sessions.append(
        sess.list_devices()[0].device_type) or {
            '/gpu:%d' % j: (j + 1) * 2 ** 30 + 5 for j in range(4)})
    monkeypatch.setattr(tf.config, 'set_logical_device_configuration',
                        lambda device, logical: calls.append((device.name, logical)))
    devices = ['/gpu:0', '/gpu:1', '/gpu:2', '/gpu:3']  # 2 logical GPUs on each GPU
    assert compare.eager_as_sessions(devices, 2)
    assert sessions == [(devices, 2), 'CPU']  # its memory read from a Session of the split
    config = tf.config.LogicalDeviceConfiguration
    assert calls == [('/physical_device:GPU:0', [config(1024), config(2048)]),
                     ('/physical_device:GPU:1', [config(3072), config(4096)])]
    # Whole GPUs stay whole, their memory taken as it is used; eager already started keeps
    # what it has.
    monkeypatch.setattr(tf.config.experimental, 'set_memory_growth',
                        lambda device, grows: calls.append((device.name, grows)))
    assert compare.eager_as_sessions(['/gpu:0', '/gpu:1'], 1) and len(sessions) == 2
    assert calls[2:] == [('/physical_device:GPU:0', True), ('/physical_device:GPU:1', True)]

    def started(device, logical):
        raise RuntimeError('Virtual devices cannot be modified after being initialized')
    monkeypatch.setattr(tf.config, 'set_logical_device_configuration', started)
    assert not compare.eager_as_sessions(['/cpu:0', '/cpu:1'], 1)


def test_the_command_times_keras_on_every_tower_count_in_a_fresh_process(tmp_path, forks):
    # Keras at 1 tower is test_compare_times_every_row_and_draws_the_plot's, in this process;
    # at 2 it needs a process whose eager context is not yet made (the fork server's fork):
    # this module run as a script, the command's main with the small yardsticks.
    status, out, err = forks.run(
        ['bench', '--compare', '--model', 'small_convnet', '--towers', '2', '--batch-size', '8',
         '--warmup', '1', '--window', '2', '--variable-update', 'replicated', '--devices',
         'cpu'], tmp_path, module='tests.tools.test_compare', timeout=300)
    assert status == 0, err
    rows = [(line[:40].strip(), int(line[40:48])) for line in out
            if line.startswith(('towers replicated', 'textbook', 'keras'))]
    assert rows == [(config, 2) for config in (
        'towers replicated/synthetic', 'textbook', 'keras mirrored')], out
    assert any(line.startswith('towers best vs keras mirrored: 2: ') for line in out), out
    assert not any('Warning' in line for line in err), err


if __name__ == '__main__':  # test_the_command_times_keras_on_every_tower_count_in_a_fresh_process
    from towers.cli.main import main
    _small_yardsticks()
    sys.exit(main(sys.argv[1:]))
