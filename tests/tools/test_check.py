"""towers check: N towers against one device, and a check that can fail."""

import numpy as np
import pytest
import tensorflow as tf

from tests.harness import record_eager_starts
from towers import data, models
from towers.cli import main
from towers.gradients import average_gradients
from towers.models import layers
from towers.tools import check
from towers.tools.check import check_towers

SHAPE = (28, 28, 1)


@pytest.fixture(scope='module')
def batches():
    train = data.load_dataset('mnist_sample').train
    return [(train.images[i:i + 10], train.labels[i:i + 10]) for i in (0, 10, 20)]


@pytest.fixture(scope='module')
def plain_check(batches):
    """num_towers -> check_towers of small_convnet on the batches, each tower count checked
    once a module (each is two graphs and two Sessions; tests only read the result)."""
    checked = {}

    def check(num_towers):
        if num_towers not in checked:
            checked[num_towers] = check_towers(models.build_model('small_convnet', SHAPE, 10),
                                               SHAPE, num_towers, batches, learning_rate=0.1,
                                               devices='cpu')
        return checked[num_towers]
    return check


@pytest.mark.exact
@pytest.mark.parametrize('num_towers', [1, 2, 3, 4])
def test_n_towers_match_one_device(plain_check, num_towers):
    # 10 over 3 towers is 4/3/3, over 4 it is 3/3/2/2: uneven shares too.
    result, has_batch_norm = plain_check(num_towers)
    assert not has_batch_norm
    assert result.gradient_diff <= 1e-6 and result.variable_diff <= 1e-6 * result.scale
    if num_towers == 1:
        assert result.gradient_diff == 0 and result.variable_diff == 0


def _summed(tower_grads, weights):
    """A broken combiner: the towers' gradients summed, as if each tower had all the batch."""
    return average_gradients(tower_grads, [1.0] * len(tower_grads))


@pytest.mark.exact
def test_a_wrong_average_is_caught(batches):
    result, _ = check_towers(models.build_model('small_convnet', SHAPE, 10), SHAPE, 2, batches,
                             learning_rate=0.1, average=_summed, devices='cpu')
    assert result.gradient_diff > 1e-3 and result.variable_diff > 1e-3


def _bn_net(images, training):
    x = layers.conv2d(images, 4, 3, activation=None, use_bias=False, name='conv')
    return layers.dense(tf.nn.relu(layers.batch_norm(x, training, name='bn')), 10, name='logits')


@pytest.mark.exact
def test_batch_norm_differs_per_tower_unless_synced(batches):
    plain, has_batch_norm = check_towers(_bn_net, SHAPE, 2, batches, learning_rate=0.01,
                                         devices='cpu')
    synced, _ = check_towers(_bn_net, SHAPE, 2, batches, learning_rate=0.01, sync_bn=True,
                             devices='cpu')
    assert has_batch_norm
    # Per-tower moments are another computation; pooled ones differ by rounding only
    # (batch norm divides by the slice's spread, which magnifies it a little).
    assert plain.gradient_diff > 1e-2 and plain.variable_diff > 1e-4
    assert synced.gradient_diff < plain.gradient_diff / 1000
    assert synced.variable_diff <= 1e-5 * max(1.0, synced.scale)


# The command's whole output, line by line (the fused kernels of each run, the differences, the
# verdict): the lab's step 3 shows it, and tests/examples/test_lab.py holds it to what it prints.


def test_the_command_opens_its_sessions_before_any_eager_call(monkeypatch, capsys):
    """Eager TensorFlow makes its devices at its first call, a GPU unsplit with all its memory:
    before check's Sessions, that would leave their logical GPUs none (issue 39)."""
    events = []
    record_eager_starts(monkeypatch, events)
    opened = tf.compat.v1.Session.__init__
    monkeypatch.setattr(tf.compat.v1.Session, '__init__',
                        lambda self, *args, **kwargs: events.append('session')
                        or opened(self, *args, **kwargs))
    assert main(['check', '--model', 'small_convnet', '--towers', '3', '--batch-size', '10',
                 '--steps', '1', '--devices', 'cpu']) == 0
    assert events[:2] == ['session', 'session'], events
    # The shares are Python's, cut as split_sizes cuts them.
    assert capsys.readouterr().out.splitlines()[0].endswith('global batch 10 (4/3/3), 1 SGD steps')


