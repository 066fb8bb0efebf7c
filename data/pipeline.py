"""The in-graph tf.data pipeline, stage by stage.

    source -> clean -> shuffle -> batch -> repeat -> (augment) -> normalise -> prefetch

A source is a tf.data.Dataset of *chunks* (pixels [n, P], shape_ok [n] bool,
labels [n] int64): pixels flattened, in any real dtype; shape_ok saying which
records have the expected shape (only the source knows what shape a record
claimed). Working on chunks lets cleaning and normalisation run as a few
vectorised ops per chunk or batch: a Python-defined function per example costs
tens of microseconds in tf.data, more than the rest of the pipeline together.
Augmentation (data/augment.py) runs on each batch too, its numbers drawn from (seed, the
batch's step in the run), on the pixels in the source's dtype (bytes stay bytes).

This module imports TensorFlow; `import data` does not import it.
"""
import math

import numpy as np
import tensorflow as tf

from towers.data.augment import CENTER, augment_batch

tf1 = tf.compat.v1

CHUNK = 1024  # records per source chunk


def as_written(fn):
    """fn, for a tf.data map, interleave or flat_map to trace as it is written.

    Otherwise tf.data converts each function with AutoGraph before tracing it
    (reads its source, rewrites Python control flow on tensors into graph ops):
    about a CPU-second of each process's first pipeline, a third of a short
    records run's start. The dataset functions of towers branch on tensors
    with tf.cond, and test only Python values with `if`: there is nothing to
    convert.
    """
    return tf.autograph.experimental.do_not_convert(fn)


def array_source(images, labels, input_shape):
    """A source over in-memory arrays, fed at iterator initialisation.

    The arrays go in through placeholders rather than constants, so a large
    dataset is not copied into the GraphDef (which is limited to 2 GB).

    Args:
      images: numpy [N, H, W, C] (any real dtype); only dtype and shape are used.
      labels: numpy [N] integers; likewise.
      input_shape: (H, W, C) the model takes.
    Returns:
      (dataset, feed): the source, and the feed_dict its iterator's
      initializer needs.
    Raises:
      ValueError: the arrays' example shape is not input_shape.
    """
    if tuple(images.shape[1:]) != tuple(input_shape):
        raise ValueError('images are %s per example but the model takes %s'
                         % (tuple(images.shape[1:]), tuple(input_shape)))
    images_in = tf1.placeholder(tf.as_dtype(images.dtype), [None] + list(input_shape),
                                name='source_images')
    labels_in = tf1.placeholder(tf.int64, [None], name='source_labels')
    num_pixels = math.prod(input_shape)
    dataset = tf.data.Dataset.from_tensor_slices((images_in, labels_in)).batch(CHUNK).map(
        as_written(lambda x, y: (tf.reshape(x, [-1, num_pixels]), tf.ones_like(y, tf.bool),
                                 y)))
    return dataset, {images_in: images, labels_in: np.asarray(labels, np.int64)}


def clean(chunks, num_classes, counts):
    """Drop records with a wrong shape, an out-of-range label or NaN/Inf pixels.

    Args:
      chunks: a source, see the module docstring.
      num_classes: labels must lie in [0, num_classes).
      counts: an int64 [2] variable, (records read, records dropped), added to
        as chunks are cleaned; None counts nothing (a pipeline sent to the tf.data service:
        a dataset that captures a variable does not run there).
    Returns:
      A dataset of single records (pixels [P], label), bad ones left out.
    """
    def keep(pixels, shape_ok, labels):
        finite = tf.reduce_all(tf.math.is_finite(tf.cast(pixels, tf.float32)), axis=1)
        ok = shape_ok & (labels >= 0) & (labels < num_classes) & finite
        count = [] if counts is None else [counts.assign_add(tf.stack([
            tf.size(ok, out_type=tf.int64), tf.reduce_sum(1 - tf.cast(ok, tf.int64))]))]
        with tf.control_dependencies(count):
            return tf.boolean_mask(pixels, ok), tf.boolean_mask(labels, ok)

    return chunks.map(as_written(keep)).unbatch()


