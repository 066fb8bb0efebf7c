"""tfds:DIR: a prepared TensorFlow Datasets folder, read without tensorflow-datasets, in the
three forms its features.json has had (4.0-4.4, 4.5, 4.6 on)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from towers.data import image_splits, imagenet, tfds
from towers.data.errors import DataError

IMAGE = 'tensorflow_datasets.core.features.image_feature.Image'
LABEL = 'tensorflow_datasets.core.features.class_label_feature.ClassLabel'
TEXT = 'tensorflow_datasets.core.features.text_feature.Text'


def _features(form, shape, num_classes, encoding):
    """features.json of an image, a label and a file name, as tensorflow-datasets writes it."""
    if form == 'proto':  # 4.6 on (as mnist/3.0.1 and imagenet2012/5.1.0 have it)
        image = {'dtype': 'uint8',
                 'shape': {'dimensions': [str(-1 if d is None else d) for d in shape]}}
        if encoding:
            image['encodingFormat'] = encoding
        return {'featuresDict': {'features': {
            'image': {'pythonClassName': IMAGE, 'image': image},
            'label': {'pythonClassName': LABEL, 'classLabel': {'numClasses': str(num_classes)}},
            'file_name': {'pythonClassName': TEXT, 'text': {}}}},
            'pythonClassName': 'tensorflow_datasets.core.features.features_dict.FeaturesDict'}
    content = {'image': {'type': IMAGE, 'content': {'shape': list(shape), 'dtype': 'uint8',
                                                    'encoding_format': encoding}},
               'label': {'type': LABEL, 'content': {'num_classes': num_classes}},
               'file_name': {'type': TEXT, 'content': {}}}
    if form == 'string':  # 4.5: the content as its proto's JSON
        content = json.dumps(_features('proto', shape, num_classes, encoding)['featuresDict'])
    return {'type': 'tensorflow_datasets.core.features.features_dict.FeaturesDict',
            'content': content}


def _example(encoded, label):
    return tf.train.Example(features=tf.train.Features(feature={
        'image': tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        'file_name': tf.train.Feature(bytes_list=tf.train.BytesList(value=[b'x.png']))
    })).SerializeToString()


def _write(folder, splits, form='proto', shape=(8, 8, 1), num_classes=3, encoding=None,
           name='digits', templates=True, names=True):
    """A TFDS folder: splits {name: [[(image uint8, label)] per shard]}."""
    os.makedirs(folder, exist_ok=True)
    info_splits = []
    for split, shards in splits.items():
        for index, shard in enumerate(shards):
            path = os.path.join(folder, '%s-%s.tfrecord-%05d-of-%05d'
                                % (name, split, index, len(shards)))
            with tf.io.TFRecordWriter(path) as writer:
                for image, label in shard:
                    encode = tf.io.encode_jpeg if encoding == 'jpeg' else tf.io.encode_png
                    writer.write(_example(encode(image).numpy(), label))
        entry = {'name': split, 'numBytes': '1', 'shardLengths': [str(len(s)) for s in shards]}
        if templates:
            entry['filepathTemplate'] = '{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}'
        info_splits.append(entry)
    info = {'name': name, 'fileFormat': 'tfrecord', 'version': '1.0.0', 'splits': info_splits,
            'supervisedKeys': {'tuple': {'items': [{'featureKey': 'image'},
                                                   {'featureKey': 'label'}]}}}
    with open(os.path.join(folder, 'dataset_info.json'), 'w') as f:
        json.dump(info, f)
    with open(os.path.join(folder, 'features.json'), 'w') as f:
        json.dump(_features(form, shape, num_classes, encoding), f)
    if names:
        with open(os.path.join(folder, 'label.labels.txt'), 'w') as f:
            f.write(''.join('class%d\n' % i for i in range(num_classes)))
    return folder


def _digits(count, seed, shape=(8, 8, 1), num_classes=3):
    rng = np.random.RandomState(seed)
    return [(rng.randint(0, 256, shape).astype(np.uint8), int(rng.randint(num_classes)))
            for _ in range(count)]


@pytest.mark.parametrize('form', ['proto', 'string', 'content'])
def test_each_form_of_features_json_reads_the_same(tmp_path, form):
    folder = _write(str(tmp_path), {'train': [_digits(3, 0), _digits(2, 1)],
                                    'test': [_digits(4, 2)]}, form=form,
                    templates=form == 'proto')
    info = tfds.read_info(folder)
    assert (info.name, info.image, info.label, info.shape, info.num_classes) == (
        'digits', 'image', 'label', (8, 8, 1), 3)
    assert info.class_names == ('class0', 'class1', 'class2')
    assert [os.path.basename(p) for p in info.splits['train']] == [
        'digits-train.tfrecord-00000-of-00002', 'digits-train.tfrecord-00001-of-00002']
    assert tfds.evaluation_split(info) == 'test'


def test_images_of_a_fixed_shape_are_read_exactly_and_labels_as_they_are(tmp_path):
    test = _digits(5, 7)
    folder = _write(str(tmp_path), {'train': [_digits(3, 0)], 'test': [test]})
    images, labels = image_splits.read_all(tfds.image_set(folder, 'test', 224))
    np.testing.assert_array_equal(images, np.stack([image for image, _ in test]))
    assert list(labels) == [label for _, label in test]


def test_jpegs_of_any_size_get_the_imagenet_views(tmp_path):
    def pictures(count, seed):
        rng = np.random.RandomState(seed)
        return [(rng.randint(0, 256, (30 + 5 * i, 40, 3)).astype(np.uint8), i % 4)
                for i in range(count)]
    folder = _write(str(tmp_path), {'train': [pictures(4, 0)], 'validation': [pictures(3, 1)]},
                    form='content', shape=(None, None, 3), num_classes=4, encoding='jpeg',
                    name='imagenet2012', names=False)
    info = tfds.read_info(folder)
    assert info.shape == (None, None, 3) and info.class_names is None
    validation = tfds.image_set(folder, 'validation', 16, info)
    assert validation.input_shape == (16, 16, 3) and validation.num_examples == 3
    images, labels = image_splits.read_all(validation)
    assert images.shape == (3, 16, 16, 3) and list(labels) == [0, 1, 2]
    stored = [tf.train.Example.FromString(record.numpy()).features.feature['image']
              .bytes_list.value[0] for record in tf.data.TFRecordDataset(
                  info.splits['validation'])]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:  # the centre view of each
        expected = sess.run([imagenet.eval_image(tf.constant(jpeg), 16) for jpeg in stored])
    np.testing.assert_array_equal(images, np.stack(expected))


@pytest.mark.parametrize('damage, message', [
    ('no features', r'has no features\.json: give the folder of a prepared TFDS dataset '
                    r'version, e\.g\. ~/tensorflow_datasets/mnist/3\.0\.1$'),
    ('missing shard', r'lacks 1 of the 2 train shards its dataset_info\.json lists, e\.g\. '
                      r'digits-train\.tfrecord-00001-of-00002$'),
    ('riegeli', r'holds riegeli shards; towers reads tfrecord'),
    ('two images', r'feature \'label\' is not a ClassLabel$'),
])
def test_a_folder_towers_cannot_read_is_one_line(tmp_path, damage, message):
    folder = _write(str(tmp_path), {'train': [_digits(2, 0), _digits(2, 1)]})
    if damage == 'no features':
        os.unlink(os.path.join(folder, 'features.json'))
    elif damage == 'missing shard':
        os.unlink(os.path.join(folder, 'digits-train.tfrecord-00001-of-00002'))
    else:
        path = os.path.join(folder, 'dataset_info.json' if damage == 'riegeli'
                            else 'features.json')
        with open(path) as f:
            document = json.load(f)
        if damage == 'riegeli':
            document['fileFormat'] = 'riegeli'
        else:
            features = document['featuresDict']['features']
            features['label'] = dict(features['image'])
        with open(path, 'w') as f:
            json.dump(document, f)
    with pytest.raises(DataError, match=message):
        tfds.read_info(folder)


def test_training_on_a_tfds_folder_on_two_towers_and_evaluating_it(tmp_path, capsys):
    from towers.cli import main
    folder = _write(str(tmp_path / 'tfds'), {'train': [_digits(6, 0), _digits(5, 1)],
                                             'test': [_digits(4, 2)]})
    logdir = str(tmp_path / 'run')
    assert main(['train', '--dataset', 'tfds:' + folder, '--model', 'small_convnet',
                 '--towers', '2', '--devices', 'cpu', '--batch-size', '4', '--steps', '3',
                 '--logdir', logdir, '--eval-every', '0', '--no-tensorboard']) == 0
    out = capsys.readouterr().out
    assert 'dataset tfds:%s: 11 train, 0 validation, 0 test; model small_convnet' % folder in out
    assert main(['eval', '--logdir', logdir, '--devices', 'cpu']) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith('(4 images)')
    assert main(['train', '--dataset', 'tfds:' + folder, '--model', 'small_convnet',
                 '--image-size', '16', '--steps', '1', '--logdir', str(tmp_path / 'r2')]) == 1
    assert capsys.readouterr().err.strip() == (
        "towers: error: --image-size goes with images of any size; tfds:%s's are all 8x8x1"
        % folder)


REAL = os.path.join(os.path.dirname(__file__), 'tfds_folders')  # written by tfds 4.9.10


def test_folders_that_tensorflow_datasets_wrote_read_as_it_wrote_them():
    """make.py beside them made these: the images and labels its builders generated."""
    tiny = os.path.join(REAL, 'tiny', '1.0.0')
    info = tfds.read_info(tiny)
    assert (info.name, info.shape, info.encoding, info.num_classes, info.class_names) == (
        'tiny', (8, 8, 1), None, 3, ('a', 'b', 'c'))
    images, labels = image_splits.read_all(tfds.image_set(tiny, 'test', 224, info))
    rng = np.random.RandomState(1)  # make.py's test split: 6 examples from seed 1
    made = [(rng.randint(0, 256, (8, 8, 1)).astype(np.uint8), int(rng.randint(3)))
            for _ in range(6)]
    # tensorflow-datasets shuffles the examples as it writes them: compare as sets.
    assert sorted((image.tobytes(), int(label)) for image, label in zip(images, labels)) == \
        sorted((image.tobytes(), label) for image, label in made)

    jpegs = os.path.join(REAL, 'tiny_jpeg', '2.0.0')
    info = tfds.read_info(jpegs)
    assert (info.shape, info.encoding, info.num_classes, tfds.evaluation_split(info)) == (
        (None, None, 3), 'jpeg', 4, 'validation')
    images, labels = image_splits.read_all(tfds.image_set(jpegs, 'validation', 16, info))
    assert images.shape == (4, 16, 16, 3) and sorted(labels) == [0, 1, 2, 3]
