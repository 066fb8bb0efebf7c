"""The named augmentations on tiny known images, the default rule, and their seeding: the same
(seed, step, row) or (seed, example number) gives the same pixels, wherever it is drawn."""
import numpy as np
import pytest
import tensorflow as tf

from towers.data import augment, imagenet, records
from towers.data.pipeline import array_source, make_pipeline

tf1 = tf.compat.v1


def _run(tensors):
    with tf1.Session() as sess:
        return sess.run(tensors)


def _numbered(count, shape=(6, 5, 1)):
    """uint8 images whose pixels are 1.. in row-major order, image k's offset by 30 k."""
    size = int(np.prod(shape))
    return (np.arange(count * size).reshape((count,) + shape) % 250 + 1).astype(np.uint8)


def _candidates(image, pad=4):
    """Every pad-crop-flip of image [H, W, C]: each shift of it in 4 pixels of zeros, each
    flipped or not."""
    height, width = image.shape[:2]
    padded = np.pad(image, [(pad, pad), (pad, pad), (0, 0)])
    crops = [padded[top:top + height, left:left + width]
             for top in range(2 * pad + 1) for left in range(2 * pad + 1)]
    return crops + [crop[:, ::-1] for crop in crops]


@pytest.mark.parametrize('shape, expected', [
    ((28, 28, 1), 'center'), ((64, 64, 1), 'center'), ((28, 28, 3), 'pad-crop-flip'),
    ((32, 32, 3), 'pad-crop-flip'), ((48, 48, 3), 'pad-crop-flip'),
    ((127, 200, 3), 'pad-crop-flip'), ((128, 128, 3), 'inception'),
    ((224, 224, 3), 'inception'), ((299, 299, 1), 'inception')])
def test_the_default_follows_the_side_then_the_channels(shape, expected):
    assert augment.default_for(shape) == expected


def test_the_first_line_says_the_augmentation_and_whether_it_was_the_default():
    assert augment.choose(None, (28, 28, 3)).line() == (
        'augment: pad-crop-flip (the default for 28x28x3 images; evaluation: centre)')
    assert augment.choose(None, (28, 28, 1)).line() == (
        'augment: center (the default for 28x28x1 images; evaluation: centre)')
    assert augment.choose('inception', (28, 28, 1)).line() == (
        'augment: inception (as asked; evaluation: centre)')
    # imagenet-synthetic's noise: nothing to vary, and a benchmark's host stays free.
    assert augment.choose(None, augment.RANDOM).line() == (
        'augment: center (the default for random images; evaluation: centre)')
    assert augment.choose('inception', augment.RANDOM).name == 'inception'
    with pytest.raises(ValueError, match=r"unknown augmentation 'crop'; choose one of: "
                                         r'inception, pad-crop-flip, center$'):
        augment.as_augmentation('crop')


def test_pad_crop_flip_moves_the_image_in_zeros_and_flips_it_as_drawn():
    images = _numbered(3)
    draws = [[0.0, 0.0, 0.9],     # 4 down, 4 right: only the top-left corner
             [4 / 9, 4 / 9, 0.1],  # unshifted, flipped
             [0.99, 0.5, 0.7]]     # 4 up, unshifted across
    with tf.Graph().as_default():
        out = _run(augment.pad_crop_flip(tf.constant(images), tf.constant(draws)))
    assert out.dtype == np.uint8 and out.shape == images.shape
    expected = np.zeros_like(images[0])
    expected[4:, 4:] = images[0][:2, :1]
    np.testing.assert_array_equal(out[0], expected)
    np.testing.assert_array_equal(out[1], images[1][:, ::-1])
    expected = np.zeros_like(images[2])
    expected[:2] = images[2][4:]
    np.testing.assert_array_equal(out[2], expected)


def test_pad_crop_flip_draws_every_shift_and_flips_half():
    image = _numbered(1, (6, 5, 3))[0]
    with tf.Graph().as_default():
        out = _run(augment.augment_batch(tf.constant(np.stack([image] * 400)), 'pad-crop-flip',
                                         seed=7, step=3))
    candidates = _candidates(image)
    found = [next(k for k, c in enumerate(candidates) if np.array_equal(c, o)) for o in out]
    assert len(set(k % 81 for k in found)) >= 75  # (of the 81 shifts, 400 draws)
    assert 0.4 < np.mean([k >= 81 for k in found]) < 0.6


