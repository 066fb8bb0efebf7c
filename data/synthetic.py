"""imagenet-synthetic: random uint8 images of a model's shape, in memory, for benchmarks.

tf_cnn_benchmarks times its nets on synthetic images before real ones, so that the input
is not what is measured; this is the same, held as an ordinary DataSet so that every
input mode (feed, staging, dataset) can read it. The labels are uniform over the classes.
"""
import numpy as np

from towers.data.dataset import DataSet, Datasets
from towers.data.errors import DataError

NAME = 'imagenet-synthetic'
# The most memory the images may take, as float32 (a DataSet holds them so).
MEMORY = 2 ** 30


def synthetic_datasets(input_shape, num_classes, num_train, seed=0):
    """Datasets of num_train random images [H, W, C] (uint8 values, held as float32 in
    [0, 1]) with random labels, and empty validation and test splits.

    Raises:
      DataError: the images would take more than MEMORY.
    """
    needed = num_train * int(np.prod(input_shape)) * 4
    if needed > MEMORY:
        raise DataError('%d synthetic images of %s take %.1f GB, more than the %.1f GB '
                        'allowed: use a smaller batch or image size'
                        % (num_train, 'x'.join(map(str, input_shape)), needed / 1e9,
                           MEMORY / 1e9))
    rng = np.random.RandomState(seed)
    images = rng.randint(0, 256, (num_train,) + tuple(input_shape), dtype=np.uint8)
    labels = rng.randint(0, num_classes, num_train).astype(np.int64)
    train = DataSet(images, labels, num_classes=num_classes, seed=seed)
    train.random_images = True  # nothing to augment (towers.data.augment.RANDOM)
    empty = DataSet(images[:0], labels[:0], num_classes=num_classes)
    return Datasets(train, empty, empty)
