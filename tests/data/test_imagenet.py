"""ImageNet-format shards: finding and counting them, tf_cnn_benchmarks' preprocessing, and
crops seeded per example so that a run and its resume see the same images."""
import contextlib
import io
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from towers.data import image_records, imagenet
from towers.data.errors import DataError

tf1 = tf.compat.v1


def _jpeg(height, width, seed):
    """A JPEG of a smooth random picture (so that crops and resizes are visible)."""
    rng = np.random.RandomState(seed)
    small = rng.randint(0, 256, (4, 4, 3)).astype(np.float32)
    picture = tf.image.resize(small, [height, width]).numpy()
    return tf.io.encode_jpeg(tf.cast(picture, tf.uint8), quality=95).numpy()


def _write_shards(folder, split, sizes, boxes=((0.2, 0.3, 0.7, 0.9),)):
    """Shards of records labelled 1.. in order: shard k holds sizes[k] records."""
    label = 0
    for index, count in enumerate(sizes):
        path = os.path.join(folder, '%s-%05d-of-%05d' % (split, index, len(sizes)))
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(count):
                label += 1
                height, width = 60 + 7 * (label % 25), 90 - 3 * (label % 25)
                writer.write(imagenet.make_example(_jpeg(height, width, label), label, height,
                                                   width, boxes))


def test_shards_are_found_in_order_and_counted(tmp_path):
    _write_shards(str(tmp_path), 'train', [3, 2, 4])
    files = imagenet.shard_files(str(tmp_path), 'train')
    assert [os.path.basename(f) for f in files] == ['train-%05d-of-00003' % i for i in range(3)]
    assert [imagenet.count_records(f) for f in files] == [3, 2, 4]


def test_missing_and_truncated_shards_are_one_line_each(tmp_path):
    folder = str(tmp_path)
    with pytest.raises(DataError, match='has no validation shards'):
        imagenet.shard_files(folder, 'validation')
    _write_shards(folder, 'train', [2, 2, 2])
    os.unlink(os.path.join(folder, 'train-00001-of-00003'))
    with pytest.raises(DataError, match=r'lacks 1 of its 3 train shards, e\.g\. '
                                        r'train-00001-of-00003$'):
        imagenet.shard_files(folder, 'train')
    path = os.path.join(folder, 'train-00002-of-00003')
    with open(path, 'rb+') as f:
        f.truncate(os.path.getsize(path) - 10)
    with pytest.raises(DataError, match=r'train-00002-of-00003 is truncated in record 1 '):
        imagenet.count_records(path)


def _read(make_dataset, count):
    with tf.Graph().as_default():
        batch = tf1.data.make_one_shot_iterator(make_dataset().take(count)).get_next()
        with tf1.Session() as sess:
            return [sess.run(batch) for _ in range(count)]


def test_the_training_view_is_a_seeded_crop_and_the_labels_start_at_zero(tmp_path):
    _write_shards(str(tmp_path), 'train', [4, 4])
    files = imagenet.shard_files(str(tmp_path), 'train')

    def view(seed, parallel=8):
        return _read(lambda: image_records.examples(files, 32, training=True, seed=seed,
                                                    cycle_length=parallel,
                                                    augment='inception'), 8)
    first, again, other = view(1), view(1), view(2)
    assert all(image.shape == (32, 32, 3) and image.dtype == np.uint8 for image, _ in first)
    assert sorted(int(label) for _, label in first) == list(range(8))  # 1..8, less one
    for (a, label_a), (b, label_b) in zip(first, again):
        np.testing.assert_array_equal(a, b)
        assert label_a == label_b
    assert any(not np.array_equal(a, b) for (a, _), (b, _) in zip(first, other))


def test_a_resume_skips_to_the_same_crops(tmp_path):
    _write_shards(str(tmp_path), 'train', [5, 5])
    files = imagenet.shard_files(str(tmp_path), 'train')
    def crops(skip, count):  # (the default at 24 would be pad-crop-flip)
        return _read(lambda: image_records.examples(files, 24, training=True, seed=3,
                                                    augment='inception').skip(skip), count)
    whole, resumed = crops(0, 10), crops(6, 4)
    for (a, label_a), (b, label_b) in zip(whole[6:], resumed):
        np.testing.assert_array_equal(a, b)
        assert label_a == label_b


