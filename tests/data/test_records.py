"""Sharded records: exact round trip, worker shares, corrupt shards, flat memory."""
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from towers.data import DataError, DataMismatchError, records
from towers.data.download import sha256_of_file
from towers.data.pipeline import make_pipeline

tf1 = tf.compat.v1

SHAPE = (6, 5, 3)


def _splits(num_train=23, num_test=7, seed=0):
    rng = np.random.RandomState(seed)
    make = lambda n: (rng.randint(0, 256, (n,) + SHAPE).astype(np.uint8),  # noqa: E731
                      rng.randint(0, 10, n))
    return {'train': make(num_train), 'test': make(num_test)}


def _sorted_rows(images, labels):
    return sorted(zip(map(bytes, images.reshape(len(images), -1)), labels.tolist()))


def test_convert_then_read_round_trip_is_exact(tmp_path):
    splits = _splits()
    manifest = records.write_records(splits, str(tmp_path), 4, 'tiny', 10)
    assert [s['records'] for s in manifest['splits']['train']['shards']] == [6, 6, 6, 5]
    assert manifest['splits']['test']['records'] == 7
    on_disk = json.loads((tmp_path / 'manifest.json').read_text())
    assert on_disk == manifest
    for split, (images, labels) in splits.items():
        record_set = records.RecordSet(str(tmp_path), split)
        assert record_set.input_shape == SHAPE and record_set.num_examples == len(labels)
        read_images, read_labels = records.read_all(record_set, SHAPE)
        assert read_images.dtype == np.uint8
        assert _sorted_rows(read_images, read_labels) == _sorted_rows(images, labels)


def test_workers_read_disjoint_shares_that_cover_everything(tmp_path):
    images, labels = _splits(num_train=40)['train']
    records.write_records({'train': (images, labels)}, str(tmp_path), 5, 'tiny', 10)
    shares = [records.RecordSet(str(tmp_path), 'train', num_workers=2, worker_index=i)
              for i in range(2)]
    assert [len(s.files) for s in shares] == [3, 2]
    rows = [_sorted_rows(*records.read_all(s, SHAPE)) for s in shares]
    assert not set(rows[0]) & set(rows[1])
    assert sorted(rows[0] + rows[1]) == _sorted_rows(images, labels)
    with pytest.raises(DataError, match=r'worker index 2 is not in \[0, 2\)'):
        records.RecordSet(str(tmp_path), 'train', num_workers=2, worker_index=2)


def test_a_corrupt_shard_is_named_or_skipped_and_counted(tmp_path):
    records.write_records(_splits(), str(tmp_path), 4, 'tiny', 10)
    shard = tmp_path / 'train-00002-of-00004.tfrecord'
    blob = bytearray(shard.read_bytes())
    blob[40] ^= 0xFF
    shard.write_bytes(bytes(blob))
    with pytest.raises(DataError, match='shard .*train-00002-of-00004.tfrecord is corrupt'):
        records.RecordSet(str(tmp_path), 'train')
    kept = records.RecordSet(str(tmp_path), 'train', skip_bad_shards=True)
    assert kept.num_examples == 23 - 6 and len(kept.files) == 3
    assert [(name, count) for name, count, _ in kept.skipped] == [
        ('train-00002-of-00004.tfrecord', 6)]


def test_a_truncated_shard_is_named(tmp_path):
    records.write_records(_splits(), str(tmp_path), 2, 'tiny', 10)
    shard = tmp_path / 'test-00001-of-00002.tfrecord'
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DataError, match='test-00001-of-00002.tfrecord is .* bytes, the manifest '
                                        'says .* \\(truncated or replaced\\)'):
        records.RecordSet(str(tmp_path), 'test')


def test_no_manifest_and_a_second_convert_are_errors(tmp_path):
    with pytest.raises(DataError, match='has no manifest.json: not a records folder'):
        records.RecordSet(str(tmp_path), 'train')
    records.write_records(_splits(), str(tmp_path), 1, 'tiny', 10)
    with pytest.raises(DataError, match='already holds records'):
        records.write_records(_splits(), str(tmp_path), 1, 'tiny', 10)


