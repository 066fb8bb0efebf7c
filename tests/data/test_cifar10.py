"""Tests for data/cifar10.py (binary record reader, download + extraction) and data/archive.py."""
import hashlib
import io
import os
import tarfile

import numpy as np
import pytest

from towers.data import (
    ArchiveError,
    CifarFormatError,
    DataMismatchError,
    DatasetNotFoundError,
    cifar10,
    class_names,
    extract_folder,
    load_dataset,
    locate,
    read_cifar10_batch,
)
from towers.data.mnist import FileSpec

RECORD = 3073


@pytest.fixture(autouse=True)
def isolated_folders(tmp_path, monkeypatch):
    """Keeps the real ~/.cache, $TOWERS_DATA_DIR and /usr/share/datasets out of every test."""
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    monkeypatch.delenv('TOWERS_DATA_DIR', raising=False)
    monkeypatch.setattr(locate, 'SYSTEM_DATA_DIR', str(tmp_path / 'system'))


def _record(label, red, green, blue):
    """One record, written byte by byte as the format says: label, 1024 R, 1024 G, 1024 B.

    red, green, blue: callables (row, col) -> 0..255.
    """
    out = bytearray([label])
    for plane in (red, green, blue):
        out += bytes(plane(row, col) for row in range(32) for col in range(32))
    return bytes(out)


def _example(index, label):
    """Record `index`: R = (row + index) % 256, G = col, B = 255 - index, label as given."""
    return _record(label, lambda row, col: (row + index) % 256, lambda row, col: col,
                   lambda row, col: 255 - index)


def _batch(labels, start=0):
    return b''.join(_example(start + i, label) for i, label in enumerate(labels))


def test_record_layout_is_planar_rgb_row_major(tmp_path):
    path = tmp_path / 'batch.bin'
    payload = bytearray(_record(7, lambda r, c: 0, lambda r, c: 0, lambda r, c: 0))
    payload[1 + 0] = 11       # R plane byte 0: pixel (0, 0) red
    payload[1 + 1024] = 22    # G plane byte 0: pixel (0, 0) green
    payload[1 + 2048] = 33    # B plane byte 0: pixel (0, 0) blue
    payload[1 + 1] = 44       # R plane byte 1: pixel (0, 1) red
    payload[1 + 32] = 55      # R plane byte 32: pixel (1, 0) red
    payload[1 + 1024 + 32 * 31 + 30] = 66  # G plane: pixel (31, 30) green
    path.write_bytes(bytes(payload))
    images, labels = read_cifar10_batch(path)
    assert images.shape == (1, 32, 32, 3) and images.dtype == np.uint8
    assert labels.tolist() == [7] and labels.dtype == np.int64
    assert images[0, 0, 0].tolist() == [11, 22, 33]
    assert images[0, 0, 1].tolist() == [44, 0, 0]
    assert images[0, 1, 0].tolist() == [55, 0, 0]
    assert images[0, 31, 30].tolist() == [0, 66, 0]
    assert int(images.sum()) == 11 + 22 + 33 + 44 + 55 + 66


def test_batch_parses_to_exact_images_and_labels(tmp_path):
    labels = [3, 0, 9, 5]
    path = tmp_path / 'data_batch_1.bin'
    path.write_bytes(_batch(labels))
    images, read_labels = read_cifar10_batch(path)
    assert read_labels.tolist() == labels
    rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing='ij')
    for index in range(4):
        expected = np.stack([(rows + index) % 256, cols, np.full((32, 32), 255 - index)],
                            axis=-1).astype(np.uint8)
        np.testing.assert_array_equal(images[index], expected)
    assert images.flags['C_CONTIGUOUS']


@pytest.mark.parametrize('size', [0, 1, RECORD - 1, RECORD + 1, 2 * RECORD - 5])
def test_size_not_whole_records_is_refused(tmp_path, size):
    path = tmp_path / 'test_batch.bin'
    path.write_bytes((_batch([1, 2]) + b'\0' * RECORD)[:size])
    with pytest.raises(CifarFormatError) as info:
        read_cifar10_batch(path)
    message = str(info.value)
    assert str(path) in message and f'{size} bytes' in message and '3073-byte' in message


def test_label_over_nine_is_refused(tmp_path):
    path = tmp_path / 'data_batch_2.bin'
    path.write_bytes(_batch([1, 2]) + _example(2, 10))
    with pytest.raises(DataMismatchError) as info:
        read_cifar10_batch(path)
    assert str(info.value) == (f'{path} holds label 10 (record 2), but cifar10 labels are 0-9: '
                               'replace it with the real file')


# --- archives ------------------------------------------------------------------------------

TRAIN_LABELS = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
TEST_LABELS = [9, 8, 7]
META = 'airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n'


def _add(tar, name, payload=b'', **fields):
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(payload) if payload else None)


def _members():
    """(name, payload) of a tiny but complete archive, the folder first."""
    members = [('cifar-10-batches-bin/batches.meta.txt', META.encode())]
    for number, labels in enumerate(TRAIN_LABELS, start=1):
        members.append((f'cifar-10-batches-bin/data_batch_{number}.bin',
                        _batch(labels, start=10 * number)))
    members.append(('cifar-10-batches-bin/test_batch.bin', _batch(TEST_LABELS, start=100)))
    return members


