"""Tests for data/idx.py (round trips, every kind of malformed file) and data/atomic.py."""
import gzip
import os
import stat
import struct

import numpy as np
import pytest

from towers.data import IdxFormatError, read_idx, write_idx
from towers.data.atomic import atomic_output
from towers.data.idx import read_images, read_labels

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]


def _example(dtype, shape=(3, 4, 5)):
    values = np.arange(np.prod(shape)).reshape(shape) - 7  # negatives for signed types
    if np.issubdtype(dtype, np.floating):
        values = values * 0.37
    return values.astype(dtype) if dtype != np.uint8 else (values % 256).astype(dtype)


@pytest.mark.parametrize('suffix', ['.gz', ''])
@pytest.mark.parametrize('dtype', DTYPES)
def test_round_trip(tmp_path, dtype, suffix):
    original = _example(dtype)
    path = tmp_path / f'x-idx{suffix}'
    write_idx(path, original)
    loaded = read_idx(path)
    assert loaded.dtype == np.dtype(dtype)
    assert loaded.dtype.isnative
    assert loaded.flags.writeable
    np.testing.assert_array_equal(loaded, original)
    assert (path.read_bytes()[:2] == b'\x1f\x8b') == (suffix == '.gz')


def test_raw_header_layout_is_big_endian(tmp_path):
    path = tmp_path / 'x'
    write_idx(path, np.array([[1, 258]], dtype='<i4'))
    raw = path.read_bytes()
    assert raw[:4] == bytes([0, 0, 0x0C, 2])
    assert struct.unpack('>2I', raw[4:12]) == (1, 2)
    assert struct.unpack('>2i', raw[12:]) == (1, 258)


def test_gzip_detected_by_magic_without_suffix(tmp_path):
    path = tmp_path / 'plain-name'
    write_idx(path, _example(np.uint8), compress=True)
    np.testing.assert_array_equal(read_idx(path), _example(np.uint8))


def test_raw_data_under_a_gz_name(tmp_path):
    # What a browser that undoes Content-Encoding: gzip leaves behind.
    path = tmp_path / 'x-idx.gz'
    write_idx(path, _example(np.int16), compress=False)
    assert path.read_bytes()[:2] == b'\x00\x00'
    np.testing.assert_array_equal(read_idx(path), _example(np.int16))


def test_gzip_output_is_reproducible_and_leaves_no_temp_files(tmp_path):
    first, second = tmp_path / 'a' / 'x.gz', tmp_path / 'b' / 'x.gz'
    first.parent.mkdir()
    second.parent.mkdir()
    write_idx(first, _example(np.float32))
    write_idx(second, _example(np.float32))
    assert first.read_bytes() == second.read_bytes()
    assert os.listdir(first.parent) == ['x.gz']


def test_write_rejects_unsupported_dtype(tmp_path):
    with pytest.raises(IdxFormatError, match='int64'):
        write_idx(tmp_path / 'x', np.zeros(3, dtype=np.int64))
    assert os.listdir(tmp_path) == []


def test_read_images_and_labels(tmp_path):
    write_idx(tmp_path / 'i.gz', np.zeros((2, 28, 28), np.uint8))
    write_idx(tmp_path / 'l.gz', np.array([3, 9], np.uint8))
    assert read_images(tmp_path / 'i.gz').shape == (2, 28, 28)
    assert read_labels(tmp_path / 'l.gz').tolist() == [3, 9]
    with pytest.raises(IdxFormatError, match='l.gz'):
        read_images(tmp_path / 'l.gz')
    # The stored dtype comes back as it is: whether it is the dataset's is data.checks' to say.
    write_idx(tmp_path / 'f.gz', np.zeros(2, np.float32))
    assert read_labels(tmp_path / 'f.gz').dtype == np.float32


def _write_raw(path, payload):
    if path.name.endswith('.gz'):
        payload = gzip.compress(payload)
    path.write_bytes(payload)
    return path


GOOD = bytes([0, 0, 0x08, 2]) + struct.pack('>2I', 2, 3) + bytes(range(6))


