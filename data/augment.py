"""Training augmentations chosen by name, and the default that fits the images.

  inception      tf_cnn_benchmarks' crop (data/imagenet.py inception_box): a box of 5-100% of
                 the image's area, aspect 3/4..4/3, resized to the side, flipped left-right
                 half the time. JPEGs of any size are cropped as they are decoded
                 (imagenet.train_image); an image of a fixed size is cropped and resized back
                 to its size.
  pad-crop-flip  CIFAR's, as He et al. 2016 train their ResNets: 4 pixels of zeros on each
                 side, a random crop back to the size, flipped left-right half the time.
                 JPEGs of any size take the evaluation view first (the centre at the side).
  center         none: the image as it is (JPEGs: the evaluation view).

Evaluation always takes the centre view: JPEGs imagenet.eval_image's, other images as they are.
default_for says which fits images of a shape when none is asked for.

Every number is drawn by stateless ops from the run's seed and the image's place in the run,
never from a generator's state or from the tower the image lands on, so N towers see what one
device sees, a cluster worker's share what those rows of the whole batch get, and a resumed
run what the uninterrupted one got. A global batch (augment_batch) draws from (seed, step), its
row i from row i of the draw; an image decoded alone (augment_image, jpeg_view: the records of
data/image_records.py) from (seed, its number in the run).

This module imports TensorFlow; `import towers.data` does not import it.
"""
import collections

import tensorflow as tf

from towers.data import imagenet
from towers.names import AUGMENTATIONS

INCEPTION, PAD_CROP_FLIP, CENTER = AUGMENTATIONS
PAD = 4  # pad-crop-flip's zeros on each side, He et al.'s
INCEPTION_SIDE = 128  # from this training side up, images are photographs to crop


def default_for(input_shape):
    """The augmentation that fits training images of input_shape (H, W, C), the rule:

      a side of INCEPTION_SIDE (128) or more   inception: photographs, cropped as
                                               tf_cnn_benchmarks crops ImageNet's;
      a smaller colour image                   pad-crop-flip, CIFAR's;
      a smaller single-channel image           center: digits, which a flip or a shift to
                                               the edge can turn into another digit.
    """
    height, width, channels = input_shape
    if min(height, width) >= INCEPTION_SIDE:
        return INCEPTION
    return CENTER if channels == 1 else PAD_CROP_FLIP


class Augmentation(collections.namedtuple('Augmentation', ['name', 'default', 'input_shape'])):
    """The augmentation a run trains with: its name, whether it is the default (default_for)
    for images of input_shape, or was asked for (input_shape may then be None)."""

    def line(self):
        """What the run's first lines say of it."""
        images = ('random' if self.input_shape == RANDOM
                  else 'x'.join(map(str, self.input_shape or ())))
        how = 'the default for %s images' % images if self.default else 'as asked'
        return 'augment: %s (%s; evaluation: centre)' % (self.name, how)


# choose's input_shape for random images (imagenet-synthetic's): nothing to vary, so the
# default is center, which leaves a benchmark's host free of crops of noise.
RANDOM = 'random'


def choose(name, input_shape):
    """The Augmentation of a run: name (one of AUGMENTATIONS), else the default for its
    images of input_shape (RANDOM: center)."""
    shape = RANDOM if input_shape == RANDOM else tuple(input_shape)
    if name is not None:
        return Augmentation(_known(name), False, shape)
    return Augmentation(CENTER if shape == RANDOM else default_for(shape), True, shape)


def as_augmentation(value):
    """None, an Augmentation, or a name (as asked) -> None or an Augmentation."""
    if value is None or isinstance(value, Augmentation):
        return value
    return Augmentation(_known(value), False, None)


def _known(name):
    if name not in AUGMENTATIONS:
        raise ValueError('unknown augmentation %r; choose one of: %s'
                         % (name, ', '.join(AUGMENTATIONS)))
    return name


