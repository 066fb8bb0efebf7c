"""Tests for data/registry.py and data/locate.py: the named datasets and the folder search order."""
import os

import numpy as np
import pytest

from towers import data
from towers.data import (
    DATASETS,
    DataError,
    DatasetNotFoundError,
    class_names,
    dataset_info,
    find_dataset,
    load_dataset,
    locate,
    mnist,
)
from towers.data.idx import write_idx


@pytest.fixture(autouse=True)
def isolated_folders(tmp_path, monkeypatch):
    """Points HOME and the system folder into tmp_path and unsets $TOWERS_DATA_DIR.

    Returns a dict of the four folders of the search order for a dataset 'ds'.
    """
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    monkeypatch.delenv('TOWERS_DATA_DIR', raising=False)
    monkeypatch.setattr(locate, 'SYSTEM_DATA_DIR', str(tmp_path / 'system'))
    return {'arg': tmp_path / 'arg', 'env': tmp_path / 'env' / 'ds',
            'cache': tmp_path / 'home' / '.cache' / 'towers' / 'ds',
            'system': tmp_path / 'system' / 'ds-debian'}


def test_registry_lists_all_datasets():
    assert set(DATASETS) == {'mnist_sample', 'mnist', 'fashion_mnist', 'cifar10'}
    assert data.DEFAULT_DATASET == 'mnist_sample'
    shapes = {name: info.input_shape for name, info in DATASETS.items()}
    assert shapes == {'mnist_sample': (28, 28, 1), 'mnist': (28, 28, 1),
                      'fashion_mnist': (28, 28, 1), 'cifar10': (32, 32, 3)}
    counts = {name: (info.num_train, info.num_test, info.default_validation_size)
              for name, info in DATASETS.items()}
    assert counts == {'mnist_sample': (4000, 1000, 0), 'mnist': (60000, 10000, 5000),
                      'fashion_mnist': (60000, 10000, 5000), 'cifar10': (50000, 10000, 5000)}
    for info in DATASETS.values():
        assert info.num_classes == 10 and len(info.class_names) == 10
    assert dataset_info('cifar10').class_names[0] == 'airplane'
    assert dataset_info('fashion_mnist').class_names[-1] == 'Ankle boot'
    with pytest.raises(DataError, match='cifar10, fashion_mnist, mnist, mnist_sample'):
        dataset_info('cifar100')
    with pytest.raises(DataError, match="'nope'"):
        load_dataset('nope')


def test_default_is_still_the_embedded_sample():
    sets = load_dataset(data.DEFAULT_DATASET, seed=0)
    assert (sets.train.num_examples, sets.validation.num_examples, sets.test.num_examples) \
        == (4000, 0, 1000)
    with pytest.raises(DataError, match='ships with the package'):
        find_dataset('mnist_sample')


def _mark(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'marker').write_text('x')


def _has_marker(folder):
    return os.path.isfile(os.path.join(folder, 'marker'))


def _locate(folders, with_arg=True):
    return locate.locate('ds', _has_marker, data_dir=folders['arg'] if with_arg else None,
                         system_name='ds-debian')


def test_search_order_with_every_folder(isolated_folders, monkeypatch, tmp_path):
    folders = isolated_folders
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    expected = tuple(str(folders[key]) for key in ('arg', 'env', 'cache', 'system'))
    assert locate.search_folders('ds', folders['arg'], 'ds-debian') == expected
    # Nothing anywhere: not found, and downloads go to the data_dir argument.
    assert _locate(folders) == locate.Location(str(folders['arg']), False, expected)
    # Each folder wins over those after it; mark them from last to first.
    for key in ('system', 'cache', 'env', 'arg'):
        _mark(folders[key])
        assert _locate(folders) == locate.Location(str(folders[key]), True, expected)


def test_first_complete_folder_wins_even_after_an_empty_data_dir(isolated_folders, monkeypatch,
                                                               tmp_path):
    folders = isolated_folders
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    folders['arg'].mkdir()  # exists, but without the files
    _mark(folders['cache'])
    _mark(folders['system'])
    assert _locate(folders).folder == str(folders['cache'])


def test_download_folder_without_data_dir(isolated_folders, monkeypatch, tmp_path):
    folders = isolated_folders
    without_env = _locate(folders, with_arg=False)
    assert without_env.folder == str(folders['cache']) and not without_env.found
    assert without_env.searched == (str(folders['cache']), str(folders['system']))
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    with_env = _locate(folders, with_arg=False)
    assert with_env.folder == str(folders['env']) and not with_env.found
    assert with_env.searched == (str(folders['env']), str(folders['cache']),
                                 str(folders['system']))
    # The system folder is searched but never downloaded into.
    monkeypatch.setenv('TOWERS_DATA_DIR', '')
    assert _locate(folders, with_arg=False).folder == str(folders['cache'])


def test_data_dir_equal_to_env_folder_is_listed_once(monkeypatch, tmp_path):
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    searched = locate.search_folders('ds', tmp_path / 'env' / 'ds')
    assert searched[0] == str(tmp_path / 'env' / 'ds')
    assert len(searched) == 3


def _write_tiny_idx(folder, num_train, first_pixel):
    """Writes the four MNIST-named files; every image's pixel (0, 0) is first_pixel."""
    folder.mkdir(parents=True, exist_ok=True)
    images = np.zeros((num_train, 28, 28), np.uint8)
    images[:, 0, 0] = first_pixel
    arrays = (images, np.arange(num_train, dtype=np.uint8) % 10,
              images[:2], np.array([3, 4], np.uint8))
    for spec, array in zip(mnist.FILES, arrays):
        write_idx(folder / spec.name, array)


def test_mnist_missing_error_lists_every_folder_searched(isolated_folders, monkeypatch,
                                                        tmp_path):
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset('mnist', data_dir=tmp_path / 'arg', download=False)
    message = str(info.value)
    searched = [str(tmp_path / 'arg'), str(tmp_path / 'env' / 'mnist'),
                str(tmp_path / 'home' / '.cache' / 'towers' / 'mnist'),
                str(tmp_path / 'system' / 'mnist')]
    assert 'looked in ' + ', '.join(searched) in message
    assert f'put them in {tmp_path / "arg"} by hand' in message
    assert 'MNIST file(s) missing' in message and '\n' not in message


def test_mnist_found_by_search_order(isolated_folders, monkeypatch, tmp_path):
    # Only the cache holds MNIST: an empty --data-dir does not hide it.
    _write_tiny_idx(tmp_path / 'home' / '.cache' / 'towers' / 'mnist', 8, first_pixel=7)
    sets = load_dataset('mnist', data_dir=tmp_path / 'empty', validation_size=2, download=False)
    assert (sets.train.num_examples, sets.validation.num_examples, sets.test.num_examples) \
        == (6, 2, 2)
    assert sets.train.images[0, 0, 0, 0] == pytest.approx(7 / 255)
    assert not (tmp_path / 'empty').exists()
    # $TOWERS_DATA_DIR/mnist comes before the cache.
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    _write_tiny_idx(tmp_path / 'env' / 'mnist', 9, first_pixel=9)
    sets = load_dataset('mnist', validation_size=0, download=False)
    assert sets.train.num_examples == 9
    assert sets.train.images[0, 0, 0, 0] == pytest.approx(9 / 255)
    assert find_dataset('mnist').folder == str(tmp_path / 'env' / 'mnist')


def test_class_names_default_without_files():
    assert class_names('mnist') == tuple('0123456789')
    assert class_names('cifar10') == dataset_info('cifar10').class_names
    assert class_names('fashion_mnist')[0] == 'T-shirt/top'

