"""Named datasets: what each looks like and how to load it."""
import collections
import os
import types

from data import sample
from data.dataset import read_data_sets
from data.errors import DataError

DatasetInfo = collections.namedtuple('DatasetInfo', [
    'name', 'input_shape', 'num_classes', 'num_train', 'num_test', 'default_validation_size',
    'description'])

DATASETS = types.MappingProxyType({
    'mnist_sample': DatasetInfo(
        name='mnist_sample', input_shape=(28, 28, 1), num_classes=10,
        num_train=sample.NUM_TRAIN, num_test=sample.NUM_TEST, default_validation_size=0,
        description='4,000 train / 1,000 test real MNIST digits shipped with the package '
                    '(offline default)'),
    'mnist': DatasetInfo(
        name='mnist', input_shape=(28, 28, 1), num_classes=10,
        num_train=60000, num_test=10000, default_validation_size=5000,
        description='full MNIST, 60,000 train / 10,000 test, downloaded on first use'),
})
DEFAULT_DATASET = 'mnist_sample'


def dataset_info(name):
    """Returns the DatasetInfo for `name`; raises DataError for unknown names."""
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f'unknown dataset {name!r}; known datasets: '
                        f'{", ".join(sorted(DATASETS))}') from None


def default_data_dir(name):
    """$TOWERS_DATA_DIR/<name> if that variable is set, else ~/.cache/towers/<name>."""
    root = os.environ.get('TOWERS_DATA_DIR')
    if root:
        return os.path.join(root, name)
    return os.path.join(os.path.expanduser('~'), '.cache', 'towers', name)


def load_dataset(name, data_dir=None, validation_size=None, one_hot=False, seed=None,
                 download=True):
    """Loads a named dataset.

    Args:
        name: a key of DATASETS.
        data_dir: folder holding the files; defaults to the embedded folder for
            'mnist_sample' and to default_data_dir(name) otherwise.
        validation_size: training examples held out; defaults to the dataset's
            default_validation_size.
        one_hot: labels as float32 one-hot [N, num_classes] instead of int64 [N].
        seed: seed for each DataSet's shuffling.
        download: allow fetching missing files (ignored for the embedded sample).

    Returns:
        Datasets(train, validation, test), images float32 [N, *input_shape].

    Raises:
        DataError: unknown name, or any data.errors failure while loading.
        ValueError: validation_size out of range.
    """
    info = dataset_info(name)
    if validation_size is None:
        validation_size = info.default_validation_size
    if name == 'mnist_sample':
        return sample.load_sample(one_hot=one_hot, validation_size=validation_size, seed=seed,
                                  data_dir=data_dir)
    return read_data_sets(default_data_dir(name) if data_dir is None else data_dir,
                          one_hot=one_hot, validation_size=validation_size, seed=seed,
                          download=download)