def test_the_evaluation_view_resizes_the_short_side_and_cuts_the_centre(tmp_path):
    jpeg = _jpeg(100, 150, seed=7)
    with tf.Graph().as_default(), tf1.Session() as sess:
        got = sess.run(imagenet.eval_image(tf.constant(jpeg), 64))
    decoded = tf.io.decode_jpeg(jpeg, channels=3)
    # round(64 * 1.145) = 73 on the short side: 100x150 -> 73x110, the centre 64x64.
    resized = tf.image.resize(decoded, [73, 110], method='bilinear')
    expected = tf.cast(tf.clip_by_value(tf.round(resized[4:68, 23:87, :]), 0, 255), tf.uint8)
    np.testing.assert_array_equal(got, expected.numpy())


def test_the_training_crop_is_a_window_of_the_decoded_jpeg():
    """decode_and_crop_jpeg: the crop the fused op decodes is the window of the whole image."""
    jpeg = _jpeg(80, 120, seed=5)
    with tf.Graph().as_default(), tf1.Session() as sess:
        boxes = tf.constant([[[0.1, 0.2, 0.6, 0.9]]])
        seed = tf.constant([4, 11], tf.int64)
        seeds = tf.random.experimental.stateless_split(seed, 2)
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(jpeg), boxes, seed=seeds[0], min_object_covered=0.1,
            aspect_ratio_range=[0.75, 1.33], area_range=[0.05, 1.0], max_attempts=100,
            use_image_if_no_bounding_boxes=True)
        cut = tf.io.decode_jpeg(jpeg, channels=3)[begin[0]:begin[0] + size[0],
                                                   begin[1]:begin[1] + size[1], :]
        image = tf.image.resize(cut, [16, 16], method='bilinear')
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
        expected = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        got, want, (height, width) = sess.run(
            [imagenet.train_image(tf.constant(jpeg), boxes, 16, seed), expected, size[:2]])
    assert 0.05 * 80 * 120 <= height * width and 0.7 <= width / height <= 1.4
    np.testing.assert_array_equal(got, want)


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    """An imagenet folder of 13 train and 3 validation images, which the runs only read."""
    folder = str(tmp_path_factory.mktemp('imagenet'))
    _write_shards(folder, 'train', [7, 6])
    _write_shards(folder, 'validation', [3])
    return folder


def _checkpoint(logdir):
    return {name: tf.train.load_variable(logdir, name)
            for name, _ in tf1.train.list_variables(logdir)}


def _train(folder, logdir, steps, eval_every=0):
    """`towers train` in this process: its output lines."""
    from towers.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # (a module fixture's run has no capsys)
        assert main(['train', '--dataset', 'imagenet:' + folder, '--model', 'small_convnet',
                     '--image-size', '32', '--towers', '2', '--devices', 'cpu', '--batch-size',
                     '4', '--steps', str(steps), '--logdir', logdir, '--eval-every',
                     str(eval_every), '--log-every', '100', '--seed', '5', '--no-tensorboard',
                     '--optimizer', 'momentum']) == 0
    return out.getvalue().splitlines()


@pytest.mark.exact
def test_training_on_an_imagenet_folder_streams_the_crops_and_resumes_exactly(tmp_path, folder):
    straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
    # Past the first epoch (13 images, 4 a step: 4 steps, the last of 1) in the resumed run
    # too, evaluating the validation split each epoch (which the resumed runs do not:
    # evaluation changes nothing of the training).
    lines = _train(folder, straight, 5, eval_every=1)
    assert 'dataset imagenet:%s: 13 train, 0 validation, 3 test; model small_convnet' % folder \
        in lines
    assert 'augment: pad-crop-flip (the default for 32x32x3 images; evaluation: centre)' in lines
    assert 'dataset imagenet:%s: 13 train, 0 validation, 0 test; model small_convnet' % folder \
        in _train(folder, resumed, 3)
    lines = _train(folder, resumed, 5)
    assert any(line.startswith('resumed from') for line in lines)
    expected, actual = _checkpoint(straight), _checkpoint(resumed)
    assert expected.keys() == actual.keys() and expected['global_step'] == 5
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


# Less than the validation split's 3 images at 32x32 take as float32 (36,864 bytes): streamed.
TOO_SMALL = 10_000


