"""ImageNet-format TFRecords, as tensorflow/models' build_imagenet_data.py writes them.

A folder of shards `train-00000-of-01024` ... and `validation-00000-of-00128` ... (any
counts), each record a tf.train.Example with

  image/encoded            the JPEG bytes
  image/class/label        1..1000 (0 is left unused, for a background class)
  image/object/bbox/xmin, ymin, xmax, ymax
                           the object boxes, fractions of the width and height
  image/height, image/width

towers trains on label - 1, so the classes are 0..999 (class i is the (i+1)-th synset of
build_imagenet_data.py's sorted list), and a record labelled 0 is out of range.

Preprocessing is tf_cnn_benchmarks' (its preprocessing.py), on the host CPU:
  training    (--augment inception; data/augment.py has the others) a box drawn by
              sample_distorted_bounding_box over the JPEG's own shape and the record's boxes
              (at least 10% of a box covered, aspect 3/4..4/3, 5%..100% of the area, the
              whole image when there is no box), decoded and cropped in one op
              (decode_and_crop_jpeg), resized to the model's size (bilinear), flipped
              left-right half the time;
  evaluation  decoded, the short side resized to 1.145 times the model's size (256 for
              224), the centre cut out.
The image leaves as uint8 (rounded), so it crosses to the towers' devices as bytes and the
model's side normalises it (towers/inputs/dataset.py).

The records are read, shuffled, decoded in parallel and checked by data/image_records.py,
which also says how the crops are seeded so that a resumed run crops as the uninterrupted
one; ImageNetSet there is one split of such a folder.

This module imports TensorFlow; `import data` does not import it.
"""
import collections
import glob
import os
import re
import struct

import tensorflow as tf

from towers.data.errors import DataError

SPLITS = ('train', 'validation')
# The class names, one a line, as `towers data convert --from-folder` writes them (its LABELS;
# not imported: the converter imports this module's writer in its workers).
LABELS = 'labels.txt'
EVAL_RESIZE = 1.145  # the short side before the centre crop: 256 for 224
_SHARD = re.compile(r'^(train|validation)-(\d+)-of-(\d+)$')
_BOX = 'image/object/bbox/'


class Schema(collections.namedtuple('Schema', ['image', 'label', 'first_label', 'boxes',
                                                'shape'])):
    """Where a record keeps its image and label.

    image, label: the feature keys of the encoded image (bytes) and the label (int64).
    first_label: the label of class 0 (build_imagenet_data.py: 1; TFDS: 0).
    boxes: the record has build_imagenet_data.py's image/object/bbox/* boxes.
    shape: (H, W, C) when every image has that shape (decoded as it is, any format
      tf.io.decode_image reads); None for JPEGs of any size, cropped or centred to the
      model's side as tf_cnn_benchmarks does.
    """


BUILD_IMAGENET = Schema('image/encoded', 'image/class/label', 1, True, None)


def make_example(jpeg, label, height, width, boxes=()):
    """One record of the schema, serialised: JPEG bytes, its 1-based label, its size, and
    object boxes [(ymin, xmin, ymax, xmax)] as fractions."""
    def floats(values):
        return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))
    feature = {
        'image/encoded': tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
        'image/format': tf.train.Feature(bytes_list=tf.train.BytesList(value=[b'JPEG'])),
        'image/class/label': ints([label]), 'image/height': ints([height]),
        'image/width': ints([width]), 'image/channels': ints([3]),
    }
    for index, side in enumerate(('ymin', 'xmin', 'ymax', 'xmax')):
        feature['image/object/bbox/' + side] = floats(box[index] for box in boxes)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def shard_files(folder, split):
    """The split's shards in the folder, in order; DataError when there are none or some are
    missing from the set their names promise (`train-00003-of-01024` with 1023 others)."""
    if split not in SPLITS:
        raise DataError('an ImageNet folder has the splits train and validation, not %r' % split)
    found = _shards(folder, split)
    if not found:
        raise DataError('%s has no %s shards (%s-00000-of-NNNNN, as build_imagenet_data.py '
                        'names them)' % (folder, split, split))
    totals = {total for _, total in found}
    if len(totals) != 1:
        raise DataError('%s mixes %s shard sets of %s files: keep one'
                        % (folder, split, ' and '.join(str(t) for t in sorted(totals))))
    total = totals.pop()
    missing = [i for i in range(total) if (i, total) not in found]
    if missing:
        raise DataError('%s lacks %d of its %d %s shards, e.g. %s-%05d-of-%05d'
                        % (folder, len(missing), total, split, split, missing[0], total))
    return [found[(i, total)] for i in range(total)]