def augment_batch(images, name, seed, step, first=0, total=-1):
    """A global batch (or rows of it) augmented by name, drawn from (seed, step).

    Args:
      images: [n, H, W, C], any real dtype (bytes stay bytes, rounded).
      name: one of AUGMENTATIONS.
      seed, step: int64 scalars (tensors or ints): the run's seed, the batch's step.
      first, total: the rows are rows first..first+n-1 of a global batch of `total` rows (a
        cluster worker's share), drawn as that batch's; total -1: the batch is the n rows.
    Returns:
      [n, H, W, C] of images' dtype.
    """
    if _known(name) == CENTER:
        return images
    count = tf.shape(images, out_type=tf.int64)[0]
    total = tf.cast(total, tf.int64)
    total = tf.where(total < 0, count, total)
    first = tf.cast(first, tf.int64)
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(step, tf.int64)])
    if name == PAD_CROP_FLIP:
        draws = tf.random.stateless_uniform(tf.stack([total, 3]), seed=key)
        return pad_crop_flip(images, draws[first:first + count])
    seeds = tf.random.stateless_uniform(tf.stack([total, 2]), seed=key, minval=None,
                                        maxval=None, dtype=tf.int64)[first:first + count]
    return tf.map_fn(lambda pair: inception_resized(*pair), (images, seeds),
                     fn_output_signature=images.dtype)


def augment_image(image, name, seed):
    """One image [H, W, C] (any real dtype) augmented by name, drawn from seed ([2] int64:
    (the run's seed, the image's number in the run))."""
    if _known(name) == CENTER:
        return image
    if name == PAD_CROP_FLIP:
        return pad_crop_flip(image[None], tf.random.stateless_uniform([1, 3], seed=seed))[0]
    return inception_resized(image, seed)


def jpeg_view(jpeg, boxes, size, name, seed):
    """The training view of one JPEG of any size by name: [size, size, 3] uint8.

    Args:
      jpeg: the encoded bytes; boxes: [1, n, 4] object boxes (inception's, data/imagenet.py).
      size: the model's side; seed: [2] int64 as augment_image's.
    """
    if _known(name) == INCEPTION:
        return imagenet.train_image(jpeg, boxes, size, seed)
    return augment_image(tf.ensure_shape(imagenet.eval_image(jpeg, size), [size, size, 3]),
                         name, seed)


def pad_crop_flip(images, draws, pad=PAD):
    """images [n, H, W, C] padded with `pad` zeros on each side, cut back to H x W at the
    offsets and flipped left-right as draws [n, 3] (uniform in [0, 1): the row offset, the
    column offset, the flip when < 0.5) say; one gather per axis for the whole batch."""
    height, width = images.shape[1], images.shape[2]
    span = 2 * pad + 1  # offsets 0..2 * pad, the unshifted image at pad
    top, left = (tf.minimum(tf.cast(draws[:, k] * span, tf.int32), span - 1) for k in (0, 1))
    across = tf.range(width)
    columns = left[:, None] + tf.where(draws[:, 2:3] < 0.5, width - 1 - across, across)
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    cut = tf.gather(padded, top[:, None] + tf.range(height)[None], axis=1, batch_dims=1)
    return tf.gather(cut, columns, axis=2, batch_dims=1)


def inception_resized(image, seed):
    """inception on an image of a fixed size: [H, W, C] -> its box (inception_box, no object
    boxes) resized back to H x W (bilinear), flipped left-right half the time; same dtype
    (bytes rounded)."""
    height, width = image.shape[0], image.shape[1]
    seeds = tf.random.experimental.stateless_split(seed, 2)
    begin, size = imagenet.inception_box(tf.shape(image), tf.zeros([1, 0, 4]), seeds[0])
    resized = tf.image.resize(tf.slice(image, begin, size), [height, width], method='bilinear')
    flipped = tf.image.stateless_random_flip_left_right(resized, seed=seeds[1])
    flipped.set_shape(image.shape)  # (the box's channels are the image's: all of them)
    if image.dtype == tf.uint8:
        return tf.cast(tf.clip_by_value(tf.round(flipped), 0, 255), tf.uint8)
    return tf.cast(flipped, image.dtype)