@pytest.fixture(scope='module')
def streamed_run(folder, tmp_path_factory):
    """A 2-step run that evaluated its validation split streamed, as one too big to hold:
    (its logdir, its 'test: ' lines). The evals below only read it."""
    logdir = str(tmp_path_factory.mktemp('streamed') / 'run')
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr('towers.cli.train.EVAL_MEMORY', TOO_SMALL)
        lines = _train(folder, logdir, 2, eval_every=1)
    return logdir, [line for line in lines if line.startswith('test: ')]


def test_a_validation_split_too_big_to_hold_is_streamed_to_the_same_numbers(streamed_run, capsys,
                                                                           monkeypatch):
    from towers.cli import main
    # Training evaluates a streamed split too: one run, whose weights both evals read.
    logdir, trained = streamed_run
    with monkeypatch.context() as patch:
        patch.setattr('towers.cli.train.EVAL_MEMORY', TOO_SMALL)
        assert main(['eval', '--logdir', logdir, '--batch-size', '2', '--devices', 'cpu']) == 0
        streamed = capsys.readouterr().out.splitlines()[-1]
    assert main(['eval', '--logdir', logdir, '--batch-size', '2', '--devices', 'cpu']) == 0
    held = capsys.readouterr().out.splitlines()[-1]
    assert held.startswith('test: loss ') and held.endswith('(3 images)') and streamed == held
    # ... to the numbers towers eval gives.
    assert trained == [held]


def _write_bad_shard(folder, split='train', total=2, index=1):
    """Shard `index` of `total`: 6 records, of which record 1 is not a JPEG, record 3 is
    labelled 0, record 4 has no image/encoded, and record 5 is not a tf.train.Example."""
    path = os.path.join(folder, '%s-%05d-of-%05d' % (split, index, total))
    no_image = tf.train.Example(features=tf.train.Features(feature={
        'image/class/label': tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))}))
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(imagenet.make_example(_jpeg(40, 50, 1), 1, 40, 50))
        writer.write(imagenet.make_example(b'\xff\xd8not a jpeg at all', 2, 40, 50))
        writer.write(imagenet.make_example(_jpeg(40, 50, 2), 3, 40, 50))
        writer.write(imagenet.make_example(_jpeg(40, 50, 3), 0, 40, 50))
        writer.write(no_image.SerializeToString())
        writer.write(b'\x01\x02 neither')
    return path


def _drain(dataset):
    from towers.data.pipeline import drain
    return drain(lambda: dataset().batch(100))


def test_a_bad_record_stops_the_read_naming_its_shard_and_index(tmp_path):
    path = _write_bad_shard(str(tmp_path), total=1, index=0)
    with pytest.raises(tf.errors.InvalidArgumentError) as failure:
        _drain(lambda: image_records.examples([path], 16, training=False))
    from towers.data.errors import bad_record
    assert bad_record(failure.value.message) == (
        '%s record 1: not a tf.train.Example whose image/encoded is a decodable JPEG' % path)


@pytest.mark.parametrize('training', [True, False])
def test_skipping_bad_records_keeps_the_good_ones_and_names_each_bad_one(tmp_path, capfd,
                                                                         training):
    path = _write_bad_shard(str(tmp_path), total=1, index=0)
    (images, labels), = _drain(lambda: image_records.examples(
        [path], 16, training=training, num_classes=5, skip_bad=True, shuffle_buffer=1))
    assert images.shape == (2, 16, 16, 3) and list(labels) == [0, 2]
    skipped = [line for line in capfd.readouterr().err.splitlines()
               if line.startswith('skipped ')]
    decodable = 'not a tf.train.Example whose image/encoded is a decodable JPEG'
    assert skipped == ['skipped %s record 1: %s' % (path, decodable),
                       'skipped %s record 3: label 0 is not in 1..5' % path,
                       'skipped %s record 4: %s' % (path, decodable),
                       'skipped %s record 5: %s' % (path, decodable)]


def test_a_label_beyond_the_classes_is_a_bad_record(tmp_path):
    _write_shards(str(tmp_path), 'train', [4])
    files = imagenet.shard_files(str(tmp_path), 'train')
    with pytest.raises(tf.errors.InvalidArgumentError, match=r'record 3: label 4 is not in '
                                                             r'1\.\.3\]'):
        _drain(lambda: image_records.examples(files, 16, training=False, num_classes=3))


