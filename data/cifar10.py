"""CIFAR-10 from the official binary version: download, safe extraction and the record reader.

`cifar-10-binary.tar.gz` holds `cifar-10-batches-bin/` with `data_batch_1.bin`
to `data_batch_5.bin` (training) and `test_batch.bin`, 10,000 records each:
one label byte, then 3,072 pixel bytes, the 1,024 red values of the 32x32
image in row-major order, then the 1,024 green, then the 1,024 blue. The
Python version's pickles are never read: unpickling runs arbitrary code.
"""
import os

import numpy as np

from towers.data.archive import extract_folder
from towers.data.checks import Expected, Part, check_labels
from towers.data.dataset import checked_datasets
from towers.data.download import download as download_file
from towers.data.download import mirror_urls, missing_reason
from towers.data.errors import DataError, DatasetNotFoundError, DownloadError
from towers.data.locate import describe_search
from towers.data.mnist import FileSpec

# SHA-256 from tensorflow/datasets, tensorflow_datasets/url_checksums/cifar10.txt, with the
# official size; the same value appears beside the official MD5 (c32a1d4a...) in other projects.
ARCHIVE = FileSpec('cifar-10-binary.tar.gz', 170052171,
                   'c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd')
MIRRORS = ('https://www.cs.toronto.edu/~kriz/',)

BATCH_DIR = 'cifar-10-batches-bin'
TRAIN_FILES = tuple(f'data_batch_{i}.bin' for i in range(1, 6))
TEST_FILES = ('test_batch.bin',)
META_FILE = 'batches.meta.txt'
# Label i is CLASS_NAMES[i]; batches.meta.txt says the same, one name a line.
CLASS_NAMES = ('airplane', 'automobile', 'bird', 'cat', 'deer',
               'dog', 'frog', 'horse', 'ship', 'truck')

HEIGHT, WIDTH, CHANNELS = 32, 32, 3
INPUT_SHAPE = (HEIGHT, WIDTH, CHANNELS)
NUM_CLASSES = 10
EXPECTED = Expected('cifar10', INPUT_SHAPE, NUM_CLASSES)
RECORD_BYTES = 1 + HEIGHT * WIDTH * CHANNELS


class CifarFormatError(DataError, ValueError):
    """A CIFAR-10 binary batch is malformed: empty, or its size is not whole records."""