def has_split(folder, split):
    """Whether the folder has any shard of the split (a set with some missing still counts:
    shard_files names what is missing)."""
    return bool(_shards(folder, split))


def _shards(folder, split):
    """{(index, total): path} of the split's shards in the folder, by their names."""
    found = {}
    for path in glob.glob(os.path.join(glob.escape(folder), '%s-*-of-*' % split)):
        match = _SHARD.match(os.path.basename(path))
        if match:
            found[(int(match.group(2)), int(match.group(3)))] = path
    return found


class TruncatedShard(DataError):
    """A shard cut short; `records`: how many whole records come before the cut."""

    def __init__(self, message, records):
        super().__init__(message)
        self.records = records


def class_count(folder):
    """ImageNet's 1000, or as many as labels.txt (one class name a line) lists."""
    try:
        with open(os.path.join(folder, LABELS), encoding='utf-8') as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 1000


def count_records(path):
    """Records in one TFRecord file, by its framing (a length, its CRC, the data, its CRC),
    without parsing them; DataError naming the file and the record that is cut short."""
    count, size = 0, os.path.getsize(path)
    with open(path, 'rb') as f:
        position = 0
        while position < size:
            header = f.read(12)
            if len(header) < 12:
                raise TruncatedShard('%s is truncated in record %d (its header)' % (path, count),
                                 count)
            (length,) = struct.unpack('<Q', header[:8])
            position += 12 + length + 4
            if position > size:
                raise TruncatedShard('%s is truncated in record %d (%d bytes of its %d)'
                                 % (path, count, size - (position - length - 4), length), count)
            f.seek(position)
            count += 1
    return count


def parse(serialized, schema=BUILD_IMAGENET):
    """(image bytes, class (label - first_label; negative when missing), boxes [1, n, 4] as
    [ymin, xmin, ymax, xmax], n = 0 without any) of one record."""
    features = {schema.image: tf.io.FixedLenFeature([], tf.string),
                schema.label: tf.io.FixedLenFeature([], tf.int64,
                                                    default_value=schema.first_label - 1)}
    sides = ('ymin', 'xmin', 'ymax', 'xmax')
    if schema.boxes:
        features.update({_BOX + side: tf.io.VarLenFeature(tf.float32) for side in sides})
    parsed = tf.io.parse_single_example(serialized, features)
    if schema.boxes:
        boxes = tf.stack([tf.sparse.to_dense(parsed[_BOX + side]) for side in sides], axis=1)
    else:
        boxes = tf.zeros([0, 4])
    return (parsed[schema.image], parsed[schema.label] - schema.first_label,
            tf.expand_dims(boxes, 0))


def train_image(jpeg, boxes, size, seed):
    """tf_cnn_benchmarks' training crop of one JPEG: [size, size, 3] uint8.

    Args:
      jpeg: the encoded bytes.
      boxes: [1, n, 4] float32 object boxes (n may be 0: the whole image is the box).
      size: the model's side.
      seed: [2] int64, this example's stateless seed.
    """
    seeds = tf.random.experimental.stateless_split(seed, 2)
    begin, crop_size = inception_box(tf.io.extract_jpeg_shape(jpeg), boxes, seeds[0])
    window = tf.stack([begin[0], begin[1], crop_size[0], crop_size[1]])
    image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
    image = tf.image.resize(image, [size, size], method='bilinear')
    image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    return _to_bytes(image)


def inception_box(image_shape, boxes, seed):
    """tf_cnn_benchmarks' box of an image: at least 10% of an object box covered (the whole
    image when there is none), aspect 3/4..4/3, 5%..100% of the area; (begin [3], size [3])
    int32, for tf.slice.

    Args:
      image_shape: [3] int32 (H, W, C).
      boxes: [1, n, 4] float32 object boxes as fractions (n may be 0).
      seed: [2] int64, stateless.
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_shape, boxes, seed=seed, min_object_covered=0.1, aspect_ratio_range=[0.75, 1.33],
        area_range=[0.05, 1.0], max_attempts=100, use_image_if_no_bounding_boxes=True)
    return begin, size


def eval_image(jpeg, size):
    """The evaluation view of one JPEG: the short side resized to size * 1.145, the centre
    size x size cut out; [size, size, 3] uint8."""
    image = tf.io.decode_jpeg(jpeg, channels=3)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = round(size * EVAL_RESIZE) / tf.reduce_min(shape)
    resized = tf.cast(tf.round(shape * scale), tf.int32)
    image = tf.image.resize(image, resized, method='bilinear')
    top, left = (resized[0] - size) // 2, (resized[1] - size) // 2
    return _to_bytes(image[top:top + size, left:left + size, :])


def _to_bytes(image):
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
