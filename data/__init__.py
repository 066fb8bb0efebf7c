"""Datasets for towers: pure numpy + stdlib, importing this never imports TensorFlow.

Public API:
    load_dataset(name, ...) -> Datasets     the usual entry point
    DATASETS, dataset_info(name)           what each named dataset looks like
    read_data_sets(train_dir, ...)         classic TF tutorial loader for MNIST files
    DataSet, Datasets                      in-memory data with next_batch
    read_idx, write_idx                    the MNIST IDX file format
    download(urls, dest_path, sha256)      checksum-verified download with mirrors
    DataError and its subclasses           every error this package raises
"""
from data.dataset import DataSet, Datasets, read_data_sets
from data.download import download
from data.errors import (ChecksumError, DataError, DatasetNotFoundError, DownloadError,
                         IdxFormatError)
from data.idx import read_idx, write_idx
from data.registry import DATASETS, DEFAULT_DATASET, dataset_info, load_dataset

__all__ = [
    'DATASETS', 'DEFAULT_DATASET', 'dataset_info', 'load_dataset',
    'DataSet', 'Datasets', 'read_data_sets',
    'read_idx', 'write_idx', 'download',
    'DataError', 'IdxFormatError', 'ChecksumError', 'DownloadError', 'DatasetNotFoundError',
]
