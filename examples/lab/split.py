"""Step 5 of the lab, the other half: write the recipe's cutting step yourself.

The global batch arrives whole; cut it into one slice per tower, so that every example goes to
exactly one tower and each tower knows what share of the update it is. Then let `towers check`
grade it:

    towers check --split examples/lab/split.py:split_batch --towers 3 \
        --model small_convnet --batch-size 10 --steps 1 --devices cpu

(It holds the cut to what a cut must do on that batch, and on 2 examples over 3 towers: one
tower then has none.)
"""
import tensorflow as tf  # noqa: F401 (yours to use)

from towers.slicing import TowerSlice  # noqa: F401 (what each slice is)


def split_batch(images, labels, num_towers):
    """One TowerSlice(images, labels, count, batch) per tower.

    Args:
      images: [batch, H, W, C] float32; batch is only known when the graph runs
        (tf.shape(labels)[0]), and may be smaller than num_towers.
      labels: [batch] int64.
      num_towers: a Python int.
    Returns:
      num_towers TowerSlices: tower i's images and labels, count (how many of its rows are
      real examples) and batch (the whole batch's size: tower i counts count / batch of the
      update). A tower with no example still needs one image, a stand-in, with count 0: some
      kernels cannot take an empty batch.
    """
    # Your code here: the batch's size, each tower's size (the remainder of batch over
    # num_towers goes to the first towers, one more each), then the slices in order.
    raise NotImplementedError('cut the batch in examples/lab/split.py')
