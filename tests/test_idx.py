"""Tests for data/idx.py: round trips and every kind of malformed file."""
import gzip
import os
import struct

import numpy as np
import pytest

from data import IdxFormatError, read_idx, write_idx
from data.idx import read_images, read_labels

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
    write_idx(tmp_path / 'f.gz', np.zeros(2, np.float32))
    with pytest.raises(IdxFormatError, match='f.gz.*uint8'):
        read_labels(tmp_path / 'f.gz')


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


@pytest.mark.parametrize('payload', [
    b'this is not gzip at all',                        # .gz suffix, no gzip magic
    gzip.compress(GOOD)[:-12],                          # gzip stream cut off
    gzip.compress(GOOD)[:12] + b'\xff' * 20,            # gzip magic, garbage body
])
def test_corrupt_gzip(tmp_path, payload):
    path = tmp_path / 'broken.gz'
    path.write_bytes(payload)
    with pytest.raises(IdxFormatError, match='corrupt gzip') as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_idx_format_error_is_a_value_error():
    assert issubclass(IdxFormatError, ValueError)
