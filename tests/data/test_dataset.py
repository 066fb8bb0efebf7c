"""Tests for data/dataset.py: DataSet.next_batch semantics and read_data_sets."""
import numpy as np
import pytest

from towers.data import (
    DataError,
    DataMismatchError,
    DataSet,
    DatasetNotFoundError,
    mnist,
    read_data_sets,
)
from towers.data.idx import write_idx


def _make(num_examples=10, seed=0, **kwargs):
    # Pixel value i identifies example i, so batches can be traced back.
    images = np.broadcast_to(np.arange(num_examples, dtype=np.uint8)[:, None, None],
                             (num_examples, 2, 2)).copy()
    labels = np.arange(num_examples) % 10
    return DataSet(images, labels, seed=seed, **kwargs)


def _ids(images):
    return np.rint(images[:, 0, 0, 0] * 255).astype(int).tolist()


def test_storage_shapes_and_dtypes():
    data = _make(6)
    assert data.images.shape == (6, 2, 2, 1)
    assert data.images.dtype == np.float32
    assert data.images.max() == pytest.approx(5 / 255)
    assert data.labels.dtype == np.int64
    assert data.num_examples == 6
    assert data.epochs_completed == 0
    rgb = DataSet(np.full((2, 3, 3, 3), 255, np.uint8), [0, 1])
    assert rgb.images.shape == (2, 3, 3, 3) and rgb.images.max() == 1.0
    floats = DataSet(np.full((2, 3, 3), 0.5, np.float32), [0, 1])
    assert floats.images.shape == (2, 3, 3, 1) and floats.images.max() == 0.5


def test_one_hot():
    data = DataSet(np.zeros((3, 2, 2), np.uint8), [0, 2, 9], one_hot=True)
    assert data.labels.dtype == np.float32
    assert data.labels.shape == (3, 10)
    assert data.labels.argmax(axis=1).tolist() == [0, 2, 9]
    assert data.labels.sum() == 3
    images, labels = data.next_batch(3)
    assert labels.shape == (3, 10)
    # The one-hot rows are shuffled together with their images.
    np.testing.assert_array_equal(labels, data.labels)


def test_count_mismatch_names_both_counts():
    with pytest.raises(DataError, match='5 images but 4 labels'):
        DataSet(np.zeros((5, 2, 2), np.uint8), np.zeros(4, np.int64))


def test_label_out_of_range():
    with pytest.raises(DataError, match=r'\[0, 10\)'):
        DataSet(np.zeros((2, 2, 2), np.uint8), [0, 10])


@pytest.mark.parametrize('batch_size', [1, 3, 4, 7, 10])
def test_each_example_once_per_epoch(batch_size):
    data = _make(10)
    seen = []
    for _ in range(10 * 3):  # three epochs' worth of examples, batch_size at a time
        images, labels = data.next_batch(batch_size)
        assert images.shape == (batch_size, 2, 2, 1)
        np.testing.assert_array_equal(labels, np.array(_ids(images)) % 10)
        seen.extend(_ids(images))
    seen = seen[:30]
    for epoch in range(3):
        assert sorted(seen[epoch * 10:(epoch + 1) * 10]) == list(range(10))
    assert data.epochs_completed >= 2


def test_epochs_completed_and_boundary_batch():
    data = _make(10)
    data.next_batch(4)
    data.next_batch(4)
    assert data.epochs_completed == 0
    first_epoch = data.images.copy()
    images, _ = data.next_batch(4)  # last 2 of epoch 0 + first 2 of epoch 1
    assert data.epochs_completed == 1
    assert _ids(images)[:2] == _ids(first_epoch[8:])
    assert _ids(images)[2:] == _ids(data.images[:2])


def test_reshuffles_between_epochs():
    data = _make(50)
    orders = []
    for _ in range(3):
        orders.append(_ids(data.next_batch(50)[0]))
    assert sorted(orders[0]) == list(range(50))
    assert orders[0] != list(range(50))
    assert orders[0] != orders[1] != orders[2]


