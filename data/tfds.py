"""A TensorFlow Datasets folder, read without tensorflow-datasets: `--dataset tfds:DIR`.

DIR is a prepared dataset's version folder, as `tfds.load` or `tfds build` leaves it
(e.g. ~/tensorflow_datasets/imagenet2012/5.1.0):

  dataset_info.json   the name, the file format and each split's shard lengths (and, from
                      tensorflow-datasets 4.6, its file name template)
  features.json       the features (4.0-4.4 write {"type", "content"}, 4.5 the same with
                      the content as a JSON string, 4.6 on the protobuf's JSON)
  NAME-SPLIT.tfrecord-00000-of-01024 ...
                      tf.train.Example records: each Image feature its encoded bytes, each
                      ClassLabel its int64 class (0-based) under the feature's name
  LABEL.labels.txt    the class names, one a line, when the dataset has names

The image and the label are the dataset's supervised keys, or else its one Image and one
ClassLabel feature. Images of a fixed shape (MNIST's 28x28x1) are decoded as they are;
JPEGs of any size (imagenet2012's) get tf_cnn_benchmarks' crops (data/imagenet.py).

This module imports TensorFlow only through data.imagenet; `import data` does not import it.
"""
import collections
import json
import os

from towers.data.errors import DataError

IMAGE, CLASS_LABEL = 'image_feature.Image', 'class_label_feature.ClassLabel'
TEMPLATE = '{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}'  # tensorflow-datasets' default

TfdsInfo = collections.namedtuple('TfdsInfo', [
    'name', 'splits', 'image', 'shape', 'encoding', 'label', 'num_classes', 'class_names'])
TfdsInfo.__doc__ = """What a TFDS folder holds, as towers reads it.

name: the dataset's; splits: {split: [shard paths]}; image, label: the feature keys;
shape: (H, W, C) with None for a size that varies; encoding: 'jpeg', 'png' or None (not
said); num_classes; class_names: a tuple, or None.
"""


def is_tfds_folder(folder):
    return os.path.isfile(os.path.join(folder, 'dataset_info.json'))


def read_info(folder):
    """The TfdsInfo of a prepared folder; DataError naming what is missing or unreadable."""
    info = _json(folder, 'dataset_info.json')
    try:
        features = _features(_json(folder, 'features.json'))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise DataError('%s: features.json is not in a form towers reads (%s: %s)'
                        % (folder, type(e).__name__, e)) from None
    name = info.get('name')
    file_format = info.get('fileFormat', 'tfrecord')
    if not name:
        raise DataError('%s has no dataset name in dataset_info.json' % folder)
    if file_format != 'tfrecord':
        raise DataError('%s holds %s shards; towers reads tfrecord (prepare it with '
                        "file_format='tfrecord', the default)" % (folder, file_format))
    image, label = _supervised(folder, info, features)
    _, shape, dtype, encoding = features[image]
    if dtype not in (None, 'uint8'):
        raise DataError('%s: the %r images are %s; towers reads uint8 images'
                        % (folder, image, dtype))
    if None not in shape and shape[2] not in (1, 3):
        raise DataError('%s: the %r images have %d channels; towers reads 1 or 3'
                        % (folder, image, shape[2]))
    if None in shape and encoding not in (None, 'jpeg'):
        raise DataError('%s: the %r images vary in size and are %s; towers crops JPEGs of any '
                        'size, and reads other formats only at a fixed size'
                        % (folder, image, encoding))
    splits = {}
    for split in info.get('splits', []):
        splits[split['name']] = _shards(folder, name, file_format, split)
    if 'train' not in splits:
        raise DataError('%s has no train split (it has: %s)'
                        % (folder, ', '.join(sorted(splits)) or 'none'))
    names = _class_names(folder, label, features[label][1])
    return TfdsInfo(name, splits, image, shape, encoding, label, features[label][1], names)


def evaluation_split(info):
    """The split towers evaluates on: validation (ImageNet's), else test, else None."""
    return next((s for s in ('validation', 'test') if s in info.splits), None)


def image_set(folder, split, size, info=None, **options):
    """The split as a data.image_records.ImageRecordSet (options: seed, num_workers, ...)."""
    from towers.data import image_records, imagenet
    info = info or read_info(folder)
    if split not in info.splits:
        raise DataError('%s has no %s split (it has: %s)'
                        % (folder, split, ', '.join(sorted(info.splits))))
    fixed = None not in info.shape
    schema = imagenet.Schema(info.image, info.label, 0, False,
                             tuple(info.shape) if fixed else None)
    return image_records.ImageRecordSet(info.splits[split], split, size, info.num_classes, schema,
                                   **options)


