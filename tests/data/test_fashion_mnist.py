"""Tests for data/fashion_mnist.py and the generalised IDX machinery of data/mnist.py."""
import hashlib
import os

import numpy as np
import pytest

from towers.data import (
    DatasetNotFoundError,
    fashion_mnist,
    find_dataset,
    load_dataset,
    locate,
    mnist,
    read_data_sets,
)
from towers.data.idx import write_idx


@pytest.fixture(autouse=True)
def isolated_folders(tmp_path, monkeypatch):
    """Keeps the real ~/.cache, $TOWERS_DATA_DIR and /usr/share/datasets out of every test."""
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    monkeypatch.delenv('TOWERS_DATA_DIR', raising=False)
    monkeypatch.setattr(locate, 'SYSTEM_DATA_DIR', str(tmp_path / 'system'))


def _write_fashion(folder, labels, first_pixel=0):
    """Writes tiny Fashion-MNIST-named IDX files; returns a matching file table.

    Training image i has pixel (0, 0) = first_pixel + i; there are 3 test images.
    """
    folder.mkdir(parents=True, exist_ok=True)
    train = np.zeros((len(labels), 28, 28), np.uint8)
    train[:, 0, 0] = first_pixel + np.arange(len(labels))
    arrays = (train, np.array(labels, np.uint8),
              np.full((3, 28, 28), 200, np.uint8), np.array([9, 2, 1], np.uint8))
    specs = []
    for spec, array in zip(fashion_mnist.FILES, arrays):
        write_idx(folder / spec.name, array)
        payload = (folder / spec.name).read_bytes()
        specs.append(mnist.FileSpec(spec.name, len(payload), hashlib.sha256(payload).hexdigest()))
    return mnist.MnistPaths(*specs)


# The first training labels of the real set, per DATASETS.md.
LABELS = [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]


def test_table_matches_upstream():
    assert [spec.name for spec in fashion_mnist.FILES] == [spec.name for spec in mnist.FILES]
    assert [spec.num_bytes for spec in fashion_mnist.FILES] == [26421880, 29515, 4422102, 5148]
    assert fashion_mnist.FILES.train_images.sha256 == \
        '3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84'
    assert all(len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
               for spec in fashion_mnist.FILES)
    assert fashion_mnist.MIRRORS == ('http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/',)
    assert fashion_mnist.SOURCE.title == 'Fashion-MNIST'
    assert len(fashion_mnist.CLASS_NAMES) == 10


def test_loads_from_towers_data_dir_before_cache(tmp_path, monkeypatch):
    _write_fashion(tmp_path / 'home' / '.cache' / 'towers' / 'fashion_mnist', LABELS[:6],
                   first_pixel=100)
    _write_fashion(tmp_path / 'env' / 'fashion_mnist', LABELS, first_pixel=0)
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    sets = load_dataset('fashion_mnist', validation_size=4, seed=0, download=False)
    assert (sets.train.num_examples, sets.validation.num_examples, sets.test.num_examples) \
        == (6, 4, 3)
    # The env folder's files, not the cache's: validation is ids 0-3, training ids 4-9.
    ids = sorted(np.rint(sets.train.images[:, 0, 0, 0] * 255).astype(int).tolist())
    assert ids == list(range(4, 10))
    assert sorted(sets.validation.labels.tolist()) == sorted(LABELS[:4])
    assert sets.train.images.shape[1:] == (28, 28, 1)
    assert sets.test.labels.tolist() == [9, 2, 1]
    # Without the variable, the cache is next in line.
    monkeypatch.delenv('TOWERS_DATA_DIR')
    sets = load_dataset('fashion_mnist', validation_size=0, download=False)
    assert sets.train.num_examples == 6
    assert sets.train.images[:, 0, 0, 0].min() == pytest.approx(100 / 255)


def test_found_where_debian_installs_it_without_checksums(tmp_path):
    system = tmp_path / 'system' / 'fashion-mnist'  # Debian's name, with a hyphen
    _write_fashion(system, LABELS)
    # These files match no upstream checksum (like Debian's recompressed ones): still used.
    assert fashion_mnist.FILES.train_images.sha256 != hashlib.sha256(
        (system / 'train-images-idx3-ubyte.gz').read_bytes()).hexdigest()
    location = find_dataset('fashion_mnist')
    assert location.folder == str(system) and location.found
    sets = load_dataset('fashion_mnist', validation_size=0)  # download allowed, never needed
    assert sets.train.num_examples == 10
    assert sorted(sets.train.labels.tolist()) == sorted(LABELS)


def test_downloads_into_towers_data_dir(server, tmp_path, monkeypatch):
    root, base = server
    files = _write_fashion(root / 'fashion', LABELS)
    monkeypatch.setattr(fashion_mnist, 'SOURCE',
                        mnist.IdxSource('Fashion-MNIST', files, (f'{base}/fashion/',)))
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    sets = load_dataset('fashion_mnist', validation_size=2, seed=0)
    target = tmp_path / 'env' / 'fashion_mnist'
    assert sorted(os.listdir(target)) == sorted(spec.name for spec in files)
    for spec in files:
        assert (target / spec.name).read_bytes() == (root / 'fashion' / spec.name).read_bytes()
    assert (sets.train.num_examples, sets.validation.num_examples) == (8, 2)
    assert not (tmp_path / 'home').exists()


def test_offline_error_names_fashion_and_every_folder(server, tmp_path, monkeypatch):
    root, base = server
    files = _write_fashion(root / 'fashion', LABELS)
    (root / 'fashion' / files.test_labels.name).write_bytes(b'tampered')
    monkeypatch.setattr(fashion_mnist, 'SOURCE',
                        mnist.IdxSource('Fashion-MNIST', files, (f'{base}/fashion/',)))
    data_dir = tmp_path / 'arg'
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset('fashion_mnist', data_dir=data_dir)
    message = str(info.value)
    assert message.startswith(f'Fashion-MNIST file(s) missing from {data_dir}: '
                              't10k-labels-idx1-ubyte.gz (download failed: ')
    assert 'checksum mismatch' in message
    assert ('looked in ' + ', '.join([str(data_dir),
                                      str(tmp_path / 'home' / '.cache' / 'towers' /
                                          'fashion_mnist'),
                                      str(tmp_path / 'system' / 'fashion-mnist')])) in message
    # The three good files landed; the tampered one left nothing behind.
    assert sorted(os.listdir(data_dir)) == sorted(spec.name for spec in files[:3])


def test_read_data_sets_with_fashion_table(tmp_path):
    files = _write_fashion(tmp_path / 'f', LABELS)
    sets = read_data_sets(tmp_path / 'f', validation_size=0, download=False, files=files,
                          mirrors=fashion_mnist.MIRRORS)
    assert sets.train.num_examples == 10


def test_ensure_mnist_keeps_its_title(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r'^MNIST file\(s\) missing'):
        mnist.ensure_mnist(tmp_path, download=False)
    assert not mnist.has_idx_files(tmp_path)
    _write_fashion(tmp_path, LABELS)
    assert mnist.has_idx_files(tmp_path, fashion_mnist.FILES)