def test_records_with_a_wrong_shape_are_cleaned_out(tmp_path):
    images, labels = _splits(num_train=5)['train']
    records.write_records({'train': (images, labels)}, str(tmp_path), 1, 'tiny', 10)
    # Append a record that claims another shape, with a matching byte count.
    odd = np.zeros((5, 6, 3), np.uint8)  # 90 bytes, like SHAPE, but 5x6
    shard = tmp_path / 'train-00000-of-00001.tfrecord'
    with tf.io.TFRecordWriter(str(shard) + '.x') as writer:
        for serialized in tf1.io.tf_record_iterator(str(shard)):
            writer.write(serialized)
        writer.write(records._example(odd, 3))
    os.replace(str(shard) + '.x', shard)
    manifest = json.loads((tmp_path / 'manifest.json').read_text())
    entry = manifest['splits']['train']['shards'][0]
    entry['bytes'], entry['sha256'] = shard.stat().st_size, sha256_of_file(str(shard))
    (tmp_path / 'manifest.json').write_text(json.dumps(manifest))
    record_set = records.RecordSet(str(tmp_path), 'train')
    with tf.Graph().as_default() as graph:
        source, _ = record_set.source(SHAPE)
        dataset, counts = make_pipeline(source, SHAPE, 10, 4, epochs=1, shuffle_buffer=0)
        iterator = tf1.data.make_initializable_iterator(dataset)
        next_batch = iterator.get_next()
        init = tf1.local_variables_initializer()
    seen = 0
    with tf1.Session(graph=graph) as sess:
        sess.run([init, iterator.initializer])
        with pytest.raises(tf.errors.OutOfRangeError):
            while True:
                seen += len(sess.run(next_batch)[1])
        assert list(sess.run(counts)) == [6, 1]  # read, dropped
    assert seen == 5


def _peak_kb():
    # VmHWM, not ru_maxrss: this process's own high-water mark, whatever its parent's was.
    with open('/proc/self/status') as status:
        return next(int(line.split()[1]) for line in status if line.startswith('VmHWM:'))


def _read_all(folder, mark):
    """Every record of folder through the pipeline; (records read, peak RSS in kB) once
    mark records are read, and the same at the end."""
    record_set = records.RecordSet(folder, 'train', verify=False)
    with tf.Graph().as_default() as graph:
        source, _ = record_set.source((32, 32, 3))
        dataset, _ = make_pipeline(source, (32, 32, 3), 10, 64, epochs=1, shuffle_buffer=256)
        iterator = tf1.data.make_initializable_iterator(dataset)
        batch = iterator.get_next()
        init = tf1.local_variables_initializer()
    seen, early = 0, None
    with tf1.Session(graph=graph) as sess:
        sess.run([init, iterator.initializer])
        try:
            while True:
                seen += len(sess.run(batch)[1])
                if early is None and seen >= mark:
                    early = seen, _peak_kb()
        except tf.errors.OutOfRangeError:
            pass
    return early, (seen, _peak_kb())


def _peak_rss_reading(forks, folder, mark):
    """_read_all in a process of its own: this module run as a script, forked from the
    worker's fork server (which imported TensorFlow and read nothing)."""
    status, out, err = forks.run([folder, str(mark)], folder, module='tests.data.test_records',
                                 timeout=300)
    assert status == 0, err
    seen_early, peak_early, seen, peak = map(int, out[-1].split())
    return (seen_early, peak_early), (seen, peak)


def test_memory_stays_flat_whatever_the_number_of_records(tmp_path, forks):
    count, pixels = 60000, 32 * 32 * 3  # 184 MB of pixels
    rng = np.random.RandomState(0)
    # 1,000 random images over and over: a record's bytes are read whatever they hold, and
    # drawing 184 MB of random pixels took 0.7 CPU-s.
    images = np.resize(rng.randint(0, 256, (1000, 32, 32, 3), dtype=np.uint8),
                       (count, 32, 32, 3))
    records.write_records({'train': (images, rng.randint(0, 10, count))}, str(tmp_path), 8,
                          'big', 10)
    del images
    (early, peak_early), (seen, peak) = _peak_rss_reading(forks, str(tmp_path), 2048)
    assert (early, seen) == (2048, count)  # (batches of 64)
    # From the 2048th record to the last, a pipeline holding what it read would add
    # 170 MB. Streaming adds buffers and the allocator's growth, which scale with a
    # record's size but stop growing with the read's length: 33 to 36 MB measured here on
    # two busy cores (and ~50 MB between whole reads of 2,000 and 20,000, 60,000 or 80,000
    # records: with 20,000, the contrast against holding's 55 MB was too thin). The bound,
    # half what holding would add, is over twice the growth measured.
    held_kb = (count - early) * pixels // 1024
    assert peak - peak_early < held_kb // 2, (peak_early, peak, held_kb)