def _json(folder, name):
    path = os.path.join(folder, name)
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError('%s has no %s: give the folder of a prepared TFDS dataset version, '
                        'e.g. ~/tensorflow_datasets/mnist/3.0.1' % (folder, name)) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError('%s is not JSON: %s' % (path, e)) from None


def _features(document):
    """{key: (kind 'image' | 'label' | other, shape or num_classes, dtype, encoding)} of the
    top level of features.json, in any of its three forms."""
    if 'featuresDict' in document:  # 4.6 on: the protobuf's JSON
        entries = document['featuresDict'].get('features', {})
    else:  # 4.0-4.5: {"type": FeaturesDict, "content": {...} or its proto's JSON string}
        content = document.get('content', {})
        if isinstance(content, str):
            content = json.loads(content).get('features', {})
        entries = content
    features = {}
    for key, entry in entries.items():
        kind = entry.get('pythonClassName') or entry.get('type') or ''
        body = entry.get('content', entry)
        if isinstance(body, str):
            body = json.loads(body)
        if kind.endswith(IMAGE):
            image = body.get('image', body)
            shape = image.get('shape', [None, None, None])
            if isinstance(shape, dict):  # {"dimensions": ["-1", "-1", "3"]}
                shape = shape.get('dimensions', [])
            shape = tuple(None if d is None or int(d) < 0 else int(d) for d in shape)
            encoding = image.get('encodingFormat', image.get('encoding_format'))
            features[key] = ('image', shape, image.get('dtype'), encoding)
        elif kind.endswith(CLASS_LABEL):
            label = body.get('classLabel', body)
            count = label.get('numClasses', label.get('num_classes'))
            features[key] = ('label', int(count), None, None)
        else:
            features[key] = (kind.rsplit('.', 1)[-1] or 'unknown', None, None, None)
    return features


def _supervised(folder, info, features):
    """(image key, label key): the supervised keys, else the one Image and one ClassLabel."""
    keys = info.get('supervisedKeys') or {}
    if 'tuple' in keys:
        pair = [item.get('featureKey') for item in keys['tuple'].get('items', [])]
    else:
        pair = [keys.get('input'), keys.get('output')]
    if len(pair) == 2 and all(pair):
        image, label = pair
    else:
        images = [k for k, v in features.items() if v[0] == 'image']
        labels = [k for k, v in features.items() if v[0] == 'label']
        if len(images) != 1 or len(labels) != 1:
            raise DataError('%s has %d Image and %d ClassLabel features and no supervised '
                            'keys: towers needs one of each' % (folder, len(images),
                                                               len(labels)))
        image, label = images[0], labels[0]
    for key, kind in ((image, 'image'), (label, 'label')):
        if features.get(key, (None,))[0] != kind:
            raise DataError('%s: feature %r is not %s' % (
                folder, key, 'an Image' if kind == 'image' else 'a ClassLabel'))
        if kind == 'image' and len(features[key][1]) != 3:
            raise DataError('%s: the %r images are not [height, width, channels]'
                            % (folder, key))
    return image, label


def _shards(folder, name, file_format, split):
    """The paths of a split's shards, every one checked to be there."""
    count = len(split.get('shardLengths', [])) or int(split.get('numShards', 0))
    template = split.get('filepathTemplate') or TEMPLATE
    paths = []
    for index in range(count):
        base = (template.replace('{DATASET}', name).replace('{SPLIT}', split['name'])
                .replace('{FILEFORMAT}', file_format)
                .replace('{SHARD_X_OF_Y}', '%05d-of-%05d' % (index, count))
                .replace('{SHARD_INDEX}', '%05d' % index)
                .replace('{NUM_SHARDS}', '%05d' % count))
        paths.append(os.path.join(folder, base))
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise DataError('%s lacks %d of the %d %s shards its dataset_info.json lists, e.g. %s'
                        % (folder, len(missing), count, split['name'],
                           os.path.basename(missing[0])))
    if not paths:
        raise DataError('%s lists no %s shards in dataset_info.json' % (folder, split['name']))
    return paths


def _class_names(folder, label, num_classes):
    path = os.path.join(folder, label.replace('/', '-') + '.labels.txt')
    try:
        with open(path, encoding='utf-8') as f:
            names = tuple(line.strip() for line in f if line.strip())
    except FileNotFoundError:
        return None
    if len(names) != num_classes:
        raise DataError('%s names %d classes but features.json says %d'
                        % (path, len(names), num_classes))
    return names
