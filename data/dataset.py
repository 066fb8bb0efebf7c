"""In-memory datasets with the classic TensorFlow tutorial API.

`DataSet.next_batch` follows `tensorflow/contrib/learn/python/learn/datasets/
mnist.py` step for step, except that each DataSet owns its random state so a
seeded run is reproducible whatever else uses numpy's global generator.
"""
import collections
import os

import numpy as np

from towers.data import mnist
from towers.data.checks import Expected, Part, check_parts
from towers.data.errors import DataError
from towers.data.idx import read_images, read_labels

Datasets = collections.namedtuple('Datasets', ['train', 'validation', 'test'])


class DataSet:
    """Images and labels held in memory, served in shuffled mini-batches.

    Args:
        images: uint8 [N, H, W] or [N, H, W, C] (scaled to [0, 1] by /255), or
            floating [N, H, W] / [N, H, W, C] already in [0, 1].
        labels: integer [N], each in [0, num_classes).
        one_hot: store labels as float32 [N, num_classes] instead of int64 [N].
        num_classes: number of classes, for the range check and one-hot width.
        seed: seed of this DataSet's private np.random.RandomState.
        origin: where the images came from (their file), for messages such as
            data.check_images's; None for arrays made in memory.

    Raises:
        DataError: images and labels differ in count, or a label is out of range.
        ValueError: images or labels have the wrong rank or dtype.
    """

    def __init__(self, images, labels, one_hot=False, num_classes=10, seed=None, origin=None):
        images = np.asarray(images)
        labels = np.asarray(labels)
        if images.ndim not in (3, 4):
            raise ValueError(f'images must be [N, H, W] or [N, H, W, C], got shape {images.shape}')
        if labels.ndim != 1:
            raise ValueError(f'labels must be [N], got shape {labels.shape}')
        if len(images) != len(labels):
            raise DataError(f'{len(images)} images but {len(labels)} labels; '
                            'they must come in equal numbers')
        if images.dtype == np.uint8:
            images = images.astype(np.float32) / np.float32(255)
        elif np.issubdtype(images.dtype, np.floating):
            images = images.astype(np.float32, copy=False)
        else:
            raise ValueError(f'images must be uint8 or floating, got {images.dtype}')
        if images.ndim == 3:
            images = images[..., np.newaxis]
        if labels.size and not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f'labels must be integers, got {labels.dtype}')
        labels = labels.astype(np.int64)
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise DataError(f'labels range over [{labels.min()}, {labels.max()}] but must lie in '
                            f'[0, {num_classes}); check num_classes or the label file')
        self.num_classes = num_classes
        # Not `source`: towers.inputs tells records on disk by that attribute.
        self.origin = origin
        self._images = images
        self._labels = np.eye(num_classes, dtype=np.float32)[labels] if one_hot else labels
        self._num_examples = len(images)
        self._epochs_completed = 0
        self._index_in_epoch = 0
        self._rng = np.random.RandomState(seed)

    @property
    def images(self):
        """float32 [N, H, W, C] in [0, 1], in the current shuffled order."""
        return self._images

    @property
    def labels(self):
        """int64 [N], or float32 [N, num_classes] when one_hot."""
        return self._labels

    @property
    def num_examples(self):
        return self._num_examples

    @property
    def epochs_completed(self):
        return self._epochs_completed

    def next_batch(self, batch_size, shuffle=True):
        """Returns the next `batch_size` examples.

        The data are shuffled on the first call. A batch that crosses the end
        of an epoch is the rest of this epoch followed by the start of the
        next, reshuffled one, so every example is seen once per epoch.

        Args:
            batch_size: int in [1, num_examples].
            shuffle: shuffle on the first call and at each epoch boundary.

        Returns:
            (images float32 [batch_size, H, W, C], labels int64 [batch_size] or
            float32 [batch_size, num_classes]).

        Raises:
            ValueError: batch_size < 1 or larger than the dataset.
        """
        if batch_size < 1:
            raise ValueError(f'batch_size must be at least 1, got {batch_size}')
        if batch_size > self._num_examples:
            # The classic code would silently return a short batch here.
            raise ValueError(f'batch_size {batch_size} exceeds the {self._num_examples} '
                             'examples in this DataSet')
        start = self._index_in_epoch
        if self._epochs_completed == 0 and start == 0 and shuffle:
            self._shuffle()
        if start + batch_size > self._num_examples:
            self._epochs_completed += 1
            images_rest = self._images[start:]
            labels_rest = self._labels[start:]
            if shuffle:
                self._shuffle()
            self._index_in_epoch = batch_size - len(images_rest)
            end = self._index_in_epoch
            return (np.concatenate((images_rest, self._images[:end]), axis=0),
                    np.concatenate((labels_rest, self._labels[:end]), axis=0))
        self._index_in_epoch += batch_size
        end = self._index_in_epoch
        return self._images[start:end], self._labels[start:end]

    def _shuffle(self):
        perm = self._rng.permutation(self._num_examples)
        self._images = self._images[perm]
        self._labels = self._labels[perm]


