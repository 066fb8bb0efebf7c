"""An answer to step 5's cut: contiguous slices, the remainder to the first towers.

batch over N towers is batch // N each, and the first batch % N towers one more. A tower with
no example (a batch smaller than N) is handed the batch's last example as a stand-in, with
count 0: its loss is masked out and its share, 0 / batch, adds nothing to the update.
"""
import tensorflow as tf

from towers.slicing import TowerSlice


def split_batch(images, labels, num_towers):
    batch = tf.shape(labels)[0]
    size, extra = batch // num_towers, batch % num_towers
    slices, start = [], 0
    for i in range(num_towers):
        count = size + tf.cast(i < extra, tf.int32)
        begin = tf.minimum(start, batch - 1)  # an empty tower's stand-in: the last example
        end = begin + tf.maximum(count, 1)
        slices.append(TowerSlice(images[begin:end], labels[begin:end], count, batch))
        start += count
    return slices
