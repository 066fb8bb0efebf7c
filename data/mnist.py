"""Where IDX datasets (MNIST and its look-alikes) come from and how to make sure they are on disk.

An IDX dataset is four gzip files with the MNIST names, described by an
IdxSource: a title for messages, a table of the four files and the base URLs
of its mirrors. MNIST's is `SOURCE` below; Fashion-MNIST's lives in
data/fashion_mnist.py.
"""
import collections
import os

from towers.data.download import download as download_file
from towers.data.download import mirror_urls, missing_reason
from towers.data.errors import DatasetNotFoundError, DownloadError
from towers.data.locate import describe_search

FileSpec = collections.namedtuple('FileSpec', ['name', 'num_bytes', 'sha256'])
MnistPaths = collections.namedtuple(
    'MnistPaths', ['train_images', 'train_labels', 'test_images', 'test_labels'])
IdxSource = collections.namedtuple('IdxSource', ['title', 'files', 'mirrors'])
IdxSource.__doc__ = """One IDX dataset's download facts.

Attributes:
    title: name used in messages, e.g. 'MNIST'.
    files: MnistPaths of FileSpec, the four upstream gzip files.
    mirrors: base URLs tried in order; a file's URL is base + file name.
"""

# The upstream gzip files; the SHA-256 values are the ones many public projects agree on.
FILES = MnistPaths(
    train_images=FileSpec('train-images-idx3-ubyte.gz', 9912422,
                          '440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609'),
    train_labels=FileSpec('train-labels-idx1-ubyte.gz', 28881,
                          '3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c'),
    test_images=FileSpec('t10k-images-idx3-ubyte.gz', 1648877,
                         '8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6'),
    test_labels=FileSpec('t10k-labels-idx1-ubyte.gz', 4542,
                         'f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6'),
)

# Fallback order: the Google and PyTorch copies are fast and reliable; the
# original site often refuses or rate-limits, so it comes last.
MIRRORS = (
    'https://storage.googleapis.com/cvdf-datasets/mnist/',
    'https://ossci-datasets.s3.amazonaws.com/mnist/',
    'http://yann.lecun.com/exdb/mnist/',
)

SOURCE = IdxSource('MNIST', FILES, MIRRORS)

# What every IDX dataset here holds (MNIST, Fashion-MNIST, the embedded sample): 28x28 grey
# images of ten classes. data.registry declares them with these; loaders check files against it.
INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10


def ensure_mnist(data_dir, mirrors=MIRRORS, download=True, files=None):
    """Makes sure the four MNIST files are in `data_dir`; see ensure_idx.

    Args:
        data_dir: str or os.PathLike, folder holding the files.
        mirrors: base URLs tried in order; a file's URL is base + file name.
        download: if False, never touch the network.
        files: a MnistPaths of FileSpec; defaults to `FILES` (tests pass
            their own table so tiny generated files validate).

    Returns:
        MnistPaths of four str paths, as ensure_idx.
    """
    return ensure_idx(data_dir, SOURCE._replace(files=FILES if files is None else files,
                                                mirrors=mirrors), download=download)


def has_idx_files(data_dir, files=FILES):
    """True when each of the four files is in data_dir, gzipped or uncompressed."""
    return all(_find(os.fspath(data_dir), spec.name) is not None for spec in files)


def ensure_idx(data_dir, source, download=True, searched=()):
    """Makes sure an IDX dataset's four files are in `data_dir`, downloading missing ones.

    Each file may be present gzipped under its table name or uncompressed
    under that name without `.gz` (`train-images-idx3-ubyte`, as many tools
    unpack it); the gzipped one wins when both are there. Files already
    present are trusted as they are and not re-checksummed: users may keep
    recompressed or unpacked copies (Debian's packages recompress). Only
    fresh downloads, always of the `.gz` name, are verified.

    Args:
        data_dir: str or os.PathLike, folder holding the files.
        source: IdxSource, the files and where to get them.
        download: if False, never touch the network.
        searched: folders already looked in (see data.locate), named in the
            error message; empty when the caller named one folder.

    Returns:
        MnistPaths of four str paths (train images, train labels, test images,
        test labels), each the gzipped or the uncompressed file, whichever is
        there.

    Raises:
        DatasetNotFoundError: files are missing and could not be downloaded;
            the message lists exactly which ones and the folder to put them in.
    """
    data_dir = os.fspath(data_dir)
    failure = None
    if download:
        for spec in source.files:
            if _find(data_dir, spec.name) is not None:
                continue
            try:
                download_file(mirror_urls(source.mirrors, spec.name),
                              os.path.join(data_dir, spec.name), spec.sha256)
            except DownloadError as err:
                # Offline machines fail every file the same way; stop at the first.
                failure = err
                break
    found = [_find(data_dir, spec.name) for spec in source.files]
    missing = [spec.name for spec, path in zip(source.files, found) if path is None]
    if missing:
        how = missing_reason(failure)
        where = f'; {describe_search(searched)}' if searched else ''
        unpacked = [name[:-len('.gz')] for name in missing if name.endswith('.gz')]
        either = (f', each gzipped as named or uncompressed without .gz (e.g. {unpacked[0]})'
                  if unpacked else '')
        raise DatasetNotFoundError(
            f'{source.title} file(s) missing from {data_dir}: {", ".join(missing)} ({how}){where}; '
            f'put them in {data_dir} by hand{either}') from failure
    return MnistPaths(*found)


def _find(data_dir, name):
    """Returns the path of `name`, or of its uncompressed twin, in data_dir; None if neither."""
    candidates = [name]
    if name.endswith('.gz'):
        candidates.append(name[:-len('.gz')])
    for candidate in candidates:
        path = os.path.join(data_dir, candidate)
        # isfile: some archives unpack to a folder named like the file.
        if os.path.isfile(path):
            return path
    return None