def test_bad_records_in_many_chunks_are_each_placed_and_counted(tmp_path):
    """Rows decoded around the bad ones keep their place, chunk after chunk."""
    folder = str(tmp_path)
    _write_shards(folder, 'train', [40])
    _write_bad_shard(folder, total=2, index=1)
    os.rename(os.path.join(folder, 'train-00000-of-00001'),
              os.path.join(folder, 'train-00000-of-00002'))
    files = imagenet.shard_files(folder, 'train')
    plain = _drain(lambda: image_records.examples(files[:1], 16, training=False))
    (images, labels), = _drain(lambda: image_records.examples(files, 16, training=False,
                                                          skip_bad=True, cycle_length=1))
    assert len(labels) == 42 and list(labels[40:]) == [0, 2]
    np.testing.assert_array_equal(images[:40], plain[0][0])


def test_a_shard_cut_short_is_skipped_and_listed_when_asked(tmp_path):
    folder = str(tmp_path)
    _write_shards(folder, 'train', [3, 3])
    path = os.path.join(folder, 'train-00001-of-00002')
    with open(path, 'rb+') as f:
        f.truncate(os.path.getsize(path) - 10)
    with pytest.raises(DataError, match=r'train-00001-of-00002 is truncated in record 2 .*; '
                                        r'give --skip-bad-shards to train without it$'):
        image_records.ImageNetSet(folder, 'train', 16)
    kept = image_records.ImageNetSet(folder, 'train', 16, skip_bad_shards=True)
    assert kept.num_examples == 3 and [s[:2] for s in kept.skipped] == [
        ('train-00001-of-00002', 2)]


def _train_lines(folder, tmp_path, capsys, *flags):
    from towers.cli import main
    code = main(['train', '--dataset', 'imagenet:' + folder, '--model', 'small_convnet',
                 '--image-size', '16', '--towers', '2', '--devices', 'cpu', '--batch-size', '4',
                 '--steps', '4', '--logdir', str(tmp_path / 'run'), '--eval-every', '0',
                 '--log-every', '100', '--no-tensorboard'] + list(flags))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.strip().splitlines()


def test_training_stops_on_a_bad_jpeg_in_one_line_or_skips_it_when_asked(tmp_path, capsys):
    folder = str(tmp_path / 'imagenet')
    os.makedirs(folder)
    _write_shards(folder, 'train', [6])
    os.rename(os.path.join(folder, 'train-00000-of-00001'),
              os.path.join(folder, 'train-00000-of-00002'))
    path = _write_bad_shard(folder)
    code, _, err = _train_lines(folder, tmp_path, capsys)
    assert code == 1
    # The records are shuffled: the first bad one read is one of the three undecodable.
    assert len(err) == 1 and re.fullmatch(
        r'towers: error: bad input record at step 0: %s record [145]: not a tf.train.Example '
        r'whose image/encoded is a decodable JPEG; give --skip-bad-images to train without it'
        % re.escape(path), err[0]), err
    code, out, _ = _train_lines(folder, tmp_path, capsys, '--skip-bad-images')
    assert code == 0
    # 12 records a pass, 4 of them bad; each pass (reading runs ahead) drops them again.
    counts = [re.match(r'cleaning dropped (\d+) of the (\d+) records read', line)
              for line in out]
    (dropped, read), = [tuple(map(int, c.groups())) for c in counts if c]
    assert read % 12 == 0 and read >= 24 and dropped == read // 3


