"""Reader and writer for the IDX file format used by MNIST.

An IDX file is: two zero bytes, a type byte, a byte giving the number of
dimensions, one big-endian uint32 per dimension, then the array data in
big-endian, row-major order. Files may be gzip-compressed; readers tell by
content, not by name, since a raw IDX file always starts with two zero bytes
and a gzip stream never does.
"""
import gzip
import io
import math
import os
import struct
import zlib

import numpy as np

from towers.data.atomic import atomic_output
from towers.data.errors import IdxFormatError

# IDX type byte -> on-disk dtype (IDX data is always big-endian).
_DTYPES = {
    0x08: np.dtype('u1'),
    0x09: np.dtype('i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}
# (numpy kind, itemsize) -> IDX type byte, so any byte order maps to one code.
_CODES = {(dtype.kind, dtype.itemsize): code for code, dtype in _DTYPES.items()}
_GZIP_MAGIC = b'\x1f\x8b'


def read_idx(path, ndim=None):
    """Reads an IDX file, gzip-compressed or raw, whatever its name says.

    Args:
        path: str or os.PathLike, the file to read.
        ndim: if given, the number of dimensions the file must have.

    Returns:
        np.ndarray with the shape from the header and the dtype from the type
        byte (uint8, int8, int16, int32, float32 or float64), in native byte
        order, writable.

    Raises:
        IdxFormatError: bad magic, unknown type byte, unexpected ndim,
            truncated data, trailing bytes, or corrupt gzip. The message names
            the file.
    """
    path = os.fspath(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise IdxFormatError(f'{path}: only {len(raw)} bytes, too short for an IDX header; '
                             'the file is truncated, fetch it again')
    if raw[0] != 0 or raw[1] != 0:
        raise IdxFormatError(f'{path}: bad IDX magic {raw[:4].hex()} (first two bytes must be '
                             'zero); this is not an IDX file')
    code, rank = raw[2], raw[3]
    if code not in _DTYPES:
        raise IdxFormatError(f'{path}: bad IDX magic {raw[:4].hex()} (unknown type byte '
                             f'0x{code:02x}); this is not an IDX file')
    header_len = 4 + 4 * rank
    if len(raw) < header_len:
        raise IdxFormatError(f'{path}: IDX header for {rank} dimensions needs {header_len} '
                             f'bytes, file has {len(raw)}; the file is truncated, fetch it again')
    shape = struct.unpack(f'>{rank}I', raw[4:header_len])
    if ndim is not None and rank != ndim:
        raise IdxFormatError(f'{path}: expected {ndim}-D IDX data, found {rank}-D with shape '
                             f'{shape}; check that this is the right file')
    dtype = _DTYPES[code]
    count = math.prod(shape)
    needed = count * dtype.itemsize
    have = len(raw) - header_len
    if have < needed:
        raise IdxFormatError(f'{path}: shape {shape} needs {needed} data bytes, file has '
                             f'{have}; the file is truncated, fetch it again')
    if have > needed:
        raise IdxFormatError(f'{path}: {have - needed} unexpected trailing bytes after the '
                             f'{shape} data; the file is corrupt, fetch it again')
    array = np.frombuffer(raw, dtype=dtype, count=count, offset=header_len).reshape(shape)
    # astype copies, which both fixes the byte order and makes the result writable.
    return array.astype(dtype.newbyteorder('='))


def read_images(path):
    """Reads an IDX image file: [N, H, W] of its stored dtype; IdxFormatError if not 3-D.

    Whether the dtype and H, W are the dataset's is data.checks' concern, so
    every loader says it in the same words.
    """
    return read_idx(path, ndim=3)


def read_labels(path):
    """Reads an IDX label file: [N] of its stored dtype; IdxFormatError if not 1-D."""
    return read_idx(path, ndim=1)


def write_idx(path, array, compress=None):
    """Writes `array` as an IDX file, atomically.

    The bytes go to a temporary file in the destination folder that is then
    renamed over `path`, so readers never see a half-written file. Gzip output
    has mtime 0 and no embedded file name, so identical arrays give identical
    bytes.

    Args:
        path: str or os.PathLike, destination.
        array: array-like of dtype uint8, int8, int16, int32, float32 or
            float64 (any byte order), at most 255 dimensions.
        compress: gzip the output; defaults to whether `path` ends in `.gz`.
            (read_idx does not care: it reads either kind under any name.)

    Raises:
        IdxFormatError: the dtype or shape cannot be stored in IDX.
    """
    path = os.fspath(path)
    array = np.asarray(array)
    code = _CODES.get((array.dtype.kind, array.dtype.itemsize))
    if code is None:
        raise IdxFormatError(f'{path}: IDX cannot store dtype {array.dtype}; cast the array to '
                             'uint8, int8, int16, int32, float32 or float64 first')
    if array.ndim > 255 or any(dim >= 2**32 for dim in array.shape):
        raise IdxFormatError(f'{path}: IDX cannot store shape {array.shape} (at most 255 '
                             'dimensions of < 2**32 each)')
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f'>{array.ndim}I', *array.shape)
    payload = header + np.ascontiguousarray(array, dtype=_DTYPES[code]).tobytes()
    if compress is None:
        compress = path.endswith('.gz')
    if compress:
        payload = _gzip(payload)
    with atomic_output(path) as out:
        out.write(payload)


def _read_bytes(path):
    with open(path, 'rb') as f:
        raw = f.read()
    # By magic, not suffix: browsers and unpacking tools sometimes leave raw
    # bytes under a .gz name, or gzip data under a plain one.
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise IdxFormatError(f'{path}: corrupt gzip data ({err}); delete the file and '
                                 'fetch it again') from err
    return raw


def _gzip(payload):
    # GzipFile rather than gzip.compress: with filename='' and mtime=0 its
    # header is the same on every Python version, so outputs are reproducible.
    # Level 6, not 9: on MNIST images 9 is ~15x slower for 2% fewer bytes.
    buffer = io.BytesIO()
    with gzip.GzipFile(filename='', mode='wb', fileobj=buffer, compresslevel=6, mtime=0) as gz:
        gz.write(payload)
    return buffer.getvalue()