def read_batch(path):
    """Reads one binary batch file.

    Args:
        path: str or os.PathLike, e.g. `.../cifar-10-batches-bin/data_batch_1.bin`.

    Returns:
        (images uint8 [N, 32, 32, 3] NHWC, labels int64 [N] in [0, 10)).

    Raises:
        CifarFormatError: the file is empty or its size is not a multiple of
            3,073 bytes. The message names the file.
        DataMismatchError: a label is over 9 (see data.checks.check_labels).
    """
    path = os.fspath(path)
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as err:
        raise CifarFormatError(f'cannot read {path}: {err}') from err
    if raw.size == 0 or raw.size % RECORD_BYTES:
        raise CifarFormatError(
            f'{path}: {raw.size} bytes is not a whole number of {RECORD_BYTES}-byte records '
            '(1 label byte + 3,072 pixel bytes); the file is truncated or not a CIFAR-10 binary '
            'batch, fetch it again')
    records = raw.reshape(-1, RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    # The format fixes the image shape; a label byte over 9 is what betrays another dataset's
    # file (CIFAR-100 records start with 2 label bytes).
    check_labels(labels, NUM_CLASSES, path, EXPECTED.name)
    # Planar R, G, B on disk -> [N, C, H, W] -> NHWC, copied so rows are contiguous.
    images = records[:, 1:].reshape(-1, CHANNELS, HEIGHT, WIDTH).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def read_batches(paths):
    """Reads batch files in order: a list of data.checks.Part, one per file."""
    return [Part(*read_batch(path), path, path) for path in paths]


def read_class_names(batches_dir):
    """Returns the ten class names from batches.meta.txt, or CLASS_NAMES if it is absent.

    Raises:
        CifarFormatError: the file is there but does not hold ten names.
    """
    path = os.path.join(os.fspath(batches_dir), META_FILE)
    if not os.path.isfile(path):
        return CLASS_NAMES
    try:
        with open(path, encoding='utf-8') as f:
            names = tuple(line.strip() for line in f if line.strip())
    except (OSError, UnicodeDecodeError) as err:
        raise CifarFormatError(f'cannot read class names from {path}: {err}') from err
    if len(names) != NUM_CLASSES:
        raise CifarFormatError(f'{path} holds {len(names)} class names, expected '
                               f'{NUM_CLASSES}; it is not from CIFAR-10')
    return names


def has_cifar10(data_dir):
    """True when data_dir holds the extracted batch files or the archive to extract them from."""
    data_dir = os.fspath(data_dir)
    return (not _missing_batches(os.path.join(data_dir, BATCH_DIR))
            or os.path.isfile(os.path.join(data_dir, ARCHIVE.name)))


def ensure_cifar10(data_dir, download=True, mirrors=MIRRORS, archive=ARCHIVE, searched=()):
    """Makes sure data_dir/cifar-10-batches-bin holds the six batch files.

    In order: batch files already there are used as they are; else the
    archive in data_dir is extracted (safely, all or nothing, see
    data.archive); else the archive is downloaded, checked against its
    SHA-256, and extracted. An archive already present is trusted, like
    every local file; only downloads are checksummed. The archive is kept.

    Args:
        data_dir: str or os.PathLike, folder holding the archive and/or
            `cifar-10-batches-bin/`.
        download: if False, never touch the network.
        mirrors: base URLs tried in order; the URL is base + archive name.
        archive: FileSpec of the archive (tests pass their own).
        searched: folders already looked in (see data.locate), for the error.

    Returns:
        str, the path of the `cifar-10-batches-bin` folder.

    Raises:
        DatasetNotFoundError: the files are missing and could not be
            downloaded, or the batches folder is incomplete.
        ArchiveError: the archive is corrupt, incomplete or unsafe.
    """
    data_dir = os.fspath(data_dir)
    batches_dir = os.path.join(data_dir, BATCH_DIR)
    missing = _missing_batches(batches_dir)
    if not missing:
        return batches_dir
    archive_path = os.path.join(data_dir, archive.name)
    if os.path.lexists(batches_dir):
        raise DatasetNotFoundError(
            f'{batches_dir} lacks {", ".join(missing)}; put them there, or delete the folder so '
            f'that {archive.name} is extracted again')
    failure = None
    if download and not os.path.isfile(archive_path):
        try:
            download_file(mirror_urls(mirrors, archive.name), archive_path, archive.sha256)
        except DownloadError as err:
            failure = err
    if not os.path.isfile(archive_path):
        how = missing_reason(failure)
        where = f'; {describe_search(searched)}' if searched else ''
        raise DatasetNotFoundError(
            f'CIFAR-10 missing from {data_dir}: neither {BATCH_DIR}/ nor {archive.name} is there '
            f'({how}){where}; put {archive.name} (the binary version, sha256 {archive.sha256}) '
            f'or its extracted {BATCH_DIR}/ folder in {data_dir} by hand') from failure
    return extract_folder(archive_path, BATCH_DIR, data_dir, required=TRAIN_FILES + TEST_FILES)


def read_data_sets(data_dir, one_hot=False, validation_size=5000, seed=None, download=True,
                   mirrors=MIRRORS, archive=ARCHIVE, searched=(), info=EXPECTED):
    """Reads CIFAR-10 into Datasets, like data.read_data_sets does MNIST.

    Args:
        data_dir: str or os.PathLike; see ensure_cifar10.
        one_hot: labels as float32 one-hot [N, 10] instead of int64 [N].
        validation_size: how many of the first training examples become the
            validation set; 0 gives an empty validation DataSet.
        seed: seed for each DataSet's shuffling.
        download, mirrors, archive, searched: as ensure_cifar10.
        info: what the files must hold (the registry passes its DatasetInfo).

    Returns:
        Datasets(train, validation, test) of DataSet, images float32
        [N, 32, 32, 3] in [0, 1].

    Raises:
        DatasetNotFoundError, ArchiveError: as ensure_cifar10.
        CifarFormatError: a batch file is malformed.
        DataMismatchError: a batch holds a label over 9 (see data.checks).
        ValueError: validation_size is outside [0, number of training examples].
    """
    batches_dir = ensure_cifar10(data_dir, download=download, mirrors=mirrors, archive=archive,
                                 searched=searched)
    train = read_batches([os.path.join(batches_dir, name) for name in TRAIN_FILES])
    test = read_batches([os.path.join(batches_dir, name) for name in TEST_FILES])
    return checked_datasets(train, test, info, validation_size, one_hot=one_hot, seed=seed)


def _missing_batches(batches_dir):
    return [name for name in TRAIN_FILES + TEST_FILES
            if not os.path.isfile(os.path.join(batches_dir, name))]