def _archive(path, extra=(), skip=()):
    """Writes a tar.gz like cifar-10-binary.tar.gz; extra: (name, fields) added in the middle.

    Returns a FileSpec matching it.
    """
    members = [m for m in _members() if m[0].rsplit('/', 1)[-1] not in skip]
    with tarfile.open(path, 'w:gz') as tar:
        _add(tar, 'cifar-10-batches-bin', type=tarfile.DIRTYPE, mode=0o755)
        for name, payload in members[:3]:
            _add(tar, name, payload)
        for name, fields in extra:
            _add(tar, name, fields.pop('payload', b''), **fields)
        for name, payload in members[3:]:
            _add(tar, name, payload)
    payload = path.read_bytes()
    return FileSpec(path.name, len(payload), hashlib.sha256(payload).hexdigest())


def test_good_archive_loads_through_load_dataset(server, tmp_path, monkeypatch):
    root, base = server
    spec = _archive(root / 'cifar-10-binary.tar.gz')
    monkeypatch.setattr(cifar10, 'ARCHIVE', spec)
    monkeypatch.setattr(cifar10, 'MIRRORS', (f'{base}/nowhere/', f'{base}/'))
    data_dir = tmp_path / 'cifar'
    sets = load_dataset('cifar10', data_dir=data_dir, validation_size=3, seed=0)
    assert sorted(os.listdir(data_dir)) == ['cifar-10-batches-bin', 'cifar-10-binary.tar.gz']
    assert (sets.train.num_examples, sets.validation.num_examples, sets.test.num_examples) \
        == (7, 3, 3)
    assert sets.train.images.shape[1:] == (32, 32, 3)
    assert sets.train.images.dtype == np.float32
    # Validation is the first three training records: batch 1's two, then batch 2's first.
    assert sets.validation.labels.tolist() == [0, 1, 2]
    # Blue is 255 - index everywhere, so it identifies each record after scaling.
    blue = np.rint(sets.validation.images[:, 5, 5, 2] * 255).astype(int).tolist()
    assert blue == [255 - 10, 255 - 11, 255 - 20]
    assert sets.test.labels.tolist() == TEST_LABELS
    np.testing.assert_allclose(sets.test.images[1, 4, 7], np.array([4 + 101, 7, 255 - 101]) / 255)
    assert class_names('cifar10', data_dir) == tuple(META.split())
    # A second load reads the extracted folder: no network needed.
    monkeypatch.setattr(cifar10, 'MIRRORS', ())
    again = load_dataset('cifar10', data_dir=data_dir, validation_size=0, one_hot=True)
    assert again.train.labels.shape == (10, 10)


def test_archive_already_in_folder_is_extracted_offline(tmp_path, monkeypatch):
    data_dir = tmp_path / 'home' / '.cache' / 'towers' / 'cifar10'
    data_dir.mkdir(parents=True)
    _archive(data_dir / 'cifar-10-binary.tar.gz')  # local: trusted, not checksummed
    sets = load_dataset('cifar10', validation_size=0, download=False)
    assert sets.train.num_examples == 10 and sets.test.num_examples == 3
    assert sorted(os.listdir(data_dir / 'cifar-10-batches-bin')) == sorted(
        name.rsplit('/', 1)[-1] for name, _ in _members())


def test_tampered_download_is_refused(server, tmp_path, monkeypatch):
    root, base = server
    spec = _archive(root / 'cifar-10-binary.tar.gz')
    monkeypatch.setattr(cifar10, 'ARCHIVE', spec._replace(sha256='0' * 64))
    monkeypatch.setattr(cifar10, 'MIRRORS', (f'{base}/',))
    data_dir = tmp_path / 'cifar'
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset('cifar10', data_dir=data_dir)
    message = str(info.value)
    assert 'checksum mismatch' in message and 'CIFAR-10 missing' in message
    assert f'looked in {data_dir}, {tmp_path / "home" / ".cache" / "towers" / "cifar10"}, ' \
           f'{tmp_path / "system" / "cifar10"}' in message
    assert os.listdir(data_dir) == []


def test_offline_error_lists_searched_folders(tmp_path, monkeypatch):
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path / 'env'))
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset('cifar10', download=False)
    message = str(info.value)
    assert 'downloading is disabled' in message
    assert f'looked in {tmp_path / "env" / "cifar10"}, ' in message
    assert f'in {tmp_path / "env" / "cifar10"} by hand' in message


def _outside_untouched(tmp_path, data_dir):
    """Nothing but the archive is left in data_dir, and nothing appeared next to it."""
    assert os.listdir(data_dir) == ['cifar-10-binary.tar.gz']
    assert os.listdir(tmp_path) == ['cifar']
    assert not (tmp_path / 'evil').exists()