def test_no_shuffle_keeps_order():
    data = _make(10)
    batches = [_ids(data.next_batch(4, shuffle=False)[0]) for _ in range(3)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    assert data.epochs_completed == 1


def test_reproducible_with_seed():
    def run(seed):
        data = _make(20, seed=seed)
        np.random.seed(123)  # the global generator must not matter
        first = [_ids(data.next_batch(7)[0]) for _ in range(6)]
        np.random.seed(456)
        return first
    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize('batch_size', [0, -1, 11])
def test_bad_batch_size(batch_size):
    with pytest.raises(ValueError):
        _make(10).next_batch(batch_size)


def _write_mnist(folder, num_train=12, num_test=5, num_train_labels=None, unpacked=False):
    """Writes tiny MNIST-named IDX files whose pixel (0, 0) is the example index.

    unpacked: write raw files under the names without .gz, as unpacking tools leave them.
    """
    folder.mkdir(parents=True, exist_ok=True)

    def images(n):
        out = np.zeros((n, 28, 28), np.uint8)
        out[:, 0, 0] = np.arange(n)
        return out
    arrays = (images(num_train), np.arange(num_train_labels or num_train, dtype=np.uint8) % 10,
              images(num_test), np.arange(num_test, dtype=np.uint8) % 10)
    for spec, array in zip(mnist.FILES, arrays):
        write_idx(folder / (spec.name[:-len('.gz')] if unpacked else spec.name), array)


def test_read_data_sets_splits_validation_off_the_front(tmp_path):
    _write_mnist(tmp_path)
    sets = read_data_sets(tmp_path, validation_size=3, download=False, seed=0)
    assert (sets.train.num_examples, sets.validation.num_examples, sets.test.num_examples) \
        == (9, 3, 5)
    assert sorted(_ids(sets.validation.images)) == [0, 1, 2]
    assert sorted(_ids(sets.train.images)) == list(range(3, 12))
    assert sets.train.images.shape[1:] == (28, 28, 1)
    assert sets.train.labels.dtype == np.int64


def test_read_data_sets_reads_unpacked_files(tmp_path):
    _write_mnist(tmp_path, unpacked=True)
    sets = read_data_sets(tmp_path, validation_size=3, download=False, seed=0)
    assert (sets.train.num_examples, sets.validation.num_examples, sets.test.num_examples) \
        == (9, 3, 5)
    assert sorted(_ids(sets.train.images)) == list(range(3, 12))


def test_read_data_sets_empty_validation_and_one_hot(tmp_path):
    _write_mnist(tmp_path)
    sets = read_data_sets(tmp_path, validation_size=0, one_hot=True, download=False)
    assert sets.validation.num_examples == 0
    assert sets.validation.images.shape == (0, 28, 28, 1)
    assert sets.train.labels.shape == (12, 10)


@pytest.mark.parametrize('validation_size', [-1, 13])
def test_read_data_sets_bad_validation_size(tmp_path, validation_size):
    _write_mnist(tmp_path)
    with pytest.raises(ValueError, match=r'\[0, 12\]'):
        read_data_sets(tmp_path, validation_size=validation_size, download=False)


def test_read_data_sets_count_mismatch_names_both_files(tmp_path):
    _write_mnist(tmp_path, num_train=12, num_train_labels=11)
    with pytest.raises(DataMismatchError) as info:
        read_data_sets(tmp_path, validation_size=0, download=False)
    assert str(info.value) == (
        f'{tmp_path}/train-images-idx3-ubyte.gz holds 12 images but train-labels-idx1-ubyte.gz '
        'holds 11 labels: one of them is from another dataset or corrupt, replace it with the '
        'real file')


def test_read_data_sets_missing_files_without_download(tmp_path):
    _write_mnist(tmp_path)
    (tmp_path / 't10k-labels-idx1-ubyte.gz').unlink()
    (tmp_path / 'train-images-idx3-ubyte.gz').unlink()
    with pytest.raises(DatasetNotFoundError) as info:
        read_data_sets(tmp_path, download=False)
    message = str(info.value)
    assert 'train-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz' in message
    assert 'train-labels' not in message and 't10k-images' not in message
    assert str(tmp_path) in message
    assert 'or uncompressed without .gz (e.g. train-images-idx3-ubyte)' in message
