"""Image records read as a data.pipeline source: ImageNet-format shards (data/imagenet.py)
and TFDS folders (data/tfds.py) alike, described by an imagenet.Schema.

The records are read interleaved, shuffled as serialised bytes, and decoded a chunk at a
time in parallel (decoded), each bad record named or skipped (checked); ImageRecordSet is
one split of them, ImageNetSet one split of an ImageNet folder (a whole split read for
evaluation: data/image_splits.py).

Seeded per epoch and per example, so a resumed run crops as the uninterrupted one: each
epoch's records are shuffled in a buffer of the serialised records seeded by (seed, epoch),
then numbered by their position in the run (epoch x records + position in the epoch); the
augmentation (data/augment.py: inception's box, pad-crop-flip's offsets, the flip) is drawn
by stateless random ops from (seed, that number). The same
seed therefore gives the same crops and flips in the same order, whatever the number of
parallel decoders, and any epoch can be made without those before it: a resume starts at
its epoch and passes over the records it already trained on before they are decoded
(data.pipeline.epoch_pipeline).

This module imports TensorFlow; `import data` does not import it.
"""
import os
import sys

import tensorflow as tf

from towers.data.augment import augment_image, default_for, jpeg_view
from towers.data.errors import BAD_RECORD, DataError
from towers.data.imagenet import (
    BUILD_IMAGENET,
    TruncatedShard,
    class_count,
    count_records,
    eval_image,
    parse,
    shard_files,
)
from towers.data.pipeline import as_written

tf1 = tf.compat.v1


CHUNK = 32  # records decoded together, and handed to the pipeline (224x224: 150 kB each)


