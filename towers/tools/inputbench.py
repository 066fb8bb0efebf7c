"""`towers bench --input-only`: the input pipeline alone, against a bare tf.data one.

tf_cnn_benchmarks times its input with the `trivial` model; this goes further and takes
the model out: each row pulls batches from a pipeline as fast as it gives them, on the host,
timed as bench times steps (warm-up, fixed window, mean ± stderr, rows in turns).

  towers        the pipeline `towers train --input dataset` reads an ImageNet folder
                through: each epoch on its own, decoded in chunks that name a bad record
                (data/imagenet.py), cleaned, batched and normalised
                (data/pipeline.epoch_pipeline)
  bare tf.data  the same ops as a tf.data tutorial strings them: the shards interleaved,
                the records shuffled, one parallel map of parse + crop + flip, batch,
                prefetch; no bad-record check, no cleaning
"""
import os
import time

import tensorflow as tf

from towers.data import imagenet, pipeline
from towers.tools.bench import mean_stderr

tf1 = tf.compat.v1


def bare_pipeline(files, size, batch_size, seed=0, shuffle_buffer=10000,
                  schema=imagenet.BUILD_IMAGENET):
    """(images [b, size, size, 3] float32 in [0, 1], labels [b]) the plain tf.data way."""
    def prepare(position, serialized):
        jpeg, label, boxes = imagenet.parse(serialized, schema)
        image = imagenet.train_image(jpeg, boxes, size, tf.stack([tf.constant(seed, tf.int64),
                                                                  position]))
        return tf.cast(image, tf.float32) / 255.0, label
    records = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=min(8, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE)
    return records.shuffle(shuffle_buffer, seed=seed).repeat().enumerate().map(
        pipeline.as_written(prepare), num_parallel_calls=tf.data.AUTOTUNE).batch(
            batch_size).prefetch(tf.data.AUTOTUNE)


def towers_pipeline(image_set, batch_size):
    """The batches `towers train --input dataset` reads on CPU towers, from an ImageNetSet."""
    epoch_source, records = image_set.epoch_source(image_set.input_shape)
    dataset, _ = pipeline.epoch_pipeline(epoch_source, records, image_set.input_shape,
                                         image_set.num_classes, batch_size)
    return dataset


class Reader:
    """A pipeline's batches pulled in a Session of its own, a block at a time.

    Each block starts the pipeline afresh and ends it after the block's batches: a pipeline
    left running would fill its buffers while another row is timed, taking that row's
    cores and then handing out its own batches in no time.
    """

    def __init__(self, make_dataset):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.limit = tf1.placeholder(tf.int64, [], 'batches')
            iterator = tf1.data.make_initializable_iterator(make_dataset().take(self.limit))
            images, labels = iterator.get_next()
            with tf.control_dependencies([images]):
                self.count = tf.size(labels)  # images in the batch
            self.init = [iterator.initializer, tf1.local_variables_initializer()]  # cleaning's
        self.sess = tf1.Session(graph=self.graph)
        self.rates = []

    def block(self, warmup, batches, clock):
        """Start afresh, pull `warmup` batches, then time `batches`: images/sec."""
        self.sess.run(self.init, {self.limit: warmup + batches})
        for _ in range(warmup):
            self.sess.run(self.count)
        start, images = clock(), 0
        for _ in range(batches):
            images += self.sess.run(self.count)
        self.rates.append(images / (clock() - start))

    def close(self):
        self.sess.close()


def time_in_turns(readers, warmup, window, rounds, clock):
    """Time Readers taking turns: `window` timed batches each, split into `rounds` blocks
    (at least 2, each of at least 2 batches), every block after `warmup` untimed ones;
    [(mean, stderr) images/sec over a reader's blocks] in order. The caller closes them."""
    rounds = max(2, min(rounds, window // 2))
    for _ in range(rounds):
        for reader in readers:
            reader.block(warmup, window // rounds, clock)
    return [mean_stderr(reader.rates) for reader in readers]


def cores():
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_input_bench(image_set, batch_size, warmup_steps=10, timed_steps=50, rounds=5,
                    log=print, clock=time.perf_counter):
    """Time towers' ImageNet training input against the bare pipeline; print one table.

    The timed batches are split into `rounds` blocks, the rows taking turns block by block
    (each block after warmup_steps untimed batches); a row's images/sec is the mean over its
    blocks, with its standard error.
    Returns:
      list of dicts: input, mean, stderr (images/sec), per_core, vs_bare.
    """
    size = image_set.input_shape[0]
    rows = [{'input': 'towers', 'reader': Reader(lambda: towers_pipeline(image_set,
                                                                         batch_size))},
            {'input': 'bare tf.data', 'reader': Reader(lambda: bare_pipeline(
                image_set.files, size, batch_size, image_set.seed,
                schema=image_set.schema))}]
    try:
        rates = time_in_turns([row['reader'] for row in rows], warmup_steps, timed_steps,
                              rounds, clock)
    finally:
        for row in rows:
            row.pop('reader').close()
    n = cores()
    for row, (mean, stderr) in zip(rows, rates):
        row.update(mean=mean, stderr=stderr, per_core=mean / n)
    for row in rows:
        row['vs_bare'] = row['mean'] / rows[1]['mean']
    log('%-14s %-20s %-16s %s' % ('input', 'images/sec', 'per core (%d)' % n, 'vs bare'))
    for row in rows:
        log('%-14s %-20s %-16.1f %.3f' % (row['input'], '%.1f ± %.1f' % (row['mean'],
                                                                        row['stderr']),
                                          row['per_core'], row['vs_bare']))
    return rows