def finisher(input_shape, pixel_scale=255.0, mean=None, std=None):
    """The last stage of the pipeline as a function of a batch of flat pixels.

    pixels [b, H*W*C] (any real dtype) -> images [b, H, W, C] float32, divided
    by pixel_scale, then normalised per channel by mean and std when given. One vectorised op per
    batch instead of one per example: the same numbers, far less work.

    The same numbers wherever it runs: in the pipeline, or on a tower's device
    after staging. The divisors are fed-able defaults rather than constants, so
    that grappler's constant folding, which runs on the training graph but not
    in tf.data's functions, cannot turn x / 255 into x * (1 / 255), which
    rounds otherwise (in 126 of the 256 byte values).
    """
    def finish(pixels):
        images = tf.reshape(tf.cast(pixels, tf.float32), [-1] + list(input_shape))
        images = images / _unfolded(pixel_scale)
        if mean is not None:
            images = (images - tf.constant(mean, tf.float32)) / _unfolded(std)
        return images
    return finish


def _unfolded(value):
    """A float32 constant that constant folding leaves alone (see finisher)."""
    value = np.asarray(value, np.float32)
    return tf1.placeholder_with_default(value, value.shape)


def make_pipeline(source, input_shape, num_classes, batch_size, pixel_scale=255.0,
                  mean=None, std=None, augment=CENTER, shuffle_buffer=10000, seed=None,
                  epochs=None, prefetch=2, finish=True, counted=True, shuffle_seed=None,
                  start=0):
    """Build the whole pipeline over a source.

    Args:
      source: a dataset of chunks, see the module docstring.
      input_shape: (H, W, C) of a kept example.
      num_classes: for the label check.
      batch_size: global batch; each epoch's last batch may be short, so every
        kept record is delivered exactly once per epoch.
      pixel_scale: pixels are divided by this (255 for bytes, 1 for [0, 1]).
      mean, std: optional per-channel lists applied after scaling.
      augment: the name of the augmentation of each batch (data/augment.py), drawn from
        (the seed, the batch's step), so that a resumed run augments as the uninterrupted
        one; 'center' for none.
      shuffle_buffer: examples in the shuffle buffer; 0 or 1 keeps the order.
      seed: shuffle and augmentation seed (an int; None: the shuffle unseeded, the
        augmentation on 0).
      shuffle_seed: the shuffle's and augmentation's instead, an int64 tensor (a seed drawn
        where the pipeline runs: towers/inputs/dataservice.py), or None.
      epochs: how many passes; None repeats forever.
      prefetch: batches prepared ahead of the step that takes them.
      finish: normalise each batch in the pipeline; False leaves that to the
        caller, on the towers' devices (see finisher): the batches are then
        (pixels [b, H*W*C] in the source's dtype, labels [b] int64), so bytes
        cross to a GPU as bytes.
      counted: count cleaning's records in a variable; False for none.
      start: the first batch (an int64 scalar, e.g. a resume's step): the batches before
        it are made (the shuffle's order needs them) but neither augmented nor normalised.
    Returns:
      (dataset of (images [b, H, W, C] float32, labels [b] int64), counts):
      counts is an int64 [2] local variable, (records read, records dropped)
      by cleaning (None when not counted). Reading runs ahead of training
      (prefetch, the shuffle buffer) and every pass reads again, so both count
      records read, not records trained on.
    """
    counts = _cleaning_counts(mean, std) if counted else None
    dataset = clean(source, num_classes, counts)
    if shuffle_buffer and shuffle_buffer > 1:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed if shuffle_seed is None
                                  else shuffle_seed, reshuffle_each_iteration=True)
    # Numbered by their step in the run before the skip: a resumed run's batch of step k is
    # augmented as the uninterrupted run's.
    dataset = dataset.batch(batch_size).repeat(epochs).enumerate().skip(
        tf.cast(start, tf.int64))
    key = (seed or 0) if shuffle_seed is None else shuffle_seed

    def prepare(step, batch):
        pixels, labels = batch
        if augment != CENTER:
            images = tf.reshape(pixels, [-1] + list(input_shape))
            pixels = tf.reshape(augment_batch(images, augment, key, step),
                                [-1, math.prod(input_shape)])
        return pixels, labels
    dataset = dataset.map(as_written(prepare), num_parallel_calls=tf.data.AUTOTUNE)
    if finish:
        normalise = finisher(input_shape, pixel_scale, mean, std)
        dataset = dataset.map(as_written(lambda pixels, labels: (normalise(pixels), labels)),
                              num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(prefetch), counts


def _cleaning_counts(mean, std):
    """The pipeline's (records read, records dropped) variable, once mean and std are
    checked to come together."""
    if (mean is None) != (std is None):
        raise ValueError('give both mean and std, or neither')
    return tf1.get_local_variable('records_read_dropped', shape=[2], dtype=tf.int64,
                                  initializer=tf1.zeros_initializer(), use_resource=True)


def epoch_pipeline(epoch_source, records_per_epoch, input_shape, num_classes, batch_size,
                   start=0, pixel_scale=255.0, mean=None, std=None, epochs=None, prefetch=2,
                   finish=True, parts=None):
    """make_pipeline's pipeline over a source that makes any epoch on its own, started at
    batch `start` without making the batches before it.

    The source shuffles (and augments) itself, so this only cleans, batches and normalises,
    epoch by epoch, each epoch's last batch short as make_pipeline's are. With a known
    number of records an epoch and nothing cleaned out (the source stops on a bad record),
    batch `start` is epoch start // b, batch start % b of it (b = its batch count): the
    epochs before it are never made, and its first records are passed over before they are
    decoded. A resumed run of a long training starts at once instead of decoding all it
    already trained on.

    Args:
      epoch_source: (epoch int64, records to pass over int64, keep) -> that epoch's source
        (see the module docstring), where keep is None or a function (positions in the
        epoch [n] int64) -> [n] bool: the records to decode; the others may come as zeros
        of class 0 (a task that keeps some rows of each batch decodes those alone).
      records_per_epoch: what the source holds; None when that is not what an epoch
        trains on (a source that leaves bad records out): the pipeline then makes every
        epoch from the first and skips `start` batches, as make_pipeline's user does, and
        decodes every row.
      start: the first batch (an int64 scalar tensor, e.g. a resume's step).
      parts: None, or (first, end, of): only the rows of parts first..end-1 of each batch
        cut in `of` parts (towers.slicing.split_batch's cut) are used: the others need not be
        decoded. The last row of a batch is always kept (split_batch's stand-in for an
        empty part).
      input_shape, num_classes, batch_size, pixel_scale, mean, std, epochs, prefetch,
      finish: as make_pipeline.
    Returns:
      (dataset, counts) as make_pipeline.
    """
    counts = _cleaning_counts(mean, std)
    start = tf.cast(start, tf.int64)
    first = passed = tf.constant(0, tf.int64)
    if records_per_epoch is not None:
        per_epoch = -(-records_per_epoch // batch_size)
        first, passed = start // per_epoch, (start % per_epoch) * batch_size
    normalise = finisher(input_shape, pixel_scale, mean, std)
    keep = (None if parts is None or records_per_epoch is None
            else _rows_in(parts, batch_size, records_per_epoch))

    def one(epoch):
        skip = tf.where(tf.equal(epoch, first), passed, tf.constant(0, tf.int64))
        batches = clean(epoch_source(epoch, skip, keep), num_classes, counts).batch(batch_size)
        if finish:
            batches = batches.map(as_written(lambda pixels, labels: (normalise(pixels),
                                                                     labels)),
                                  num_parallel_calls=tf.data.AUTOTUNE)
        return batches

    last = tf.constant(2 ** 62 if epochs is None else epochs, tf.int64)
    dataset = tf.data.Dataset.range(first, last).flat_map(as_written(one))
    if records_per_epoch is None:
        dataset = dataset.skip(start)
    return dataset.prefetch(prefetch), counts


def _rows_in(parts, batch_size, records_per_epoch):
    """keep(positions) of epoch_pipeline: whether each position's row of its batch is in
    parts first..end-1 of `of`, cut as towers.slicing.share_of cuts (the first parts larger),
    or the batch's last row."""
    first, end, of = parts

    def start_of(size, part):  # share_of's start, on tensors
        base, extra = size // of, size % of
        return part * base + tf.minimum(tf.cast(part, tf.int64), extra)

    def keep(positions):
        batch = positions // batch_size
        size = tf.minimum(tf.cast(batch_size, tf.int64), records_per_epoch - batch * batch_size)
        row = positions - batch * batch_size
        return ((row >= start_of(size, first)) & (row < start_of(size, end))) | tf.equal(
            row, size - 1)
    return keep


def drain(make_dataset):
    """Every element of a finite dataset, read in a Session of its own: [element as numpy].

    make_dataset() builds the dataset, inside the graph this makes for it. The iterator is
    initializable: a one-shot iterator wants a graph seed under op determinism. The
    dataset's errors (a corrupt shard, an image that does not decode) reach the caller.
    """
    with tf.Graph().as_default() as graph:
        iterator = tf1.data.make_initializable_iterator(make_dataset())
        element = iterator.get_next()
    values = []
    with tf1.Session(graph=graph) as sess:
        sess.run(iterator.initializer)
        while True:
            try:
                values.append(sess.run(element))
            except tf.errors.OutOfRangeError:
                return values
