"""Tests for data/checks.py: every loader holds each file to its dataset's declared contents.

One wrong file (images of another size or dtype, labels of another count, type or
range) is one DataMismatchError line naming it, from every loader of a named dataset
and from the classic read_data_sets; check_images asks the same of a model's input.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from towers.data import (
    CifarFormatError,
    DataMismatchError,
    DataSet,
    check_images,
    dataset_info,
    load_dataset,
    locate,
    mnist,
    read_data_sets,
)
from towers.data.checks import Part, check_parts
from towers.data.dataset import checked_datasets
from towers.data.idx import write_idx

TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS = (spec.name for spec in mnist.FILES)


@pytest.fixture(autouse=True)
def isolated_folders(tmp_path, monkeypatch):
    """Keeps the real ~/.cache, $TOWERS_DATA_DIR and /usr/share/datasets out of every test."""
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    monkeypatch.delenv('TOWERS_DATA_DIR', raising=False)
    monkeypatch.setattr(locate, 'SYSTEM_DATA_DIR', str(tmp_path / 'system'))


def _write_idx_folder(folder, train_size=28, test_size=28, images_dtype=np.uint8,
                      train_labels=None):
    """Four MNIST-named IDX files: 6 train and 4 test images of the given sizes.

    train_labels: the training label array to write; defaults to uint8 0..5.
    """
    folder.mkdir(parents=True, exist_ok=True)
    labels = np.arange(6, dtype=np.uint8) if train_labels is None else train_labels
    arrays = {TRAIN_IMAGES: np.zeros((6, train_size, train_size), images_dtype),
              TRAIN_LABELS: labels,
              TEST_IMAGES: np.zeros((4, test_size, test_size), np.uint8),
              TEST_LABELS: np.arange(4, dtype=np.uint8)}
    for name, array in arrays.items():
        write_idx(folder / name, array)
    return folder


# Every loader of IDX files, as (dataset name in messages, load(folder)).
IDX_LOADERS = {
    'mnist': lambda folder: load_dataset('mnist', data_dir=folder, validation_size=0,
                                         download=False),
    'fashion_mnist': lambda folder: load_dataset('fashion_mnist', data_dir=folder,
                                                 validation_size=0, download=False),
    'mnist_sample': lambda folder: load_dataset('mnist_sample', data_dir=folder,
                                                validation_size=0),
    'classic read_data_sets': lambda folder: read_data_sets(folder, validation_size=0,
                                                           download=False),
}
# The classic API checks against MNIST's declaration.
NAMES = {'mnist': 'mnist', 'fashion_mnist': 'fashion_mnist', 'mnist_sample': 'mnist_sample',
         'classic read_data_sets': 'mnist'}


def _message(loader, folder, **files):
    with pytest.raises(DataMismatchError) as info:
        IDX_LOADERS[loader](_write_idx_folder(folder, **files))
    return str(info.value)


@pytest.mark.parametrize('loader', IDX_LOADERS)
def test_wrong_size_training_images_are_named_beside_the_right_test_images(tmp_path, loader):
    assert _message(loader, tmp_path, train_size=32) == (
        f'{tmp_path}/{TRAIN_IMAGES} holds 32x32x1 images, but {NAMES[loader]} images are 28x28x1 '
        f'(as {TEST_IMAGES} holds): replace it with the real file')


@pytest.mark.parametrize('loader', IDX_LOADERS)
def test_wrong_size_test_images_cite_the_training_images(tmp_path, loader):
    assert _message(loader, tmp_path, test_size=27) == (
        f'{tmp_path}/{TEST_IMAGES} holds 27x27x1 images, but {NAMES[loader]} images are 28x28x1 '
        f'(as {TRAIN_IMAGES} holds): replace it with the real file')


@pytest.mark.parametrize('loader', IDX_LOADERS)
def test_both_splits_of_another_size_are_named_together(tmp_path, loader):
    assert _message(loader, tmp_path, train_size=32, test_size=32) == (
        f'{tmp_path}/{TRAIN_IMAGES} and {TEST_IMAGES} hold 32x32x1 images, but '
        f'{NAMES[loader]} images are 28x28x1: replace them with the real files')


@pytest.mark.parametrize('loader', IDX_LOADERS)
def test_images_of_another_dtype_are_named(tmp_path, loader):
    assert _message(loader, tmp_path, images_dtype=np.float32) == (
        f'{tmp_path}/{TRAIN_IMAGES} holds float32 images, but {NAMES[loader]} images are uint8: '
        'replace it with the real file')


@pytest.mark.parametrize('loader', IDX_LOADERS)
def test_out_of_range_label_is_named_with_its_record(tmp_path, loader):
    labels = np.array([0, 1, 2, 12, 4, 5], np.uint8)
    assert _message(loader, tmp_path, train_labels=labels) == (
        f'{tmp_path}/{TRAIN_LABELS} holds label 12 (record 3), but {NAMES[loader]} labels are '
        '0-9: replace it with the real file')


@pytest.mark.parametrize('loader', IDX_LOADERS)
def test_labels_of_a_non_integer_type_are_named(tmp_path, loader):
    labels = np.arange(6, dtype=np.float32)
    assert _message(loader, tmp_path, train_labels=labels) == (
        f'{tmp_path}/{TRAIN_LABELS} holds float32 labels, but {NAMES[loader]} labels are '
        'integers: replace it with the real file')


def test_labels_stored_as_wider_integers_in_range_are_accepted(tmp_path):
    sets = read_data_sets(_write_idx_folder(tmp_path, train_labels=np.arange(6, dtype=np.int32)),
                          validation_size=2, download=False)
    assert sorted(sets.train.labels.tolist() + sets.validation.labels.tolist()) == list(range(6))


def test_each_dataset_remembers_its_images_file(tmp_path):
    sets = read_data_sets(_write_idx_folder(tmp_path), validation_size=2, download=False)
    assert sets.train.origin == sets.validation.origin == f'{tmp_path}/{TRAIN_IMAGES}'
    assert sets.test.origin == f'{tmp_path}/{TEST_IMAGES}'
    in_memory = DataSet(np.zeros((1, 2, 2), np.uint8), [0])
    assert in_memory.origin is None
    with pytest.raises(DataMismatchError, match='^the dataset holds 2x2x1 images, but'):
        check_images(in_memory, (28, 28, 1))


# --- CIFAR-10 ------------------------------------------------------------------------------

def _write_cifar_folder(folder, labels_of=lambda name: [1, 2]):
    """The six batch files, 2 records each of the real 3,073-byte layout."""
    batches = folder / 'cifar-10-batches-bin'
    batches.mkdir(parents=True)
    for name in [f'data_batch_{i}.bin' for i in range(1, 6)] + ['test_batch.bin']:
        records = np.zeros((2, 3073), np.uint8)
        records[:, 0] = labels_of(name)
        (batches / name).write_bytes(records.tobytes())
    return batches


def test_cifar10_out_of_range_label_is_named_with_its_record(tmp_path):
    batches = _write_cifar_folder(
        tmp_path, labels_of=lambda name: [3, 10] if name == 'data_batch_4.bin' else [1, 2])
    with pytest.raises(DataMismatchError) as info:
        load_dataset('cifar10', data_dir=tmp_path, validation_size=0, download=False)
    assert str(info.value) == (f'{batches}/data_batch_4.bin holds label 10 (record 1), but '
                               'cifar10 labels are 0-9: replace it with the real file')


def test_cifar10_batch_of_another_image_size_is_named(tmp_path):
    # The binary format has no header: a batch of 28x28x3 records shows in its size.
    batches = _write_cifar_folder(tmp_path)
    (batches / 'test_batch.bin').write_bytes(np.zeros((2, 1 + 28 * 28 * 3), np.uint8).tobytes())
    with pytest.raises(CifarFormatError) as info:
        load_dataset('cifar10', data_dir=tmp_path, validation_size=0, download=False)
    assert str(info.value) == (
        f'{batches}/test_batch.bin: 4706 bytes is not a whole number of 3073-byte records '
        '(1 label byte + 3,072 pixel bytes); the file is truncated or not a CIFAR-10 binary '
        'batch, fetch it again')


def test_cifar10_parts_go_through_the_same_shape_check(tmp_path):
    def part(name, size):
        path = str(tmp_path / name)
        return Part(np.zeros((2, size, size, 3), np.uint8), np.array([0, 1]), path, path)
    train = [part('data_batch_1.bin', 32), part('data_batch_2.bin', 28)]
    with pytest.raises(DataMismatchError) as info:
        checked_datasets(train, [part('test_batch.bin', 32)],
                         dataset_info('cifar10'), 0)
    assert str(info.value) == (f'{tmp_path}/data_batch_2.bin holds 28x28x3 images, but cifar10 '
                               'images are 32x32x3 (as data_batch_1.bin holds): replace it with '
                               'the real file')


def test_cifar10_origin_names_its_batch_files(tmp_path):
    batches = _write_cifar_folder(tmp_path)
    sets = load_dataset('cifar10', data_dir=tmp_path, validation_size=0, download=False)
    assert sets.train.origin == f'{batches}/data_batch_1.bin to data_batch_5.bin'
    assert sets.test.origin == f'{batches}/test_batch.bin'


def test_count_mismatch_names_both_files(tmp_path):
    images, labels = str(tmp_path / 'a' / 'images'), str(tmp_path / 'b' / 'labels')
    with pytest.raises(DataMismatchError) as info:
        check_parts([Part(np.zeros((3, 28, 28), np.uint8), np.zeros(2, np.uint8), images,
                          labels)], dataset_info('mnist'))
    # In another folder, the labels file is named in full too.
    assert str(info.value) == (f'{images} holds 3 images but {labels} holds 2 labels: one of '
                               'them is from another dataset or corrupt, replace it with the '
                               'real file')


# --- check_images: a split against a model's input ------------------------------------------

def test_check_images_names_the_file_and_the_model(tmp_path):
    sets = read_data_sets(_write_idx_folder(tmp_path), validation_size=0, download=False)
    assert check_images(sets.test, (28, 28, 1)) is None
    with pytest.raises(DataMismatchError) as info:
        check_images(sets.test, [32, 32, 3], model='the model in logs/run.json')
    assert str(info.value) == (
        f'{tmp_path}/{TEST_IMAGES} holds 28x28x1 images, but the model in logs/run.json takes '
        '32x32x3: use images of that shape, or a model built for 28x28x1')


def test_check_images_takes_arrays_and_pairs():
    grey = np.zeros((2, 28, 28), np.uint8)
    assert check_images(grey, (28, 28, 1)) is None
    assert check_images((np.zeros((2, 4, 4, 3), np.float32), np.zeros(2)), (4, 4, 3)) is None
    with pytest.raises(DataMismatchError) as info:
        check_images((grey, np.zeros(2)), (32, 32, 3), origin='records:/r test split')
    assert str(info.value) == ('records:/r test split holds 28x28x1 images, but the model takes '
                               '32x32x3: use images of that shape, or a model built for 28x28x1')
    with pytest.raises(DataMismatchError) as info:
        check_images(np.zeros((2, 784), np.uint8), (28, 28, 1))
    assert str(info.value) == ('the array holds 784 images, but the model takes 28x28x1: use '
                               'images of that shape, or a model built for 784')
    with pytest.raises(DataMismatchError) as info:
        check_images(np.zeros((2, 28, 28), np.int32), (28, 28, 1))
    assert str(info.value) == ('the array holds int32 images, but the model takes uint8 or '
                               'floating-point pixels: convert them first')


# --- the CLI -------------------------------------------------------------------------------

def test_cli_train_on_wrong_size_files_is_one_line_and_trains_nothing(tmp_path):
    bad = _write_idx_folder(tmp_path / 'bad', train_size=32)
    work = tmp_path / 'work'
    work.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', HOME=str(tmp_path / 'home'))
    env.pop('TOWERS_DATA_DIR', None)
    result = subprocess.run(
        [sys.executable, '-m', 'towers', 'train', '--dataset', 'mnist', '--data-dir', str(bad),
         '--steps', '2'], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        f'towers: error: {bad}/{TRAIN_IMAGES} holds 32x32x1 images, but mnist images are '
        f'28x28x1 (as {TEST_IMAGES} holds): replace it with the real file\n')
    # Stopped at the files: no dataset line, no step, nothing written.
    assert result.stdout == ''
    assert os.listdir(work) == []
