"""Tests for data/download.py and data/mnist.py against a local HTTP server."""
import gzip
import hashlib
import importlib
import os
import socket

import numpy as np
import pytest

from towers.data import (
    ChecksumError,
    DatasetNotFoundError,
    DownloadError,
    download,
    mnist,
    read_data_sets,
)
from towers.data.idx import write_idx

# `data.download` the attribute is the function; the module is reached this way.
download_module = importlib.import_module('towers.data.download')


def _sha(payload):
    return hashlib.sha256(payload).hexdigest()


@pytest.fixture
def dest(tmp_path):
    folder = tmp_path / 'dest'
    folder.mkdir()
    return folder


def _refused_url():
    # A port that was free a moment ago: connecting to it is refused.
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    return f'http://127.0.0.1:{port}/file.bin'


def test_good_file_lands_with_right_bytes(server, dest):
    root, base = server
    payload = os.urandom(200_000)
    (root / 'file.bin').write_bytes(payload)
    path = download(f'{base}/file.bin', dest / 'file.bin', _sha(payload))
    assert path == str(dest / 'file.bin')
    assert (dest / 'file.bin').read_bytes() == payload
    assert os.listdir(dest) == ['file.bin']


def test_existing_good_file_is_kept_without_network(dest):
    payload = b'already here'
    (dest / 'file.bin').write_bytes(payload)
    download([_refused_url()], dest / 'file.bin', _sha(payload))
    assert (dest / 'file.bin').read_bytes() == payload


def test_existing_wrong_file_is_not_overwritten(server, dest):
    root, base = server
    (root / 'file.bin').write_bytes(b'good')
    (dest / 'file.bin').write_bytes(b'stale')
    with pytest.raises(ChecksumError, match='file.bin') as info:
        download(f'{base}/file.bin', dest / 'file.bin', _sha(b'good'))
    assert str(dest / 'file.bin') in str(info.value)
    assert (dest / 'file.bin').read_bytes() == b'stale'


def test_checksum_mismatch_leaves_nothing(server, dest):
    root, base = server
    (root / 'file.bin').write_bytes(b'tampered')
    with pytest.raises(DownloadError, match='checksum mismatch') as info:
        download(f'{base}/file.bin', dest / 'file.bin', _sha(b'genuine'))
    assert os.listdir(dest) == []
    assert f'put the file at {dest / "file.bin"} by hand' in str(info.value)


def test_404_falls_back_to_next_mirror(server, dest):
    root, base = server
    (root / 'b').mkdir()
    (root / 'b' / 'file.bin').write_bytes(b'payload')
    download([f'{base}/a/file.bin', f'{base}/b/file.bin'], dest / 'file.bin', _sha(b'payload'))
    assert (dest / 'file.bin').read_bytes() == b'payload'
    assert os.listdir(dest) == ['file.bin']


def test_checksum_mismatch_falls_back_to_next_mirror(server, dest):
    root, base = server
    for mirror, payload in (('a', b'wrong'), ('b', b'right')):
        (root / mirror).mkdir()
        (root / mirror / 'file.bin').write_bytes(payload)
    download([f'{base}/a/file.bin', f'{base}/b/file.bin'], dest / 'file.bin', _sha(b'right'))
    assert (dest / 'file.bin').read_bytes() == b'right'


def test_all_mirrors_fail(server, dest):
    root, base = server
    (root / 'file.bin').write_bytes(b'wrong')
    urls = [f'{base}/missing/file.bin', _refused_url(), f'{base}/file.bin']
    with pytest.raises(DownloadError) as info:
        download(urls, dest / 'file.bin', _sha(b'right'))
    message = str(info.value)
    assert os.listdir(dest) == []
    assert '\n' not in message
    assert 'HTTP 404' in message and 'refused' in message and 'checksum mismatch' in message
    assert [url for url, _ in info.value.reasons] == urls
    assert str(dest / 'file.bin') in message


def test_interrupt_mid_download_leaves_nothing(monkeypatch, dest):
    class _Response:
        def __init__(self):
            self.reads = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, size):
            self.reads += 1
            if self.reads > 1:
                raise KeyboardInterrupt
            return b'x' * size

    monkeypatch.setattr(download_module.urllib.request, 'urlopen',
                        lambda *args, **kwargs: _Response())
    with pytest.raises(KeyboardInterrupt):
        download('http://example.invalid/file.bin', dest / 'file.bin', _sha(b'whatever'))
    assert os.listdir(dest) == []


def test_download_is_synced_before_rename(server, dest, monkeypatch):
    root, base = server
    (root / 'file.bin').write_bytes(b'payload')
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, 'fsync', lambda fd: (synced.append(fd), real_fsync(fd)))
    download(f'{base}/file.bin', dest / 'file.bin', _sha(b'payload'))
    assert len(synced) == 1
    assert os.stat(dest / 'file.bin').st_mode & 0o777 == 0o644