EVIL = {
    'dotdot': ('cifar-10-batches-bin/../../evil', {'payload': b'pwned'}, "'..' in its path"),
    'absolute': (None, {'payload': b'pwned'}, 'absolute path'),  # name filled in per test
    'symlink': ('cifar-10-batches-bin/link', {'type': tarfile.SYMTYPE, 'linkname': '../../evil'},
                'symbolic link to \'../../evil\', points outside the target folder'),
    'hardlink': ('cifar-10-batches-bin/hard', {'type': tarfile.LNKTYPE, 'linkname': '../evil'},
                 "hard link to '../evil'"),
    'device': ('cifar-10-batches-bin/null', {'type': tarfile.CHRTYPE, 'devmajor': 1,
                                             'devminor': 3}, 'device'),
}


@pytest.mark.parametrize('kind', sorted(EVIL))
def test_unsafe_member_is_refused_and_nothing_is_written(tmp_path, kind):
    data_dir = tmp_path / 'cifar'
    data_dir.mkdir()
    name, fields, reason = EVIL[kind]
    if name is None:
        name = str(tmp_path / 'evil')
    _archive(data_dir / 'cifar-10-binary.tar.gz', extra=[(name, dict(fields))])
    with pytest.raises(ArchiveError) as info:
        load_dataset('cifar10', data_dir=data_dir, download=False)
    message = str(info.value)
    assert repr(name) in message and reason in message
    _outside_untouched(tmp_path, data_dir)
    # A second try fails the same way: no half folder was left to pass for the real one.
    with pytest.raises(ArchiveError):
        load_dataset('cifar10', data_dir=data_dir, download=False)


def test_symlink_then_write_through_it_is_refused(tmp_path):
    data_dir = tmp_path / 'cifar'
    data_dir.mkdir()
    (tmp_path / 'outside').mkdir()
    _archive(data_dir / 'cifar-10-binary.tar.gz', extra=[
        ('cifar-10-batches-bin/escape', {'type': tarfile.SYMTYPE, 'linkname': str(tmp_path)}),
        ('cifar-10-batches-bin/escape/outside/evil', {'payload': b'pwned'})])
    with pytest.raises(ArchiveError, match='escape'):
        extract_folder(data_dir / 'cifar-10-binary.tar.gz', 'cifar-10-batches-bin', data_dir)
    assert os.listdir(tmp_path / 'outside') == []
    assert os.listdir(data_dir) == ['cifar-10-binary.tar.gz']


def test_truncated_archive_leaves_no_folder(tmp_path):
    data_dir = tmp_path / 'cifar'
    data_dir.mkdir()
    path = data_dir / 'cifar-10-binary.tar.gz'
    _archive(path)
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(ArchiveError, match='corrupt or truncated'):
        load_dataset('cifar10', data_dir=data_dir, download=False)
    assert os.listdir(data_dir) == ['cifar-10-binary.tar.gz']


def test_archive_missing_a_batch_leaves_no_folder(tmp_path):
    data_dir = tmp_path / 'cifar'
    data_dir.mkdir()
    _archive(data_dir / 'cifar-10-binary.tar.gz', skip=('data_batch_4.bin',))
    with pytest.raises(ArchiveError, match='lacks data_batch_4.bin'):
        load_dataset('cifar10', data_dir=data_dir, download=False)
    assert os.listdir(data_dir) == ['cifar-10-binary.tar.gz']


def test_incomplete_batches_folder_is_reported(tmp_path):
    data_dir = tmp_path / 'cifar'
    (data_dir / 'cifar-10-batches-bin').mkdir(parents=True)
    (data_dir / 'cifar-10-batches-bin' / 'data_batch_1.bin').write_bytes(_batch([1]))
    _archive(data_dir / 'cifar-10-binary.tar.gz')
    with pytest.raises(DatasetNotFoundError, match='lacks data_batch_2.bin, data_batch_3.bin'):
        load_dataset('cifar10', data_dir=data_dir, download=False)


def test_extracted_folder_is_used_without_archive(tmp_path):
    batches = tmp_path / 'system' / 'cifar10' / 'cifar-10-batches-bin'
    batches.mkdir(parents=True)
    for name, payload in _members():
        if name.endswith('.bin'):
            (batches / name.rsplit('/', 1)[-1]).write_bytes(payload)
    sets = load_dataset('cifar10', validation_size=0, download=False)
    assert sets.train.labels.tolist() == [label for pair in TRAIN_LABELS for label in pair]
    assert class_names('cifar10') == cifar10.CLASS_NAMES  # no batches.meta.txt there
    (batches / 'batches.meta.txt').write_text('only\nthree\nnames\n')
    with pytest.raises(CifarFormatError, match='3 class names'):
        class_names('cifar10')


def test_bad_batch_inside_folder_names_the_file(tmp_path):
    batches = tmp_path / 'cifar' / 'cifar-10-batches-bin'
    batches.mkdir(parents=True)
    for name, payload in _members():
        (batches / name.rsplit('/', 1)[-1]).write_bytes(payload)
    (batches / 'data_batch_3.bin').write_bytes(_batch([1, 2])[:-1])
    with pytest.raises(CifarFormatError, match='data_batch_3.bin'):
        load_dataset('cifar10', data_dir=tmp_path / 'cifar', download=False)
