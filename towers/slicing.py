"""Cutting a batch: over the towers (split_batch), and a tower's slice over time into
micro-batches (micro_slices, --accumulate), both by one rule: contiguous parts, as equal as
possible, the first larger, and an empty part handed a stand-in example with count 0.

The bottom of the tower layer: towers/tower.py, the input sources and the tools cut batches
with it; it imports nothing of towers.
"""
import collections

import tensorflow as tf

TowerSlice = collections.namedtuple('TowerSlice', ['images', 'labels', 'count', 'batch'])
TowerSlice.__doc__ = """One tower's share of a global batch.

  images: [m, H, W, C] float32; labels: [m] int64.
  count: scalar int32, how many of the m examples are real (m = max(count, 1):
    an empty share carries one stand-in example, see split_batch).
  batch: scalar int32, the global batch size the share was cut from (for a
    micro-batch, its tower's count).
"""


def share_of(batch, num_parts, index):
    """(start, size) of part `index` of a batch of Python int size, cut as split_sizes cuts
    it: as equal as possible, the first parts larger (100 over 3: (0, 34), (34, 33), (67, 33))."""
    base, extra = divmod(batch, num_parts)
    return index * base + min(index, extra), base + (index < extra)


def split_sizes(batch, num_towers):
    """Per-tower slice sizes of a batch: as equal as possible, the first towers larger.

    100 over 3 towers -> [34, 33, 33]; 2 over 3 towers -> [1, 1, 0].

    Args:
      batch: scalar int32 tensor (or int), the global batch size.
      num_towers: Python int.
    Returns:
      [num_towers] int32 tensor.
    """
    base, extra = batch // num_towers, batch % num_towers
    return tf.stack([base + tf.cast(i < extra, tf.int32) for i in range(num_towers)])


def split_batch(images, labels, num_towers):
    """Slice a global batch into num_towers contiguous pieces.

    A tower whose share is empty (a batch smaller than num_towers) is handed
    the batch's last example as a stand-in, with count 0: tower_loss masks it
    out and the tower's weight is 0. Feeding it nothing would be cleaner, but
    some CPU kernels (oneDNN's max-pool gradient) abort on an empty batch.

    Args:
      images: [batch, H, W, C] float32; batch may be unknown, must be >= 1.
      labels: [batch] int64.
      num_towers: Python int.
    Returns:
      num_towers TowerSlices.
    """
    with tf.name_scope('split_batch'):
        batch = tf.shape(labels)[0]
        if num_towers == 1:
            return [TowerSlice(images, labels, batch, batch)]
        return _cut(images, labels, batch, num_towers)


def micro_slices(piece, parts):
    """A tower's slice cut into `parts` micro-batches (--accumulate), as split_batch cuts a
    global batch; each one's `batch` is the slice's count, which its share is a part of."""
    with tf.name_scope('micro_batches'):
        return _cut(piece.images, piece.labels, piece.count, parts)


def _cut(images, labels, count, parts):
    """`parts` TowerSlices of the first `count` rows (>= 1 rows in all: count, or an empty
    share's stand-in), an empty part handed the last row as a stand-in, count 0."""
    rows = tf.shape(labels)[0]
    sizes = split_sizes(count, parts)
    starts = tf.cumsum(sizes, exclusive=True)
    pieces = []
    for i in range(parts):
        begin = tf.minimum(starts[i], rows - 1)
        end = begin + tf.maximum(sizes[i], 1)
        pieces.append(TowerSlice(images[begin:end], labels[begin:end], sizes[i], count))
    return pieces