def test_center_is_the_image_as_it_is():
    with tf.Graph().as_default():
        images = tf.constant(_numbered(2))
        assert augment.augment_batch(images, 'center', 1, 2) is images
        assert augment.augment_image(images[0], 'center', tf.constant([1, 2])) is images[0] \
            or np.array_equal(_run(augment.augment_image(images[0], 'center',
                                                         tf.constant([1, 2]))), _numbered(1)[0])


@pytest.mark.parametrize('dtype', [np.uint8, np.float32])
def test_inception_crops_a_box_and_resizes_it_back_to_the_size(dtype):
    across = np.linspace(0, 250, 40)  # a ramp: each crop's ends say where its box was
    images = np.tile(across[None, None, :, None], (8, 32, 1, 3)).astype(dtype)
    with tf.Graph().as_default():
        out = _run(augment.augment_batch(tf.constant(images), 'inception', seed=1, step=0))
    assert out.shape == images.shape and out.dtype == dtype
    assert len({(float(o[0, 0, 0]), float(o[0, -1, 0])) for o in out}) == 8  # boxes differ
    assert any(o[0, 0, 0] > o[0, -1, 0] for o in out)  # some flipped
    assert all(np.ptp(o[:, 5, 0]) <= 1 for o in out)  # whole columns: only resized


def test_the_same_seed_and_step_draw_the_same_and_a_share_draws_its_rows_of_the_batch():
    for name in ('pad-crop-flip', 'inception'):
        with tf.Graph().as_default():
            images = tf.constant(_numbered(6, (8, 8, 3)))
            whole, again, other_step, other_seed = _run([
                augment.augment_batch(images, name, 5, 2),
                augment.augment_batch(images, name, 5, 2),
                augment.augment_batch(images, name, 5, 3),
                augment.augment_batch(images, name, 6, 2)])
            rows = _run(augment.augment_batch(images[2:5], name, 5, 2, first=2, total=6))
        np.testing.assert_array_equal(again, whole)
        np.testing.assert_array_equal(rows, whole[2:5])
        assert not np.array_equal(other_step, whole) and not np.array_equal(other_seed, whole)


def _jpeg(height, width):
    small = np.random.RandomState(3).randint(0, 256, (4, 4, 3)).astype(np.float32)
    picture = tf.cast(tf.image.resize(small, [height, width]), tf.uint8)
    return tf.io.encode_jpeg(picture).numpy()


def test_a_jpeg_of_any_size_takes_the_crop_or_the_evaluation_view_by_name():
    jpeg = _jpeg(30, 44)
    with tf.Graph().as_default():
        seed, boxes = tf.constant([4, 9], tf.int64), tf.zeros([1, 0, 4])
        view = imagenet.eval_image(tf.constant(jpeg), 16)
        got = _run({name: augment.jpeg_view(tf.constant(jpeg), boxes, 16, name, seed)
                    for name in augment.AUGMENTATIONS})
        inception, centre, shifted = _run([
            imagenet.train_image(tf.constant(jpeg), boxes, 16, seed), view,
            augment.pad_crop_flip(view[None], tf.random.stateless_uniform([1, 3], seed))[0]])
    np.testing.assert_array_equal(got['inception'], inception)
    np.testing.assert_array_equal(got['center'], centre)
    np.testing.assert_array_equal(got['pad-crop-flip'], shifted)
    assert any(np.array_equal(shifted, c) for c in _candidates(centre))


def _batches(pipeline_of, count):
    with tf.Graph().as_default():
        dataset, feed = pipeline_of()
        iterator = tf1.data.make_initializable_iterator(dataset.take(count))
        batch = iterator.get_next()
        with tf1.Session() as sess:
            sess.run([iterator.initializer, tf1.local_variables_initializer()], feed)
            return [sess.run(batch) for _ in range(count)]


