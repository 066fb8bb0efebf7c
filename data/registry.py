"""Named datasets: what each looks like, where its files are found and how to load it.

Every named dataset except the embedded sample is looked for in one order
(data.locate): the data_dir argument (`--data-dir`), `$TOWERS_DATA_DIR/<name>`,
`~/.cache/towers/<name>`, `/usr/share/datasets/<name>` (Debian's name, e.g.
`fashion-mnist`). The first folder holding the files wins; otherwise missing
files are downloaded, checked, into the first of those folders.
"""
import collections
import os
import types

from towers.data import cifar10, fashion_mnist, mnist, sample
from towers.data.dataset import read_data_sets
from towers.data.errors import DataError
from towers.data.locate import locate

DatasetInfo = collections.namedtuple('DatasetInfo', [
    'name', 'input_shape', 'num_classes', 'num_train', 'num_test', 'default_validation_size',
    'description', 'class_names'])

_DIGITS = tuple(str(digit) for digit in range(10))

DATASETS = types.MappingProxyType({
    'mnist_sample': DatasetInfo(
        name='mnist_sample', input_shape=mnist.INPUT_SHAPE, num_classes=mnist.NUM_CLASSES,
        num_train=sample.NUM_TRAIN, num_test=sample.NUM_TEST, default_validation_size=0,
        description='4,000 train / 1,000 test real MNIST digits shipped with the package '
                    '(offline default)',
        class_names=_DIGITS),
    'mnist': DatasetInfo(
        name='mnist', input_shape=mnist.INPUT_SHAPE, num_classes=mnist.NUM_CLASSES,
        num_train=60000, num_test=10000, default_validation_size=5000,
        description='full MNIST, 60,000 train / 10,000 test, downloaded on first use',
        class_names=_DIGITS),
    'fashion_mnist': DatasetInfo(
        name='fashion_mnist', input_shape=mnist.INPUT_SHAPE, num_classes=mnist.NUM_CLASSES,
        num_train=60000, num_test=10000, default_validation_size=5000,
        description="Zalando's Fashion-MNIST, 60,000 train / 10,000 test clothing images, "
                    'downloaded on first use or found where Debian installs it',
        class_names=fashion_mnist.CLASS_NAMES),
    'cifar10': DatasetInfo(
        name='cifar10', input_shape=cifar10.INPUT_SHAPE, num_classes=cifar10.NUM_CLASSES,
        num_train=50000, num_test=10000, default_validation_size=5000,
        description='CIFAR-10 (binary version), 50,000 train / 10,000 test 32x32 colour images, '
                    'downloaded on first use',
        class_names=cifar10.CLASS_NAMES),
})
DEFAULT_DATASET = 'mnist_sample'


def _idx_dataset(get_source):
    """(has_files, load) for an IDX dataset; get_source() gives its IdxSource at call time."""
    def has_files(folder):
        return mnist.has_idx_files(folder, get_source().files)

    def load(folder, download, searched, one_hot, validation_size, seed, info):
        source = get_source()
        mnist.ensure_idx(folder, source, download=download, searched=searched)
        return read_data_sets(folder, one_hot=one_hot, validation_size=validation_size,
                              seed=seed, download=False, files=source.files, info=info)
    return has_files, load


def _load_cifar10(folder, download, searched, one_hot, validation_size, seed, info):
    return cifar10.read_data_sets(folder, one_hot=one_hot, validation_size=validation_size,
                                  seed=seed, download=download, mirrors=cifar10.MIRRORS,
                                  archive=cifar10.ARCHIVE, searched=searched, info=info)


# How each searched-for dataset is found and read: its folder name under
# /usr/share/datasets, has_files(folder) -> bool, and
# load(folder, download, searched, one_hot, validation_size, seed, info) -> Datasets, its
# files checked against info (the DatasetInfo below) as they are read.
# File tables are read at call time, so tests can patch mnist.SOURCE, cifar10.ARCHIVE, ...
_Source = collections.namedtuple('_Source', ['system_name', 'has_files', 'load'])
_SOURCES = {
    'mnist': _Source('mnist', *_idx_dataset(lambda: mnist.SOURCE)),
    'fashion_mnist': _Source(fashion_mnist.SYSTEM_NAME,
                             *_idx_dataset(lambda: fashion_mnist.SOURCE)),
    'cifar10': _Source('cifar10', lambda folder: cifar10.has_cifar10(folder), _load_cifar10),
}


def dataset_info(name):
    """Returns the DatasetInfo for `name`; raises DataError for unknown names."""
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f'unknown dataset {name!r}; known datasets: '
                        f'{", ".join(sorted(DATASETS))}') from None


def find_dataset(name, data_dir=None):
    """Where a named dataset's files are, or would be downloaded to.

    Args:
        name: a key of DATASETS other than 'mnist_sample'.
        data_dir: str or os.PathLike given by the user (`--data-dir`), or None.

    Returns:
        data.locate.Location(folder, found, searched).

    Raises:
        DataError: unknown name, or the embedded sample (which is not searched for).
    """
    dataset_info(name)
    if name not in _SOURCES:
        raise DataError(f'{name!r} ships with the package; it has no data folder to search for')
    source = _SOURCES[name]
    return locate(name, source.has_files, data_dir=data_dir, system_name=source.system_name)


def load_dataset(name, data_dir=None, validation_size=None, one_hot=False, seed=None,
                 download=True):
    """Loads a named dataset.

    Args:
        name: a key of DATASETS.
        data_dir: folder to look in first (see the module docstring for the
            search order); for 'mnist_sample', the one folder to read instead
            of the embedded one.
        validation_size: training examples held out; defaults to the dataset's
            default_validation_size.
        one_hot: labels as float32 one-hot [N, num_classes] instead of int64 [N].
        seed: seed for each DataSet's shuffling.
        download: allow fetching missing files (ignored for the embedded sample).

    Returns:
        Datasets(train, validation, test) of DataSet, images float32
        [N, *input_shape] in [0, 1].

    Raises:
        DatasetNotFoundError: files missing and not downloadable; the message
            lists every folder searched.
        DataMismatchError: a file holds images of another shape or dtype than
            the dataset's input_shape (uint8), or labels of another count, type
            or range than its num_classes; the message names the file.
        DataError: unknown name, or any other data.errors failure while loading.
        ValueError: validation_size out of range.
    """
    info = dataset_info(name)
    if validation_size is None:
        validation_size = info.default_validation_size
    if name == 'mnist_sample':
        return sample.load_sample(one_hot=one_hot, validation_size=validation_size, seed=seed,
                                  data_dir=data_dir, info=info)
    location = find_dataset(name, data_dir)
    return _SOURCES[name].load(location.folder, download, location.searched, one_hot,
                               validation_size, seed, info)


def class_names(name, data_dir=None):
    """The dataset's class names, label i first: CIFAR-10's from batches.meta.txt when present.

    Returns:
        tuple of num_classes str.
    """
    info = dataset_info(name)
    if name == 'cifar10':
        location = find_dataset(name, data_dir)
        if location.found:
            return cifar10.read_class_names(os.path.join(location.folder, cifar10.BATCH_DIR))
    return info.class_names