def _tiny_mnist(folder):
    """Writes four tiny MNIST-named IDX files; returns a matching file table."""
    arrays = (np.arange(6 * 28 * 28, dtype=np.uint8).reshape(6, 28, 28),
              np.array([5, 0, 4, 1, 9, 2], np.uint8),
              np.zeros((3, 28, 28), np.uint8), np.array([7, 2, 1], np.uint8))
    specs = []
    for spec, array in zip(mnist.FILES, arrays):
        write_idx(folder / spec.name, array)
        payload = (folder / spec.name).read_bytes()
        specs.append(mnist.FileSpec(spec.name, len(payload), _sha(payload)))
    return mnist.MnistPaths(*specs)


def test_read_data_sets_downloads_from_mirrors(server, tmp_path):
    root, base = server
    (root / 'mirror').mkdir()
    files = _tiny_mnist(root / 'mirror')
    # The first mirror is missing the files, so every one falls back to the second.
    mirrors = (f'{base}/nowhere/', f'{base}/mirror/')
    data_dir = tmp_path / 'cache' / 'mnist'
    sets = read_data_sets(data_dir, validation_size=2, download=True, mirrors=mirrors,
                          files=files, seed=0)
    assert sorted(os.listdir(data_dir)) == sorted(spec.name for spec in files)
    assert (sets.train.num_examples, sets.validation.num_examples, sets.test.num_examples) \
        == (4, 2, 3)
    assert sorted(sets.validation.labels.tolist()) == [0, 5]
    # Present files are used as they are: a second load needs no server.
    again = read_data_sets(data_dir, validation_size=2, mirrors=(_refused_url(),),
                           files=files)
    assert again.test.num_examples == 3


def test_offline_lists_missing_files(server, tmp_path):
    root, base = server
    (root / 'mirror').mkdir()
    files = _tiny_mnist(root / 'mirror')
    data_dir = tmp_path / 'mnist'
    data_dir.mkdir()
    (data_dir / files.train_labels.name).write_bytes(
        (root / 'mirror' / files.train_labels.name).read_bytes())
    with pytest.raises(DatasetNotFoundError) as info:
        mnist.ensure_mnist(data_dir, mirrors=(f'{base}/nowhere/',), files=files)
    message = str(info.value)
    assert ('train-images-idx3-ubyte.gz, t10k-images-idx3-ubyte.gz, '
            't10k-labels-idx1-ubyte.gz') in message
    assert 'train-labels' not in message.split('(')[0]
    assert str(data_dir) in message and 'HTTP 404' in message
    assert 'uncompressed without .gz (e.g. train-images-idx3-ubyte)' in message
    assert os.listdir(data_dir) == [files.train_labels.name]


def _unpack(path):
    """Replaces `path` (a .gz file) by its uncompressed twin; returns the new path."""
    raw = path.with_name(path.name[:-len('.gz')])
    raw.write_bytes(gzip.decompress(path.read_bytes()))
    path.unlink()
    return raw


def test_uncompressed_names_are_used_without_network(tmp_path):
    data_dir = tmp_path / 'mnist'
    data_dir.mkdir()
    files = _tiny_mnist(data_dir)
    for spec in files:
        _unpack(data_dir / spec.name)
    paths = mnist.ensure_mnist(data_dir, mirrors=(_refused_url(),), files=files)
    assert paths == tuple(str(data_dir / spec.name[:-len('.gz')]) for spec in files)
    sets = read_data_sets(data_dir, validation_size=2, mirrors=(_refused_url(),), files=files)
    assert (sets.train.num_examples, sets.test.num_examples) == (4, 3)
    assert sorted(sets.validation.labels.tolist()) == [0, 5]


def test_gz_preferred_and_only_missing_files_downloaded(server, tmp_path):
    root, base = server
    (root / 'mirror').mkdir()
    files = _tiny_mnist(root / 'mirror')
    data_dir = tmp_path / 'mnist'
    data_dir.mkdir()
    for spec in files:
        (data_dir / spec.name).write_bytes((root / 'mirror' / spec.name).read_bytes())
    # train images: both forms, and the unpacked one is junk that must not be read.
    (data_dir / 'train-images-idx3-ubyte').write_bytes(b'junk')
    # train labels: only the unpacked form; test images: neither, so it is downloaded.
    raw_labels = _unpack(data_dir / files.train_labels.name)
    (data_dir / files.test_images.name).unlink()
    paths = mnist.ensure_mnist(data_dir, mirrors=(f'{base}/mirror/',), files=files)
    assert paths == (str(data_dir / files.train_images.name), str(raw_labels),
                     str(data_dir / files.test_images.name),
                     str(data_dir / files.test_labels.name))
    assert sorted(os.listdir(data_dir)) == sorted([
        'train-images-idx3-ubyte.gz', 'train-images-idx3-ubyte', 'train-labels-idx1-ubyte',
        't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'])
    assert read_data_sets(data_dir, validation_size=0, download=False,
                          files=files).train.num_examples == 6


def test_mnist_table_matches_datasets_md():
    assert [spec.name for spec in mnist.FILES] == [
        'train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
        't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz']
    assert [spec.num_bytes for spec in mnist.FILES] == [9912422, 28881, 1648877, 4542]
    assert all(len(spec.sha256) == 64 for spec in mnist.FILES)
    assert mnist.MIRRORS[0] == 'https://storage.googleapis.com/cvdf-datasets/mnist/'
    assert mnist.MIRRORS[-1] == 'http://yann.lecun.com/exdb/mnist/'