# What read_data_sets checks its files against when no DatasetInfo is given.
MNIST = Expected('mnist', mnist.INPUT_SHAPE, mnist.NUM_CLASSES)


def read_data_sets(train_dir, one_hot=False, validation_size=5000, seed=None, download=True,
                   mirrors=None, files=None, info=None):
    """Reads the four MNIST IDX files in `train_dir` into Datasets.

    Each file may be gzipped (`train-images-idx3-ubyte.gz`) or not
    (`train-images-idx3-ubyte`); see data.mnist.ensure_mnist. What the files
    hold is checked against `info` as they are read (see data.checks).

    Args:
        train_dir: str or os.PathLike, folder with the MNIST files.
        one_hot: labels as float32 one-hot [N, 10] instead of int64 [N].
        validation_size: how many of the first training examples become the
            validation set; 0 gives an empty validation DataSet.
        seed: seed for each DataSet's shuffling.
        download: fetch missing files (see data.mnist.ensure_mnist).
        mirrors: base URLs to fetch from; defaults to data.mnist.MIRRORS.
        files: file table for ensure_mnist; defaults to data.mnist.FILES.
        info: what the files must hold, a data.DatasetInfo (or data.checks.Expected);
            defaults to MNIST's, 28x28x1 uint8 images of labels 0-9.

    Returns:
        Datasets(train, validation, test) of DataSet, images [N, 28, 28, 1].

    Raises:
        DatasetNotFoundError: files missing and not downloadable.
        IdxFormatError: a file is malformed (not IDX, truncated, wrong rank).
        DataMismatchError: a file holds images of another shape or dtype than
            `info`, or labels of another count, type or range.
        ValueError: validation_size is outside [0, number of training examples].
    """
    paths = mnist.ensure_mnist(train_dir, mirrors=mnist.MIRRORS if mirrors is None else mirrors,
                               download=download, files=files)
    train = Part(read_images(paths.train_images), read_labels(paths.train_labels),
                 paths.train_images, paths.train_labels)
    test = Part(read_images(paths.test_images), read_labels(paths.test_labels),
                paths.test_images, paths.test_labels)
    return checked_datasets([train], [test], MNIST if info is None else info, validation_size,
                            one_hot=one_hot, seed=seed)


def checked_datasets(train, test, info, validation_size, one_hot=False, seed=None):
    """Datasets from what a dataset's files held, once each file passes data.checks.check_parts.

    Every file loader ends here, so each check is written once, for all of them.

    Args:
        train, test: lists of data.checks.Part, in file order (CIFAR-10's
            train split is five files).
        info: what the files must hold: name, input_shape, num_classes.
        validation_size: the first validation_size training examples are held out.
        one_hot, seed: as DataSet.

    Returns:
        Datasets(train, validation, test) of DataSet, images float32
        [N, *info.input_shape] in [0, 1], each DataSet's `origin` naming its files.

    Raises:
        DataMismatchError: see data.checks.check_parts.
        ValueError: validation_size is outside [0, number of training examples].
    """
    check_parts(list(train) + list(test), info)
    train_images, train_labels = _concatenate(train)
    if not 0 <= validation_size <= len(train_images):
        raise ValueError(f'validation_size must be in [0, {len(train_images)}], '
                         f'got {validation_size}')

    def make(images, labels, parts):
        return DataSet(images, labels, one_hot=one_hot, num_classes=info.num_classes, seed=seed,
                       origin=_origin(parts))
    return Datasets(train=make(train_images[validation_size:], train_labels[validation_size:],
                               train),
                    validation=make(train_images[:validation_size],
                                    train_labels[:validation_size], train),
                    test=make(*_concatenate(test), test))


def _concatenate(parts):
    if len(parts) == 1:
        return parts[0].images, parts[0].labels
    return (np.concatenate([part.images for part in parts]),
            np.concatenate([part.labels for part in parts]))


def _origin(parts):
    """'/d/train-images-idx3-ubyte.gz', or '/d/data_batch_1.bin to data_batch_5.bin'."""
    first, last = parts[0].images_file, parts[-1].images_file
    return first if len(parts) == 1 else f'{first} to {os.path.basename(last)}'
