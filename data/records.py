"""Sharded TFRecord files, for data bigger than memory.

`write_records` turns in-memory splits into N shards per split plus a
manifest; `RecordSet` reads one split back as a data.pipeline source that
interleaves the shards and can take one worker's share of them. A shard whose
size or SHA-256 disagrees with the manifest is an error naming it (or, when
asked, is skipped and counted): never a silently short epoch.

Layout of a records folder:
    manifest.json                        written last: its presence means complete
    train-00000-of-00004.tfrecord ...    tf.train.Example per image
    test-00000-of-00001.tfrecord

Each Example holds 'image/raw' (the uint8 pixels, row-major HWC bytes),
'image/shape' ([H, W, C] int64) and 'label' (int64).

This module imports TensorFlow; `import data` does not import it.
"""
import json
import math
import os
import struct

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from towers.data.atomic import atomic_output, written_beside
from towers.data.checks import format_shape
from towers.data.download import sha256_of_file
from towers.data.errors import DataError, DataMismatchError
from towers.data.pipeline import CHUNK, as_written, drain

MANIFEST = 'manifest.json'
FORMAT = 'towers-records-1'


def _example(image, label):
    feature = {
        'image/raw': tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        'image/shape': tf.train.Feature(int64_list=tf.train.Int64List(value=list(image.shape))),
        'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_shard(path, images, labels):
    """Write one shard beside its final name, then rename: never a half shard."""
    with written_beside(path) as partial, tf.io.TFRecordWriter(partial) as writer:
        for image, label in zip(images, labels):
            writer.write(_example(image, label))


def write_records(splits, out_dir, num_shards, name, num_classes):
    """Write splits as TFRecord shards and a manifest.

    Args:
      splits: {split name: (images uint8 [N, H, W, C], labels [N] int)}.
      out_dir: the records folder (created; must not already hold a manifest).
      num_shards: shards per split (a split smaller than that gets one per record).
      name: the dataset's name, recorded in the manifest.
      num_classes: recorded in the manifest.
    Returns:
      The manifest dict.
    Raises:
      DataError: bad num_shards, a manifest already there, images not uint8 [N, H, W, C].
      DataMismatchError: the splits' images differ in shape (nothing is written).
    """
    if num_shards < 1:
        raise DataError('--shards must be at least 1, got %d' % num_shards)
    if os.path.exists(os.path.join(out_dir, MANIFEST)):
        raise DataError('%s already holds records (%s); choose an empty --out folder'
                        % (out_dir, MANIFEST))
    splits = {split: (np.asarray(images), labels) for split, (images, labels) in splits.items()}
    for split, (images, _) in splits.items():
        if images.dtype != np.uint8 or images.ndim != 4:
            raise DataError('records hold uint8 [N, H, W, C] images; %s split is %s %s'
                            % (split, images.dtype, images.shape))
    # Before any shard is written: a folder that would fail to load is not worth making.
    check_splits_agree({split: images.shape[1:] for split, (images, _) in splits.items()},
                       'the %s data to convert' % name, 'give every split images of one shape')
    os.makedirs(out_dir, exist_ok=True)
    manifest = {'format': FORMAT, 'dataset': name, 'num_classes': num_classes, 'splits': {}}
    for split, (images, labels) in splits.items():
        count = min(num_shards, max(len(images), 1))
        shards = []
        for index, part in enumerate(np.array_split(np.arange(len(images)), count)):
            file_name = '%s-%05d-of-%05d.tfrecord' % (split, index, count)
            path = os.path.join(out_dir, file_name)
            _write_shard(path, images[part], np.asarray(labels)[part])
            shards.append({'file': file_name, 'records': int(len(part)),
                           'bytes': os.path.getsize(path), 'sha256': sha256_of_file(path)})
        manifest['splits'][split] = {'input_shape': list(images.shape[1:]),
                                     'records': int(len(images)), 'shards': shards}
    with atomic_output(os.path.join(out_dir, MANIFEST)) as out:
        out.write(json.dumps(manifest, indent=1).encode())
    return manifest


def read_manifest(records_dir):
    """The manifest of a records folder.

    Raises:
      DataError: it is missing, unreadable or of another format.
      DataMismatchError: its splits declare different image shapes.
    """
    path = os.path.join(records_dir, MANIFEST)
    try:
        with open(path, encoding='utf-8') as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise DataError('%s has no %s: not a records folder (make one with `towers data '
                        'convert --out %s`)' % (records_dir, MANIFEST, records_dir)) from None
    except (OSError, ValueError) as e:
        raise DataError('cannot read %s: %s' % (path, e)) from None
    if manifest.get('format') != FORMAT:
        raise DataError('%s is format %r, expected %r' % (path, manifest.get('format'), FORMAT))
    check_splits_agree({split: info['input_shape'] for split, info in manifest['splits'].items()},
                       path, 'convert one dataset again with `towers data convert`')
    return manifest


def check_splits_agree(shapes, where, remedy):
    """Every split must hold one image shape: one model is built for all of them.

    Args:
      shapes: {split name: (H, W, C)}.
      where: what holds them, for the message (the manifest's path).
      remedy: what the user should do, the end of the message.
    Raises:
      DataMismatchError: e.g. 'DIR/manifest.json has 32x32x1 images for train
        but 28x28x1 for test: the splits come from different datasets; convert
        one dataset again with `towers data convert`'.
    """
    shapes = {split: tuple(shape) for split, shape in shapes.items()}
    first = next(iter(shapes), None)
    for split, shape in shapes.items():
        if shape != shapes[first]:
            raise DataMismatchError(
                '%s has %s images for %s but %s for %s: the splits come from different datasets; '
                '%s' % (where, format_shape(shapes[first]), first, format_shape(shape), split,
                        remedy))


class RecordSet:
    """One split of a records folder, read as a data.pipeline source.

    Args:
      records_dir: the folder holding the manifest and shards.
      split: 'train' or 'test'.
      num_workers, worker_index: read only shards worker_index, worker_index +
        num_workers, ... so that workers see disjoint parts.
      skip_bad_shards: skip a shard that fails its check (and count its
        records in `skipped`) instead of raising.
      verify: check each shard's SHA-256 (its size, and the shape of its first
        record against the split's input_shape, are always checked).
    """

    def __init__(self, records_dir, split, num_workers=1, worker_index=0,
                 skip_bad_shards=False, verify=True):
        manifest = read_manifest(records_dir)
        if split not in manifest['splits']:
            raise DataError('%s has no %r split (it has: %s)' % (
                records_dir, split, ', '.join(sorted(manifest['splits']))))
        if not 0 <= worker_index < num_workers:
            raise DataError('worker index %d is not in [0, %d)' % (worker_index, num_workers))
        info = manifest['splits'][split]
        self.input_shape = tuple(info['input_shape'])
        self.num_classes = manifest['num_classes']
        self.files, self.num_examples, self.skipped = [], 0, []
        for shard in info['shards'][worker_index::num_workers]:
            path = os.path.join(records_dir, shard['file'])
            problem = _check_shard(path, shard, verify, self.input_shape, split)
            if problem and not skip_bad_shards:
                raise DataError('%s; pass --skip-bad-shards to train without it' % problem)
            if problem:
                self.skipped.append((shard['file'], shard['records'], problem))
                continue
            self.files.append(path)
            self.num_examples += shard['records']
        if not self.files:
            raise DataError('no readable shard for split %r in %s' % (split, records_dir))

    def source(self, input_shape, cycle_length=4):
        """A data.pipeline source over the shards, interleaved record by record.

        Returns:
          (dataset of chunks (pixels [n, P] uint8, shape_ok [n], labels [n]), {}).
        """
        num_pixels = math.prod(input_shape)
        expected = tf.constant(input_shape, tf.int64)
        files = tf.data.Dataset.from_tensor_slices(self.files)
        records = files.interleave(tf.data.TFRecordDataset,
                                   cycle_length=min(cycle_length, len(self.files)),
                                   block_length=1)
        spec = {'image/raw': tf.io.FixedLenFeature([], tf.string),
                'image/shape': tf.io.VarLenFeature(tf.int64),
                'label': tf.io.FixedLenFeature([], tf.int64)}

        def parse(serialized):
            parsed = tf.io.parse_example(serialized, spec)
            raw = parsed['image/raw']
            shapes = tf.sparse.to_dense(parsed['image/shape'], default_value=-1)
            # Pad or cut every recorded shape to the expected rank, then compare.
            padding = tf.fill([tf.shape(shapes)[0], len(input_shape)], tf.constant(-1, tf.int64))
            fitted = tf.concat([shapes, padding], 1)[:, :len(input_shape)]
            shape_ok = (tf.reduce_all(tf.equal(fitted, expected), axis=1)
                        & tf.reduce_all(tf.equal(shapes[:, len(input_shape):], -1), axis=1)
                        & tf.equal(tf.strings.length(raw), num_pixels))
            # fixed_length pads or cuts a wrong-sized record; cleaning drops it.
            pixels = tf.io.decode_raw(raw, tf.uint8, fixed_length=num_pixels)
            return pixels, shape_ok, parsed['label']

        return records.batch(CHUNK).map(as_written(parse),
                                        num_parallel_calls=tf.data.AUTOTUNE), {}


def _check_shard(path, shard, verify, input_shape, split):
    """None if the shard matches the manifest, else a one-line problem naming it.

    Besides size and SHA-256, the first record's shape must be the split's:
    records of another shape would each be dropped in training, and a shard of
    them is an epoch silently short by that shard.
    """
    try:
        size = os.path.getsize(path)
    except OSError:
        return 'shard %s is missing' % path
    if size != shard['bytes']:
        return 'shard %s is %d bytes, the manifest says %d (truncated or replaced)' % (
            path, size, shard['bytes'])
    if verify and sha256_of_file(path) != shard['sha256']:
        return 'shard %s is corrupt: its SHA-256 differs from the manifest' % path
    if shard['records']:
        shape = _first_record_shape(path)
        if shape is None:
            return 'shard %s is corrupt: its first record does not parse' % path
        if shape != tuple(input_shape):
            return 'shard %s holds %s images, but the manifest declares %s for %s' % (
                path, format_shape(shape), format_shape(input_shape), split)
    return None


def _first_record_shape(path):
    """'image/shape' of a shard's first tf.train.Example, as a tuple; None if it does not parse.

    Read by hand (TFRecord framing: uint64 length, uint32 CRC, data, uint32 CRC)
    rather than through tf.data: one record of each shard, before any graph exists.
    """
    with open(path, 'rb') as f:
        header = f.read(12)
        if len(header) < 12:
            return None
        (length,) = struct.unpack('<Q', header[:8])
        payload = f.read(length)
    if len(payload) < length:
        return None
    try:
        example = tf.train.Example.FromString(payload)
    except DecodeError:
        return None
    return tuple(example.features.feature['image/shape'].int64_list.value)


def read_all(record_set, input_shape):
    """Every record of a RecordSet in memory: (images uint8 [N, H, W, C], labels [N]).

    For evaluation sets, which are small; bad records are dropped as in training.
    """
    def kept():
        source, _ = record_set.source(input_shape)
        return source.map(as_written(lambda p, ok, y: (tf.boolean_mask(p, ok),
                                                       tf.boolean_mask(y, ok))))
    try:
        chunks = drain(kept)
    except tf.errors.DataLossError as e:
        raise DataError('a shard of %s is corrupt: %s' % (
            os.path.dirname(record_set.files[0]), e.message)) from None
    images = np.concatenate([c[0] for c in chunks]).reshape((-1,) + tuple(input_shape))
    return images, np.concatenate([c[1] for c in chunks])