def test_eval_reads_the_validation_split_at_the_evaluation_view(streamed_run, capsys):
    from towers.cli import main
    logdir, _ = streamed_run  # weights to evaluate (this eval holds the split: EVAL_MEMORY as is)
    assert main(['eval', '--logdir', logdir, '--devices', 'cpu']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith('test: ') and lines[-1].endswith('(3 images)'), lines


@contextlib.contextmanager
def _pipeline(image_set, batch_size=4, parts=None):
    """batches(start, count): `count` batches of an epoch pipeline started at batch `start`,
    each call a new start of it (its iterator and counts initialised anew), as a resumed run
    starts it with its step fed. One graph and Session for every start: building them is
    most of a read's cost."""
    from towers.data import pipeline
    with tf.Graph().as_default():
        start, count = tf1.placeholder(tf.int64, []), tf1.placeholder(tf.int64, [])
        epoch_source, records = image_set.epoch_source(image_set.input_shape)
        dataset, _ = pipeline.epoch_pipeline(epoch_source, records, image_set.input_shape,
                                             image_set.num_classes, batch_size, start=start,
                                             parts=parts)
        iterator = tf1.data.make_initializable_iterator(dataset.take(count))
        batch = iterator.get_next()
        init = [iterator.initializer, tf1.local_variables_initializer()]
        with tf1.Session() as sess:
            def batches(first, num):
                sess.run(init, {start: first, count: num})
                return [sess.run(batch) for _ in range(num)]
            yield batches


def test_an_epoch_pipeline_started_at_a_batch_gives_the_batches_from_there(tmp_path):
    _write_shards(str(tmp_path), 'train', [6, 5])
    image_set = image_records.ImageNetSet(str(tmp_path), 'train', 16, seed=4, shuffle_buffer=5)
    with _pipeline(image_set) as batches:
        whole = batches(0, 8)  # 11 records: 3 batches an epoch (4, 4, 3)
        assert [len(labels) for _, labels in whole] == [4, 4, 3] * 2 + [4, 4]
        assert sorted(np.concatenate([labels for _, labels in whole[3:6]])) == list(range(11))
        for start in (2, 3, 5):
            for (a, label_a), (b, label_b) in zip(whole[start:], batches(start, 3)):
                np.testing.assert_array_equal(a, b)
                np.testing.assert_array_equal(label_a, label_b)
    assert not np.array_equal(whole[0][1], whole[3][1])  # each epoch shuffled anew


def test_each_epoch_crops_the_same_record_anew(tmp_path):
    _write_shards(str(tmp_path), 'train', [8])
    image_set = image_records.ImageNetSet(str(tmp_path), 'train', 16, seed=2, shuffle_buffer=1)
    with _pipeline(image_set) as batches:
        epoch_0, epoch_1 = (np.concatenate([images for images, _ in pair]) for pair in (
            batches(0, 2), batches(2, 2)))  # records 0..7 in file order
    assert all(not np.array_equal(a, b) for a, b in zip(epoch_0, epoch_1))


def test_a_resumed_pipeline_never_decodes_the_records_it_passes_over(tmp_path):
    path = str(tmp_path / 'train-00000-of-00001')
    with tf.io.TFRecordWriter(path) as writer:
        for index in range(6):  # record 1 does not decode
            jpeg = b'\xff\xd8 no JPEG' if index == 1 else _jpeg(40, 50, index)
            writer.write(imagenet.make_example(jpeg, index + 1, 40, 50))
    image_set = image_records.ImageNetSet(str(tmp_path), 'train', 16, shuffle_buffer=1)
    with _pipeline(image_set, batch_size=2) as batches:
        with pytest.raises(tf.errors.InvalidArgumentError, match=r'00001 record 1: not a '):
            batches(0, 1)
        # Batch 1 onwards: records 0 and 1 passed over unread, until the next epoch reads them.
        assert [list(labels) for _, labels in batches(1, 2)] == [[2, 3], [4, 5]]
        with pytest.raises(tf.errors.InvalidArgumentError, match=r'00001 record 1: not a '):
            batches(1, 3)


def test_a_task_decodes_only_the_rows_its_towers_train_on(tmp_path):
    """Two workers of one tower each: worker k keeps part k of each batch cut in two, plus
    the batch's last row (split_batch's stand-in for an empty part); the rest is zeros."""
    _write_shards(str(tmp_path), 'train', [6, 5])
    image_set = image_records.ImageNetSet(str(tmp_path), 'train', 16, seed=4, shuffle_buffer=5)
    with _pipeline(image_set) as batches:
        whole = batches(1, 4)  # batches of 4, 3 (the epoch's last), 4, 4
    for worker, rows in ((0, {4: [0, 1, 3], 3: [0, 1, 2]}), (1, {4: [2, 3], 3: [2]})):
        with _pipeline(image_set, parts=(worker, worker + 1, 2)) as batches:
            theirs = batches(1, 4)
        for (images, labels), (mine, my_labels) in zip(whole, theirs):
            kept = rows[len(labels)]
            np.testing.assert_array_equal(mine[kept], images[kept])
            np.testing.assert_array_equal(my_labels[kept], labels[kept])
            others = [r for r in range(len(labels)) if r not in kept]
            assert not mine[others].any() and not my_labels[others].any()