def test_the_command_fails_beyond_the_tolerance(capsys):
    assert main(['check', '--model', 'small_convnet', '--towers', '2', '--batch-size', '10',
                 '--steps', '1', '--tolerance', '1e-30']) == 1
    err = capsys.readouterr().err
    assert 'towers: error: 2 towers differ from one device by ' in err
    assert 'more than the tolerance' in err


def test_the_command_refuses_more_examples_than_the_dataset_has(capsys):
    assert main(['check', '--batch-size', '100', '--steps', '41']) == 1
    assert ('check takes --steps batches of --batch-size distinct examples: 41 x 100 is more '
            'than the 4000 of mnist_sample') in capsys.readouterr().err


def test_bf16_towers_are_checked_against_fp32_with_a_bf16_tolerance(capsys):
    assert main(['check', '--model', 'small_convnet', '--towers', '2', '--batch-size', '10',
                 '--steps', '2', '--precision', 'bf16', '--devices', 'cpu']) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('check: small_convnet on 2 tower(s) /cpu:0,/cpu:1 in bf16 against '
                             '1 device in fp32')
    assert out[-1].startswith('within tolerance 0.125 (32 bfloat16 roundings: the towers '
                              'compute in bfloat16, the device in float32; largest relative '
                              'difference ')
    difference = float(out[-1].split('largest relative difference ')[1].split(')')[0])
    assert 1e-5 < difference < 0.125  # bf16 shows, far beyond float32 rounding


def test_fp16_is_checked_with_a_fixed_loss_scale(capsys):
    assert main(['check', '--model', 'small_convnet', '--towers', '2', '--batch-size', '10',
                 '--steps', '2', '--precision', 'fp16', '--loss-scale', '256', '--devices',
                 'cpu']) == 0
    out = capsys.readouterr().out
    assert 'fp16 loss scale: fixed 256' in out and 'within tolerance 0.0156 (32 float16' in out


@pytest.mark.exact
def test_label_smoothing_keeps_n_towers_equal_to_one_device(batches, plain_check, monkeypatch,
                                                            capsys):
    """Smoothed targets, per example: 3 towers (4/3/3) as one device; the smoothing changes the
    gradients (against the one-hot run's), and the command says it."""
    # One run of the command is both the check and what it says: two graphs and two Sessions
    # fewer than a check_towers beside it. run_check's result is check_towers' on the first
    # 3 x 10 examples of its train_set, which must be the module's batches.
    checked, run_check = [], check.run_check

    def kept(model_name, model_fn, dataset_name, train_set, *args, **kwargs):
        checked.append((train_set, run_check(model_name, model_fn, dataset_name, train_set,
                                             *args, **kwargs)))
        return checked[-1][1]
    monkeypatch.setattr(check, 'run_check', kept)
    assert main(['check', '--model', 'small_convnet', '--towers', '3', '--batch-size', '10',
                 '--steps', '3', '--lr', '0.1', '--devices', 'cpu',
                 '--label-smoothing', '0.2']) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith('3 SGD steps, label smoothing 0.2')
    (train_set, smoothed), = checked
    assert np.array_equal(train_set.images[:30], np.concatenate([b[0] for b in batches]))
    assert np.array_equal(train_set.labels[:30], np.concatenate([b[1] for b in batches]))
    assert smoothed.gradient_diff <= 1e-6 and smoothed.variable_diff <= 1e-6 * smoothed.scale
    # gradient_scale is the one device's, whatever the tower count: the 1-tower check's.
    plain, _ = plain_check(1)
    assert abs(smoothed.gradient_scale - plain.gradient_scale) > 1e-4
