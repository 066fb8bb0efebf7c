"""imagenet-synthetic: random images of the model's shape, and how the commands pick it."""
import json
import os

import numpy as np
import pytest

from towers.cli import main
from towers.data import synthetic
from towers.data.errors import DataError


def test_the_images_are_random_bytes_of_the_shape_with_labels_in_range():
    sets = synthetic.synthetic_datasets((8, 6, 3), 5, 300, seed=1)
    images, labels = sets.train.images, sets.train.labels
    assert images.shape == (300, 8, 6, 3) and images.dtype == np.float32
    assert set(np.unique(np.round(images * 255))) == set(range(256))  # every byte value
    assert labels.min() == 0 and labels.max() == 4
    again = synthetic.synthetic_datasets((8, 6, 3), 5, 300, seed=1).train
    np.testing.assert_array_equal(again.images, images)
    assert sets.validation.num_examples == sets.test.num_examples == 0


def test_more_images_than_memory_allows_is_one_line(monkeypatch):
    monkeypatch.setattr(synthetic, 'MEMORY', 2 ** 29)
    with pytest.raises(DataError, match=r'^1000 synthetic images of 224x224x3 take 0\.6 GB, '
                                        r'more than the 0\.5 GB allowed: use a smaller batch '
                                        r'or image size$'):
        synthetic.synthetic_datasets((224, 224, 3), 10, 1000)


def _train(tmp_path, capsys, *flags):
    logdir = str(tmp_path / 'run')
    code = main(['train', '--steps', '1', '--batch-size', '4', '--eval-every', '0',
                 '--logdir', logdir, '--no-tensorboard', '--devices', 'cpu'] + list(flags))
    out, err = capsys.readouterr()
    return code, logdir, out.splitlines(), err.strip().splitlines()


def test_an_imagenet_model_trains_on_synthetic_images_of_its_size_by_default(tmp_path, capsys):
    code, logdir, out, _ = _train(tmp_path, capsys, '--model', 'trivial', '--image-size', '12')
    assert code == 0
    assert 'dataset imagenet-synthetic: 256 train, 0 validation, 0 test; model trivial' in out
    with open(os.path.join(logdir, 'run.json')) as f:
        run = json.load(f)
    assert run['input_shape'] == [12, 12, 3] and run['num_classes'] == 1000
    assert main(['eval', '--logdir', logdir]) == 1
    assert capsys.readouterr().err.strip() == (
        'towers: error: %s trained on imagenet-synthetic, which has no test images' % logdir)


@pytest.mark.parametrize('flags, message', [
    (['--image-size', '16'], '--image-size goes with imagenet:DIR, tfds:DIR or '
                             'imagenet-synthetic; mnist_sample has its own size'),
    (['--model', 'trivial', '--image-size', '0'], '--image-size must be at least 1, got 0'),
])
def test_a_bad_image_size_is_one_line(tmp_path, capsys, flags, message):
    code, logdir, _, err = _train(tmp_path, capsys, *flags)
    assert code == 1 and err == ['towers: error: ' + message]
    assert not os.path.exists(logdir)


@pytest.mark.parametrize('flags, message', [
    (['--skip-bad-images'], '--skip-bad-images goes with imagenet:DIR or tfds:DIR, whose images '
                            'are decoded as they are read; not mnist_sample'),
    (['--model', 'trivial', '--image-size', '8', '--validation-size', '10'],
     '--validation-size holds out real examples; imagenet-synthetic has none to hold out'),
])
def test_settings_that_do_not_apply_to_the_dataset_are_one_line(tmp_path, capsys, flags,
                                                               message):
    code, logdir, _, err = _train(tmp_path, capsys, *flags)
    assert code == 1 and err == ['towers: error: ' + message]
    assert not os.path.exists(logdir)


def test_check_gets_as_many_synthetic_images_as_its_steps_take(capsys):
    assert main(['check', '--model', 'trivial', '--image-size', '6', '--towers', '2',
                 '--steps', '3', '--batch-size', '100']) == 0
    assert 'check: trivial on 2 tower(s)' in capsys.readouterr().out  # 300 distinct images


@pytest.mark.parametrize('flags, message', [
    (['--dataset', 'mnist_sample'], '--input-only times the input of an imagenet:DIR or '
                                    'tfds:DIR folder; got --dataset mnist_sample'),
    (['--dataset', 'imagenet:/nowhere', '--towers', '2', '--precision', 'bf16'],
     '--input-only times the input alone, with no model, towers or precision: drop --towers, '
     '--precision'),
])
def test_bench_input_only_refuses_what_it_would_ignore(capsys, flags, message):
    assert main(['bench', '--input-only'] + flags) == 1
    assert capsys.readouterr().err.strip() == 'towers: error: ' + message
