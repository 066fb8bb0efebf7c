"""What a dataset's files must hold, checked as they are read, and whether images fit a model.

Every loader of a named dataset (IDX: mnist, fashion_mnist, mnist_sample and
the classic read_data_sets; CIFAR-10) sends what it read through
`check_parts` before building DataSets. A file of the wrong size or from
another dataset is then named when it is read, instead of surfacing as a
failed feed (`Cannot feed value of shape ...`) once the model is built.
`check_images` is the same question asked by a caller whose model was built
from elsewhere, e.g. `towers eval` from run.json's input_shape.
"""
import collections
import os

import numpy as np

from towers.data.errors import DataMismatchError

Expected = collections.namedtuple('Expected', ['name', 'input_shape', 'num_classes'])
Expected.__doc__ = """What a dataset's files must hold (a data.DatasetInfo has these fields too).

Attributes:
    name: the dataset's registry name, used in messages, e.g. 'mnist'.
    input_shape: (H, W, C) of one image.
    num_classes: labels lie in [0, num_classes).
"""

Part = collections.namedtuple('Part', ['images', 'labels', 'images_file', 'labels_file'])
Part.__doc__ = """Images and labels as read from their files, before any conversion.

Attributes:
    images: uint8 [N, H, W] (grey, C = 1) or [N, H, W, C], as the file holds them.
    labels: [N] integers, as the file holds them.
    images_file, labels_file: str paths they were read from (the same file
        for formats that interleave them, such as CIFAR-10's batches).
"""


def example_shape(images):
    """(H, W, C) of one image of images [N, H, W] (C = 1) or [N, H, W, C]; else shape[1:]."""
    shape = tuple(int(dim) for dim in images.shape[1:])
    return shape + (1,) if len(shape) == 2 else shape


def format_shape(shape):
    """'28x28x1' for (28, 28, 1)."""
    return 'x'.join(str(dim) for dim in shape)


def check_parts(parts, expected):
    """Checks images and labels read from files against what their dataset declares.

    Each part in turn: images are uint8 of shape expected.input_shape, then as
    many labels as images, integers in [0, num_classes). The first problem is
    raised.

    Args:
        parts: sequence of Part, e.g. an IDX dataset's train and test files
            (train first: the message about a wrong file cites a right one).
        expected: Expected, or a data.DatasetInfo.

    Raises:
        DataMismatchError: one line naming the file, what it holds and what
            the dataset's files hold, e.g. '/d/train-images-idx3-ubyte.gz holds
            32x32x1 images, but mnist images are 28x28x1 (as
            t10k-images-idx3-ubyte.gz holds): replace it with the real file'.
    """
    name = expected.name
    want = tuple(expected.input_shape)
    shapes = [example_shape(part.images) for part in parts]
    for index, part in enumerate(parts):
        if part.images.dtype != np.uint8:
            raise DataMismatchError(f'{part.images_file} holds {part.images.dtype} images, but '
                                    f'{name} images are uint8: replace it with the real file')
        if shapes[index] != want:
            raise DataMismatchError(_shape_problem(parts, shapes, index, name, want))
        if len(part.images) != len(part.labels):
            raise DataMismatchError(
                f'{part.images_file} holds {len(part.images)} images but '
                f'{_beside(part.labels_file, part.images_file)} holds {len(part.labels)} labels: '
                'one of them is from another dataset or corrupt, replace it with the real file')
        check_labels(part.labels, expected.num_classes, part.labels_file, name)


def check_labels(labels, num_classes, labels_file, name):
    """Checks that labels read from a file are integers in [0, num_classes).

    Args:
        labels: [N] array as the file holds it.
        num_classes: int.
        labels_file: str, the file they came from, named in the message.
        name: the dataset's name, e.g. 'cifar10'.

    Raises:
        DataMismatchError: e.g. '/d/train-labels-idx1-ubyte.gz holds label 12
            (record 3), but mnist labels are 0-9: replace it with the real file'.
    """
    labels = np.asarray(labels)
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise DataMismatchError(f'{labels_file} holds {labels.dtype} labels, but {name} labels '
                                'are integers: replace it with the real file')
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        raise DataMismatchError(f'{labels_file} holds label {labels[bad[0]]} (record {bad[0]}), '
                                f'but {name} labels are 0-{num_classes - 1}: replace it with the '
                                'real file')


def check_images(data, input_shape, origin=None, model='the model'):
    """Checks that a loaded split fits a model's input, before it is fed to it.

    Loaders already hold files to their dataset's declared shape, which is
    what `towers train` builds its model from. This is for a model built from
    elsewhere: `towers eval` builds it from run.json's input_shape and then
    loads the test split.

    Args:
        data: a DataSet, an images array uint8 or floating [N, H, W] (C = 1)
            or [N, H, W, C], or an (images, labels) pair of arrays.
        input_shape: (H, W, C) the model takes.
        origin: where the images came from, for the message; defaults to a
            DataSet's `origin` (the file its images were read from), else
            'the dataset' or 'the array'.
        model: what takes input_shape, for the message, e.g.
            'the model in logs/run.json'.

    Raises:
        DataMismatchError: e.g. '/d/t10k-images-idx3-ubyte.gz holds 32x32x1
            images, but the model in logs/run.json takes 28x28x1: use images of
            that shape, or a model built for 32x32x1'.
    """
    if isinstance(data, tuple) and len(data) == 2:
        data = data[0]
    if hasattr(data, 'images'):
        images, origin = data.images, origin or getattr(data, 'origin', None) or 'the dataset'
    else:
        images, origin = np.asarray(data), origin or 'the array'
    if images.dtype != np.uint8 and not np.issubdtype(images.dtype, np.floating):
        raise DataMismatchError(f'{origin} holds {images.dtype} images, but {model} takes uint8 '
                                'or floating-point pixels: convert them first')
    got, want = example_shape(images), tuple(input_shape)
    if images.ndim not in (3, 4) or got != want:
        raise DataMismatchError(
            f'{origin} holds {format_shape(got) or "scalar"} images, but {model} takes '
            f'{format_shape(want)}: use images of that shape, or a model built for '
            f'{format_shape(got) or "them"}')


def _shape_problem(parts, shapes, index, name, want):
    """The message for parts[index], whose images are not `want`: cite a file that agrees."""
    bad, got = parts[index], shapes[index]
    right = [part for part, shape in zip(parts, shapes) if shape == want]
    if right:
        return (f'{bad.images_file} holds {format_shape(got)} images, but {name} images are '
                f'{format_shape(want)} (as {_beside(right[0].images_file, bad.images_file)} '
                'holds): replace it with the real file')
    alike = [part.images_file for i, (part, shape) in enumerate(zip(parts, shapes))
             if shape == got and i != index]
    if alike:
        # No file agrees with the dataset: more likely another dataset's files than one bad copy.
        named = [bad.images_file] + [_beside(path, bad.images_file) for path in alike]
        return (f'{", ".join(named[:-1])} and {named[-1]} hold {format_shape(got)} images, but '
                f'{name} images are {format_shape(want)}: replace them with the real files')
    return (f'{bad.images_file} holds {format_shape(got)} images, but {name} images are '
            f'{format_shape(want)}: replace it with the real file')


def _beside(path, named_path):
    """path's base name when it is in the same folder as named_path (already named in full)."""
    if os.path.dirname(path) == os.path.dirname(named_path):
        return os.path.basename(path)
    return path
