"""Datasets for towers: pure numpy + stdlib, importing this never imports TensorFlow.

Public API:
    load_dataset(name, ...) -> Datasets     the usual entry point
    DATASETS, dataset_info(name)           what each named dataset looks like
    class_names(name, data_dir=None)       label i's name, label 0 first
    find_dataset(name, data_dir=None)      where a named dataset is, or would go; the
                                           search order is data_dir, $TOWERS_DATA_DIR/<name>,
                                           ~/.cache/towers/<name>, /usr/share/datasets/<name>
    read_data_sets(train_dir, ...)         classic TF tutorial loader for MNIST files
    DataSet, Datasets                      in-memory data with next_batch
    synthetic_datasets(shape, classes, n)  imagenet-synthetic: random images of any shape
    check_images(data, input_shape, ...)   does a loaded split fit a model's (H, W, C)?
                                           (loaders already hold every file to its
                                           dataset's declared shape, see data.checks)
    read_idx, write_idx                    the MNIST IDX file format
    read_cifar10_batch(path)               one CIFAR-10 binary batch file
    download(urls, dest_path, sha256)      checksum-verified download with mirrors
    extract_folder(archive, folder, dest)  safe, all-or-nothing tar extraction
    DataError and its subclasses           every error this package raises
"""
from towers.data.archive import ArchiveError, extract_folder
from towers.data.checks import check_images
from towers.data.cifar10 import CifarFormatError
from towers.data.cifar10 import read_batch as read_cifar10_batch
from towers.data.dataset import DataSet, Datasets, read_data_sets
from towers.data.download import download
from towers.data.errors import (
                         ChecksumError,
                         DataError,
                         DataMismatchError,
                         DatasetNotFoundError,
                         DownloadError,
                         IdxFormatError,
)
from towers.data.idx import read_idx, write_idx
from towers.data.registry import (
                         DATASETS,
                         DEFAULT_DATASET,
                         class_names,
                         dataset_info,
                         find_dataset,
                         load_dataset,
)
from towers.data.synthetic import synthetic_datasets

__all__ = [
    'DATASETS', 'DEFAULT_DATASET', 'dataset_info', 'load_dataset', 'class_names',
    'find_dataset',
    'DataSet', 'Datasets', 'read_data_sets', 'check_images', 'synthetic_datasets',
    'read_idx', 'write_idx', 'read_cifar10_batch', 'download', 'extract_folder',
    'DataError', 'IdxFormatError', 'CifarFormatError', 'ChecksumError', 'DownloadError',
    'DatasetNotFoundError', 'ArchiveError', 'DataMismatchError',
]