def test_cli_converts_the_sample_and_trains_from_the_records(tmp_path, capsys):
    from towers.cli import main
    out_dir = str(tmp_path / 'records')
    assert main(['data', 'convert', '--shards', '3', '--out', out_dir]) == 0
    assert capsys.readouterr().out.splitlines() == [
        'train: 4000 records in 3 shard(s)', 'test: 1000 records in 3 shard(s)',
        'wrote %s' % os.path.join(out_dir, 'manifest.json')]
    assert main(['train', '--dataset', 'records:' + out_dir, '--model', 'small_convnet',
                 '--towers', '2', '--devices', 'cpu', '--steps', '5']) == 0
    out = capsys.readouterr().out
    assert 'dataset records:%s: 4000 train, 0 validation, 1000 test' % out_dir in out
    assert 'training 5 steps on 2 tower(s) /cpu:0,/cpu:1, global batch 100, dataset input' in out
    assert '(1000 images)' in out.splitlines()[-1]
    # Worker 2 of 3 reads the third shard only: 4000 split 1334/1333/1333.
    assert main(['train', '--dataset', 'records:' + out_dir, '--model', 'small_convnet',
                 '--num-workers', '3', '--worker-index', '2', '--steps', '1', '--devices',
                 'cpu']) == 0
    assert 'dataset records:%s: 1333 train' % out_dir in capsys.readouterr().out
    assert main(['train', '--dataset', 'records:' + out_dir, '--input', 'feed']) == 1
    assert 'records:DIR streams from disk through --input dataset' in capsys.readouterr().err


def test_splits_of_different_shapes_are_refused_before_anything_is_written(tmp_path):
    splits = _splits()
    splits['test'] = (np.zeros((3, 5, 6, 3), np.uint8), np.zeros(3, np.int64))
    with pytest.raises(DataMismatchError) as info:
        records.write_records(splits, str(tmp_path / 'out'), 2, 'tiny', 10)
    assert str(info.value) == ('the tiny data to convert has 6x5x3 images for train but 5x6x3 '
                               'for test: the splits come from different datasets; give every '
                               'split images of one shape')
    assert not (tmp_path / 'out').exists()


def test_a_manifest_whose_splits_disagree_is_refused_for_every_split(tmp_path):
    records.write_records(_splits(), str(tmp_path), 1, 'tiny', 10)
    manifest = json.loads((tmp_path / 'manifest.json').read_text())
    manifest['splits']['test']['input_shape'] = [5, 6, 3]
    (tmp_path / 'manifest.json').write_text(json.dumps(manifest))
    for split in ('train', 'test'):
        with pytest.raises(DataMismatchError) as info:
            records.RecordSet(str(tmp_path), split)
        assert str(info.value) == (
            '%s has 6x5x3 images for train but 5x6x3 for test: the splits come from different '
            'datasets; convert one dataset again with `towers data convert`'
            % (tmp_path / 'manifest.json'))


def test_a_shard_of_another_shape_is_named_or_skipped(tmp_path):
    records.write_records(_splits(), str(tmp_path), 2, 'tiny', 10)
    # Shard 1 replaced by one of 5x6 images, its size and SHA-256 written into the manifest:
    # only reading a record tells.
    shard = tmp_path / 'train-00001-of-00002.tfrecord'
    records._write_shard(str(shard), np.zeros((11, 5, 6, 3), np.uint8), np.zeros(11, np.int64))
    manifest = json.loads((tmp_path / 'manifest.json').read_text())
    entry = manifest['splits']['train']['shards'][1]
    entry['bytes'], entry['sha256'] = shard.stat().st_size, sha256_of_file(str(shard))
    (tmp_path / 'manifest.json').write_text(json.dumps(manifest))
    with pytest.raises(DataError) as info:
        records.RecordSet(str(tmp_path), 'train')
    assert str(info.value) == ('shard %s holds 5x6x3 images, but the manifest declares 6x5x3 for '
                               'train; pass --skip-bad-shards to train without it' % shard)
    kept = records.RecordSet(str(tmp_path), 'train', skip_bad_shards=True, verify=False)
    assert kept.num_examples == 12
    assert [(name, count) for name, count, _ in kept.skipped] == [
        ('train-00001-of-00002.tfrecord', 11)]


if __name__ == '__main__':  # _peak_rss_reading's process
    (seen_early, peak_early), (seen, peak) = _read_all(sys.argv[1], int(sys.argv[2]))
    print(seen_early, peak_early, seen, peak)
