"""A whole split of image records read for evaluation, at the evaluation view (the centre
crop): streamed batch by batch at each evaluation (StreamedSplit), or read into memory
(read_all) when it is small. Bad records are named, as in training (data/image_records.py).

This module imports TensorFlow; `import data` does not import it.
"""
import numpy as np
import tensorflow as tf

from towers.data.errors import DataError, bad_record
from towers.data.image_records import kept
from towers.data.pipeline import as_written, drain

tf1 = tf.compat.v1


class StreamedSplit:
    """An evaluation split read from disk as it is evaluated, at the evaluation view: for a
    split too big to hold (ImageNet's 50,000 validation images at 224 are 7.5 GB as float32).

    towers.evaluation.evaluate reads it through batches(). Each pass decodes the split
    again, in a Session of its own, a few batches ahead of the evaluation.

    Attributes:
      num_examples, num_classes, input_shape: the ImageRecordSet's.
    """

    def __init__(self, image_set):
        self.image_set = image_set
        self.num_examples, self.num_classes = image_set.num_examples, image_set.num_classes
        self.input_shape = image_set.input_shape

    def batches(self, batch_size):
        """(images [b, H, W, C] float32 in [0, 1], labels [b] int64), in file order; the
        last batch short. A bad record: DataError naming it."""
        with tf.Graph().as_default() as graph:
            dataset = _in_order(self.image_set).batch(batch_size).map(
                as_written(lambda images, labels: (tf.cast(images, tf.float32) / 255.0, labels)))
            iterator = tf1.data.make_initializable_iterator(dataset.prefetch(2))
            batch = iterator.get_next()
        with tf1.Session(graph=graph) as sess:
            sess.run(iterator.initializer)
            while True:
                try:
                    yield sess.run(batch)
                except tf.errors.OutOfRangeError:
                    return
                except tf.errors.InvalidArgumentError as e:
                    raise _read_error(self.image_set, e) from None


def _in_order(image_set):
    """(image, label) of a split's good records, in file order, at the evaluation view."""
    return kept(image_set.examples(training=False))


def _read_error(image_set, error):
    """DataError of a TensorFlow error reading a split: its bad record, else the first line
    of the message that says what went wrong."""
    lines = [line.strip() for line in error.message.splitlines() if line.strip()
             and not line.strip().startswith(('Graph execution error', '[[', 'Detected at'))]
    problem = bad_record(error.message) or (lines[0] if lines else type(error).__name__)
    return DataError('cannot read the %s split: %s' % (image_set.split, problem))


def read_all(image_set):
    """Every image of an ImageRecordSet in memory, at the evaluation view: (images uint8
    [N, H, W, C], labels [N]).

    For a small evaluation split (ImageNet's 50,000 at 224 would be 7.5 GB: stream those).
    """
    try:
        chunks = drain(lambda: _in_order(image_set).batch(256))
    except tf.errors.InvalidArgumentError as e:
        raise _read_error(image_set, e) from None
    if not chunks:
        return (np.zeros((0,) + image_set.input_shape, np.uint8), np.zeros([0], np.int64))
    return (np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks]))
