"""towers data convert --from-folder: class subfolders of images -> ImageNet-format shards,
then trained on (the end-to-end path a user with an ImageFolder tree takes)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from towers.cli import main
from towers.data import image_records, imagenet

tf1 = tf.compat.v1


def _picture(seed, height=48, width=64):
    rng = np.random.RandomState(seed)
    small = rng.randint(0, 256, (4, 4, 3)).astype(np.float32)
    return tf.cast(tf.image.resize(small, [height, width]), tf.uint8)


def _tree(root, classes=('cat', 'dog', 'emu'), per_class=4, bad=None):
    """class subfolders: JPEGs, one PNG each, and optionally one bad file."""
    for c, name in enumerate(classes):
        folder = os.path.join(root, name)
        os.makedirs(folder)
        for i in range(per_class):
            picture = _picture(10 * c + i)
            encoded = (tf.io.encode_png(picture) if i == 0 else tf.io.encode_jpeg(picture))
            with open(os.path.join(folder, '%d.%s' % (i, 'PNG' if i == 0 else 'jpg')),
                      'wb') as f:
                f.write(encoded.numpy())
        with open(os.path.join(folder, 'notes.txt'), 'w') as f:
            f.write('not an image, and not named like one: ignored')
    if bad:
        with open(os.path.join(root, classes[0], bad), 'wb') as f:
            f.write(b'\xff\xd8\xff\xe0 not really a JPEG')
    return root


def _records(folder, split):
    labels = []
    for path in imagenet.shard_files(folder, split):
        for serialized in tf.data.TFRecordDataset(path):
            jpeg, label, _ = imagenet.parse(serialized)
            assert tf.io.decode_jpeg(jpeg).shape[:2] == (48, 64)
            labels.append(int(label))
    return labels


def test_a_folder_becomes_shards_with_a_manifest_and_labels(tmp_path, capsys):
    train = _tree(str(tmp_path / 'train'))
    # Hidden entries are neither classes nor images: a notebook's checkpoints, macOS' ._ files.
    os.makedirs(os.path.join(train, '.ipynb_checkpoints'))
    with open(os.path.join(train, 'cat', '._0.jpg'), 'wb') as f:
        f.write(b'\x00\x05\x16\x07 AppleDouble')
    validation = _tree(str(tmp_path / 'val'), per_class=2)
    out = str(tmp_path / 'out')
    assert main(['data', 'convert', '--from-folder', train, '--validation-folder', validation,
                 '--out', out, '--shards', '4', '--workers', '2']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ['train: 12 images in 4 shard(s)', 'validation: 6 images in 1 shard(s)',
                     '3 classes; wrote %s/manifest.json: train with --dataset imagenet:%s'
                     % (out, out)]
    with open(os.path.join(out, 'labels.txt')) as f:
        assert f.read() == 'cat\ndog\nemu\n'
    manifest = json.load(open(os.path.join(out, 'manifest.json')))
    assert [s['records'] for s in manifest['splits']['train']['shards']] == [3, 3, 3, 3]
    assert not [f for f in os.listdir(out) if f.endswith('.partial')]
    # Every image once, labels 0..2 after the schema's 1..3; the shards mix the classes.
    train_labels = _records(out, 'train')
    assert sorted(train_labels) == [0] * 4 + [1] * 4 + [2] * 4
    assert train_labels[:3] != sorted(train_labels[:3]) or len(set(train_labels[:6])) > 1
    assert sorted(_records(out, 'validation')) == [0, 0, 1, 1, 2, 2]
    assert image_records.ImageNetSet(out, 'train', 32).num_classes == 3


def test_a_bad_image_is_named_or_skipped_and_counted(tmp_path, capsys):
    train = _tree(str(tmp_path / 'train'), bad='broken.jpg')
    out = str(tmp_path / 'out')
    assert main(['data', 'convert', '--from-folder', train, '--out', out,
                 '--workers', '1']) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('towers: error: %s is not a decodable image ('
                                               % os.path.join(train, 'cat', 'broken.jpg'))
    assert err[0].endswith('remove it, or pass --skip-bad-images to leave it out')
    # In the user's words: no TensorFlow function or node names (issue 43).
    assert '{{' not in err[0] and '[[' not in err[0], err[0]
    assert not os.path.exists(out)  # nothing left: not a shard, not the folder it made
    assert main(['data', 'convert', '--from-folder', train, '--out', out, '--workers', '1',
                 '--skip-bad-images']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith('skipped %s: ' % os.path.join(train, 'cat', 'broken.jpg'))
    assert '{{' not in lines[0], lines[0]
    assert 'train: 12 images in' in lines[1]


@pytest.mark.parametrize('argv,message', [
    (['--from-folder', 'nowhere'], 'nowhere is not a folder of class subfolders'),
    (['--skip-bad-images'], '--validation-folder, --skip-bad-images and --workers go with '
                            '--from-folder')])
def test_bad_convert_flags_are_one_line(argv, message, tmp_path, capsys):
    assert main(['data', 'convert', '--out', str(tmp_path / 'out')] + argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_converted_folder_trains_on_two_towers(tmp_path, capsys):
    train = _tree(str(tmp_path / 'train'), per_class=3)
    out = str(tmp_path / 'out')
    assert main(['data', 'convert', '--from-folder', train, '--out', out, '--shards', '2',
                 '--workers', '1']) == 0
    capsys.readouterr()
    assert main(['train', '--dataset', 'imagenet:' + out, '--model', 'small_convnet',
                 '--image-size', '32', '--towers', '2', '--devices', 'cpu', '--batch-size', '4',
                 '--steps', '3', '--logdir', str(tmp_path / 'run'), '--eval-every', '0',
                 '--no-tensorboard']) == 0
    out_lines = capsys.readouterr().out.splitlines()
    assert 'dataset imagenet:%s: 9 train, 0 validation, 0 test; model small_convnet' % out \
        in out_lines
    assert tf.train.load_variable(str(tmp_path / 'run'), 'logits/weights').shape[-1] == 3