@pytest.mark.parametrize('name', ['bad-magic.gz', 'bad-magic'])
@pytest.mark.parametrize('payload, message', [
    (b'\x01' + GOOD[1:], 'bad IDX magic'),              # first byte not zero
    (GOOD[:2] + b'\x07' + GOOD[3:], 'unknown type byte'),
    (GOOD[:10], 'truncated'),                           # header cut short
    (GOOD[:-1], 'truncated'),                           # data one byte short
    (GOOD + b'\x00\x00', 'trailing'),
    (b'\x00\x00', 'too short'),
])
def test_malformed_file_names_the_file(tmp_path, name, payload, message):
    path = _write_raw(tmp_path / name, payload)
    with pytest.raises(IdxFormatError, match=message) as info:
        read_idx(path)
    assert str(path) in str(info.value)
    assert '\n' not in str(info.value)


def test_wrong_ndim(tmp_path):
    path = _write_raw(tmp_path / 'labels.gz', GOOD)
    assert read_idx(path, ndim=2).shape == (2, 3)
    with pytest.raises(IdxFormatError, match=r'expected 3-D.*found 2-D') as info:
        read_idx(path, ndim=3)
    assert str(path) in str(info.value)


def test_gz_name_without_gzip_or_idx_data(tmp_path):
    path = tmp_path / 'page.gz'
    path.write_bytes(b'<html>not found</html>')
    with pytest.raises(IdxFormatError, match='bad IDX magic') as info:
        read_idx(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize('payload', [
    # mtime=0: the same bytes in every process (pytest-xdist's workers collect them apart).
    gzip.compress(GOOD, mtime=0)[:-12],                 # gzip stream cut off
    gzip.compress(GOOD, mtime=0)[:12] + b'\xff' * 20,   # gzip magic, garbage body
])
def test_corrupt_gzip(tmp_path, payload):
    path = tmp_path / 'broken.gz'
    path.write_bytes(payload)
    with pytest.raises(IdxFormatError, match='corrupt gzip') as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_idx_format_error_is_a_value_error():
    assert issubclass(IdxFormatError, ValueError)


def _temp_files(folder):
    return [p for p in folder.iterdir() if p.name.startswith('.')]


def test_atomic_output_syncs_full_contents_before_rename(tmp_path, monkeypatch):
    # A crash right after the rename must find the bytes on disk, not an empty file.
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        [temp] = _temp_files(tmp_path)
        events.append(('fsync', temp.read_bytes()))  # what the OS holds: flushed already?
        real_fsync(fd)

    def replace(src, dst):
        events.append(('replace', os.path.basename(dst)))
        real_replace(src, dst)
    monkeypatch.setattr(os, 'fsync', fsync)
    monkeypatch.setattr(os, 'replace', replace)
    with atomic_output(tmp_path / 'out.bin') as out:
        out.write(b'payload')
    assert events == [('fsync', b'payload'), ('replace', 'out.bin')]
    assert (tmp_path / 'out.bin').read_bytes() == b'payload'
    assert stat.S_IMODE(os.stat(tmp_path / 'out.bin').st_mode) == 0o644
    assert os.listdir(tmp_path) == ['out.bin']


@pytest.mark.parametrize('error', [KeyboardInterrupt, ValueError])
def test_atomic_output_failure_keeps_old_file_and_leaves_no_temp(tmp_path, error):
    path = tmp_path / 'out.bin'
    path.write_bytes(b'old')
    with pytest.raises(error):
        with atomic_output(path, suffix='.part') as out:
            out.write(b'new')
            assert _temp_files(tmp_path)[0].name.endswith('.part')
            raise error
    assert path.read_bytes() == b'old'
    assert os.listdir(tmp_path) == ['out.bin']


def test_write_idx_goes_through_atomic_output(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, 'fsync', lambda fd: (synced.append(fd), real_fsync(fd)))
    write_idx(tmp_path / 'x.gz', _example(np.uint8))
    assert len(synced) == 1
    assert stat.S_IMODE(os.stat(tmp_path / 'x.gz').st_mode) == 0o644