def records(files, cycle_length=8):
    """(file index, record index in the file, serialised record) of the shards, read
    interleaved, deterministically."""
    def read(index, path):
        return tf.data.TFRecordDataset(path).enumerate().map(
            as_written(lambda record, serialized: (index, record, serialized)))
    return tf.data.Dataset.from_tensor_slices(
        (tf.range(len(files), dtype=tf.int32), files)).interleave(
            as_written(read), cycle_length=min(cycle_length, len(files)), block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def decoded(files, size, training, seed=0, num_classes=1000, shuffle_buffer=10000,
            cycle_length=8, chunk=CHUNK, schema=BUILD_IMAGENET, epoch=None, skip=0,
            epoch_records=None, keep=None, augment=None):
    """The shards' records decoded, a chunk at a time, whether or not some are bad.

    A bad record (not a tf.train.Example, an image that does not decode (or, of a schema
    with a shape, is not of that shape), no image, a label outside the classes) does not
    stop the pipeline here: its row is marked (as is, rarely, a record whose decoding failed
    for another reason, such as memory: the ignored errors are not told apart), and
    the message naming it is given, for checked() to stop on or skip. Each chunk decodes in
    a dataset of its own whose errors are ignored, so a reader's errors (a corrupt shard)
    still reach the caller, and the chunks decode in parallel.

    Training images are augmented by name (augment, one of data/augment.py's; None: the
    default for their shape), evaluation's take the centre view. With `epoch` (an int64
    scalar, maybe a tensor), this is that epoch alone: its shuffle is
    seeded by (seed, epoch) and its augmentation by (seed, epoch * epoch_records + position)
    (the files' record count), so any epoch
    can be made without the ones before it, and its first `skip` records are passed over
    before they are decoded (a resumed run's). Without, the records are reshuffled each
    time the dataset is iterated again. keep: None, or a function (positions [n] int64) ->
    [n] bool of the records to decode; the others come as zeros of class 0, ok (a task that
    trains on some rows of each batch decodes those alone).

    Returns:
      a dataset of (images [k, size, size, 3] uint8, or [k, H, W, C] of the schema's shape
      (zeros for a bad row), ok [k] bool,
      labels [k] int64 (0..num_classes-1), problems [k] string: 'FILE record N: what is
      wrong' for a bad row); k is `chunk`, less at the end.
    """
    names = tf.constant(files)
    stream = records(files, cycle_length)
    numbered_from = tf.constant(0, tf.int64)  # the epoch's first number in the crops' seeds
    if epoch is not None:
        epoch = tf.cast(epoch, tf.int64)
        numbered_from = epoch * epoch_records
    if training and shuffle_buffer > 1:
        stream = stream.shuffle(
            shuffle_buffer, seed=seed if epoch is None else _epoch_seed(seed, epoch),
            reshuffle_each_iteration=epoch is None)
    shape = schema.shape or (size, size, 3)
    pixels = shape[0] * shape[1] * shape[2]
    augment = augment or default_for(shape)
    low, high = schema.first_label, schema.first_label + num_classes - 1
    undecodable = 'not a tf.train.Example whose %s is a decodable %s' % (
        schema.image, 'x'.join(map(str, shape)) + ' image' if schema.shape else 'JPEG')

    def one(row, position, serialized):
        if keep is None:
            return decode_one(row, position, serialized)
        return tf.cond(keep(position[None])[0],
                       lambda: decode_one(row, position, serialized),
                       lambda: (row, tf.zeros([pixels], tf.uint8), tf.constant(0, tf.int64)))

    def decode_one(row, position, serialized):
        encoded, label, boxes = parse(serialized, schema)
        example_seed = tf.stack([tf.cast(seed, tf.int64), numbered_from + position])
        if schema.shape:
            # (An image of another shape fails here, a bad record, before it is augmented.)
            image = tf.ensure_shape(tf.io.decode_image(encoded, channels=shape[2],
                                                       expand_animations=False), shape)
            if training:
                image = augment_image(image, augment, example_seed)
        elif training:
            image = jpeg_view(encoded, boxes, size, augment, example_seed)
        else:
            image = eval_image(encoded, size)
        return row, tf.reshape(image, [pixels]), label

    def decode(positions, where):
        file_index, record, serialized = where
        k = tf.shape(positions)[0]
        rows = tf.range(k)
        good = tf.data.Dataset.from_tensor_slices((rows, positions, serialized)).map(
            as_written(one)).ignore_errors().batch(chunk)
        nothing = (rows[:0], tf.zeros([0, pixels], tf.uint8), tf.zeros([0], tf.int64))
        good = good.concatenate(tf.data.Dataset.from_tensors(nothing)).take(1)

        def place(done, images, labels):
            at = done[:, None]
            every = tf.equal(tf.size(done), k)  # the usual chunk: nothing to move
            images = tf.cond(every, lambda: images,
                             lambda: tf.scatter_nd(at, images, [k, pixels]))
            decoded = tf.scatter_nd(at, tf.ones_like(done, tf.bool), [k])
            labels = tf.scatter_nd(at, labels, [k])
            in_range = (labels >= 0) & (labels < num_classes)
            problems = tf.strings.join([
                tf.gather(names, file_index), ' record ', tf.strings.as_string(record), ': ',
                tf.where(decoded, tf.strings.join([
                    'label ', tf.strings.as_string(labels + low), ' is not in %d..%d'
                    % (low, high)]), undecodable)])
            ok = decoded & in_range
            return (tf.reshape(images, [k] + list(shape)), ok, tf.where(ok, labels, 0),
                    tf.where(ok, '', problems))
        return good.map(as_written(place))

    return stream.enumerate().skip(skip).batch(chunk).interleave(
        as_written(decode), cycle_length=max(cycle_length, os.cpu_count() or 1), block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _epoch_seed(seed, epoch):
    """The shuffle seed of an epoch: an int64 tensor, one per (seed, epoch)."""
    return tf.random.experimental.stateless_split(
        tf.stack([tf.cast(seed, tf.int64), epoch]), 1)[0, 0]


def checked(chunks, skip_bad=False):
    """(images, ok, labels) of decoded()'s chunks, after its bad records: the first stops
    the pipeline with an error naming it (data.errors.bad_record reads it back), or, with
    skip_bad, each is named on stderr and left marked not ok (for the pipeline's cleaning to
    drop and count)."""
    def check(images, ok, labels, problems):
        bad = tf.boolean_mask(problems, tf.logical_not(ok))
        if skip_bad:
            report = tf.cond(tf.size(bad) > 0, lambda: _print_skipped(bad), tf.no_op)
        else:
            first = tf.concat([bad, ['']], 0)[0]
            report = tf.debugging.Assert(tf.equal(tf.size(bad), 0),
                                         [tf.strings.join([BAD_RECORD, first])])
        with tf.control_dependencies([report]):
            return tf.identity(images), ok, labels
    return chunks.map(as_written(check))


def _print_skipped(bad):
    lines = tf.strings.reduce_join(tf.strings.join(['skipped ', bad]), separator='\n')
    with tf.control_dependencies([tf.print(lines, output_stream=sys.stderr)]):
        return tf.no_op()


def examples(files, size, training, seed=0, shuffle_buffer=10000, cycle_length=8,
             num_classes=1000, skip_bad=False, augment=None):
    """A tf.data.Dataset of (image [size, size, 3] uint8, label) from the shards.

    The shards are read interleaved (deterministically), the serialised records shuffled in
    a seeded buffer when training, numbered by their position in the epoch, and decoded in
    parallel (training's augmented by name: see decoded); the order out is the order in,
    whatever the parallelism. A bad record stops it (see checked), or with skip_bad is left
    out.
    """
    return kept(checked(decoded(files, size, training, seed, num_classes, shuffle_buffer,
                                 cycle_length, augment=augment), skip_bad))


def kept(chunks):
    """(image, label) of the records checked() kept, one at a time."""
    return chunks.map(as_written(lambda images, ok, labels: (
        tf.boolean_mask(images, ok), tf.boolean_mask(labels, ok)))).unbatch()



class ImageRecordSet:
    """One split of image records (a list of shards), read as a data.pipeline source.

    The training split is shuffled and augmented here (see the module docstring), so the
    pipeline after it only batches and normalises; the evaluation split gets the centre
    view, in file order.

    Args:
      files: the split's shards, in order.
      split: its name; 'train' is shuffled and augmented by name (data/augment.py).
      size: the model's side: JPEGs of any size come out size x size x 3 (a schema with a
        shape: that shape).
      num_classes: the labels are first_label .. first_label + num_classes - 1.
      schema: where the records keep image and label (Schema).
      seed: the shuffle and crop seed (the run's --seed).
      num_workers, worker_index: read only shards worker_index, worker_index +
        num_workers, ... so that workers see disjoint parts.
      shuffle_buffer: serialised records in the shuffle buffer.
      skip_bad_shards: leave out (and list in `skipped`) a shard cut short, instead of
        raising DataError.
      skip_bad_images: leave out a bad record (see decoded), naming it on stderr; the
        pipeline's cleaning counts it. Without it, the first stops the run naming it.
    Attributes:
      input_shape, num_classes, num_examples (of this worker's shards), files, skipped
      ([(shard, records before its cut, problem)]), shuffled (True: the pipeline adds none).
    """

    shuffled = True

    def __init__(self, files, split, size, num_classes, schema=BUILD_IMAGENET, seed=0,
                 num_workers=1, worker_index=0, shuffle_buffer=10000, skip_bad_shards=False,
                 skip_bad_images=False):
        if not 0 <= worker_index < num_workers:
            raise DataError('worker index %d is not in [0, %d)' % (worker_index, num_workers))
        if len(files) < num_workers:
            raise DataError('%s has %d %s shard(s), fewer than the %d workers sharing them'
                            % (os.path.dirname(files[0]), len(files), split, num_workers))
        self.split, self.seed, self.skip_bad_images = split, seed, skip_bad_images
        self.num_classes, self.schema = num_classes, schema
        self.input_shape = tuple(schema.shape or (size, size, 3))
        self.shuffle_buffer, self.files, self.skipped, self.num_examples = shuffle_buffer, [], [], 0
        for path in files[worker_index::num_workers]:
            try:
                self.num_examples += count_records(path)
                self.files.append(path)
            except TruncatedShard as e:
                if not skip_bad_shards:
                    raise DataError('%s; give --skip-bad-shards to train without it' % e) from None
                self.skipped.append((os.path.basename(path), e.records, str(e)))
        if not self.files:
            raise DataError('every %s shard in %s was skipped: nothing to read'
                            % (split, os.path.dirname(files[0])))

    def examples(self, training=None, cycle_length=8, epoch=None, skip=0, keep=None,
                 seed=None, augment=None):
        """decoded()'s chunks of this split (of one epoch, skip records in, decoding those
        keep keeps; shuffled and augmented on seed, an int64 tensor, instead of the set's;
        augmented by name, None: the default for the images), after checked()."""
        training = self.split == 'train' if training is None else training
        seed = self.seed if seed is None else seed
        return checked(decoded(self.files, self.input_shape[0], training, seed,
                               self.num_classes, self.shuffle_buffer, cycle_length,
                               schema=self.schema, epoch=epoch, skip=skip,
                               epoch_records=self.num_examples, keep=keep, augment=augment),
                       self.skip_bad_images)

    def source(self, input_shape, cycle_length=8, seed=None, augment=None):
        """(dataset of chunks (pixels [n, P] uint8, ok [n], labels [n]), {}), reshuffled each
        time it is iterated; seed, augment: as examples'."""
        self._check(input_shape)
        return self._flat(self.examples(cycle_length=cycle_length, seed=seed,
                                        augment=augment)), {}

    def epoch_source(self, input_shape, augment=None):
        """(a function (epoch, records to pass over, keep) -> that epoch's source, records
        an epoch), for data.pipeline.epoch_pipeline to start a resumed run where it stopped
        without decoding what it already trained on. The records an epoch are None when bad
        images are skipped: an epoch's batch count is then known only once it is read.
        augment: as examples'."""
        self._check(input_shape)

        def epoch_source(epoch, skip, keep=None):
            return self._flat(self.examples(epoch=epoch, skip=skip, keep=keep,
                                            augment=augment))
        return epoch_source, None if self.skip_bad_images else self.num_examples

    def _check(self, input_shape):
        if tuple(input_shape) != self.input_shape:
            raise DataError('the model takes %s images but this split was opened for %s'
                            % (input_shape, self.input_shape))

    def _flat(self, chunks):
        pixels = self.input_shape[0] * self.input_shape[1] * self.input_shape[2]
        return chunks.map(as_written(lambda images, ok, labels: (
            tf.reshape(images, [-1, pixels]), ok, labels)))


class ImageNetSet(ImageRecordSet):
    """One split of an ImageNet-format folder (build_imagenet_data.py's shards).

    Args:
      folder: the shards' folder.
      split: 'train' or 'validation'.
      size, seed, ...: as ImageRecordSet.
    Attributes:
      as ImageRecordSet; num_classes: 1000, or the lines of labels.txt beside the shards
      (which `towers data convert --from-folder` writes).
    """

    def __init__(self, folder, split, size, **options):
        super().__init__(shard_files(folder, split), split, size, class_count(folder),
                         **options)