def test_a_resumed_pipeline_augments_each_step_as_the_uninterrupted_one():
    images, labels = _numbered(10, (6, 5, 3)), np.arange(10) % 3

    def pipeline_of(start, name='pad-crop-flip'):
        def make():
            source, feed = array_source(images, labels, (6, 5, 3))
            dataset, _ = make_pipeline(source, (6, 5, 3), 3, 4, augment=name, seed=2,
                                       start=tf.constant(start, tf.int64), finish=False)
            return dataset, feed
        return make
    whole = _batches(pipeline_of(0), 6)  # 3 batches an epoch: 4, 4, 2
    assert [len(labels) for _, labels in whole] == [4, 4, 2] * 2
    for (a, labels_a), (b, labels_b) in zip(whole[4:], _batches(pipeline_of(4), 2)):
        np.testing.assert_array_equal(b, a)
        np.testing.assert_array_equal(labels_b, labels_a)
    plain = _batches(pipeline_of(0, 'center'), 6)
    for (pixels, _), (centred, _) in zip(whole, plain):  # the same order, each image moved
        assert pixels.dtype == np.uint8
        for row, centre in zip(pixels, centred):
            assert any(np.array_equal(row.reshape(6, 5, 3), c)
                       for c in _candidates(centre.reshape(6, 5, 3)))
    assert not all(np.array_equal(a, b) for (a, _), (b, _) in zip(whole, plain))


def test_records_of_a_fixed_size_are_augmented_on_their_number_in_the_run(tmp_path):
    """tfds:DIR of 8x8x3 PNGs: an epoch started at its batch, as a resume starts it, gives the
    crops the uninterrupted run gave, each a pad-crop-flip of the stored image."""
    from tests.data.test_tfds import _digits, _write
    from towers.data import tfds
    stored = _digits(10, 0, shape=(8, 8, 3))
    folder = _write(str(tmp_path), {'train': [stored]}, shape=(8, 8, 3))
    image_set = tfds.image_set(folder, 'train', None, seed=4, shuffle_buffer=1)

    def pipeline_of(start, name='pad-crop-flip'):
        def make():
            from towers.data.pipeline import epoch_pipeline
            epoch_source, count = image_set.epoch_source((8, 8, 3), augment=name)
            dataset, _ = epoch_pipeline(epoch_source, count, (8, 8, 3), 3, 4, finish=False,
                                        start=tf.constant(start, tf.int64))
            return dataset, {}
        return make
    whole = _batches(pipeline_of(0), 6)  # 3 batches an epoch, in file order
    for (a, _), (b, _) in zip(whole[4:], _batches(pipeline_of(4), 2)):
        np.testing.assert_array_equal(b, a)
    rows = np.concatenate([pixels for pixels, _ in whole]).reshape(-1, 8, 8, 3)
    for k, row in enumerate(rows):
        assert any(np.array_equal(row, c) for c in _candidates(stored[k % 10][0]))
    assert not np.array_equal(rows[:10], rows[10:])  # each epoch augments anew
    centred = np.concatenate([p for p, _ in _batches(pipeline_of(0, 'center'), 3)])
    np.testing.assert_array_equal(centred.reshape(-1, 8, 8, 3), [s[0] for s in stored])


def test_records_on_disk_are_augmented_as_bytes_in_the_pipeline(tmp_path):
    images = _numbered(8, (6, 5, 3))
    records.write_records({'train': (images, np.zeros(8, np.int64))}, str(tmp_path), 2, 't', 3)
    record_set = records.RecordSet(str(tmp_path), 'train')

    def make():
        source, feed = record_set.source((6, 5, 3))
        dataset, _ = make_pipeline(source, (6, 5, 3), 3, 8, augment='pad-crop-flip', seed=1,
                                   shuffle_buffer=0, finish=False)
        return dataset, feed
    (pixels, _), = _batches(make, 1)
    assert pixels.dtype == np.uint8
    for row in pixels.reshape(-1, 6, 5, 3):  # (the shards interleaved: any image's)
        assert any(any(np.array_equal(row, c) for c in _candidates(image)) for image in images)
