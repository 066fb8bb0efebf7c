"""Tests for data.prefetch: order, errors, dead workers and clean shutdown.

Sources are module-level classes so that spawned worker processes can unpickle them.
"""
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from towers.data.errors import DataError
from towers.data.prefetch import Prefetcher, PrefetchError

NUM_BATCHES = 12


def make_batch(index):
    """Batch `index`: images float32 [2, 4, 4, 1] filled with index, labels int64 [2]."""
    return (np.full((2, 4, 4, 1), index, np.float32),
            np.array([index, index + 100], np.int64))


class SleepySource:
    """Batch i after a random sleep of 0-20 ms (seeded by i), so workers finish out of order."""

    def __init__(self, length=NUM_BATCHES, fail_at=None, exit_at=None):
        self.length, self.fail_at, self.exit_at = length, fail_at, exit_at

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        time.sleep(np.random.RandomState(index).uniform(0, 0.02))
        if index == self.fail_at:
            raise ValueError(f'corrupt record in batch {index}')
        if index == self.exit_at:
            os._exit(3)
        return make_batch(index)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class IterableSource:
    """Only __len__ and __iter__: no random access."""

    def __init__(self, length=NUM_BATCHES, short_by=0):
        self.length, self.short_by = length, short_by

    def __len__(self):
        return self.length

    def __iter__(self):
        return (make_batch(i) for i in range(self.length - self.short_by))


class LambdaSource(SleepySource):
    def __init__(self):
        super().__init__()
        self.transform = lambda batch: batch


class RecordingSource(SleepySource):
    """Remembers which indices it was asked for (threads share it with the test)."""

    def __init__(self, delay=0.0):
        super().__init__()
        self.delay = delay
        self.started = []

    def __getitem__(self, index):
        self.started.append(index)
        time.sleep(self.delay)
        return make_batch(index)


def labels_of(batches):
    return [int(labels[0]) for _, labels in batches]


def consume_with_deadline(prefetcher, seconds=15):
    """Iterates `prefetcher` in a helper thread; returns (labels, exception) or fails on a hang."""
    outcome = {'labels': [], 'error': None}

    def consume():
        try:
            for _, labels in prefetcher:
                outcome['labels'].append(int(labels[0]))
        except Exception as exc:
            outcome['error'] = exc
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    consumer.join(seconds)
    assert not consumer.is_alive(), f'the consumer hung for {seconds} s'
    return outcome['labels'], outcome['error']


def assert_no_workers_left():
    assert multiprocessing.active_children() == []
    assert [t.name for t in threading.enumerate() if t.name.startswith('prefetch-')] == []


@pytest.fixture(autouse=True)
def no_leftover_workers():
    yield
    assert_no_workers_left()


@pytest.mark.parametrize('workers', ['process', 'thread'])
def test_ordered_equals_direct_iteration(workers):
    source = SleepySource()
    expected = list(source)
    with Prefetcher(source, num_workers=3, workers=workers) as prefetcher:
        assert len(prefetcher) == NUM_BATCHES
        got = list(prefetcher)
        again = list(prefetcher)   # a second pass on the same workers
    for batches in (got, again):
        assert len(batches) == len(expected)
        for (images, labels), (want_images, want_labels) in zip(batches, expected):
            np.testing.assert_array_equal(images, want_images)
            np.testing.assert_array_equal(labels, want_labels)
            assert images.dtype == np.float32 and images.shape == (2, 4, 4, 1)


@pytest.mark.parametrize('workers', ['process', 'thread'])
def test_unordered_yields_every_batch_once(workers):
    with Prefetcher(SleepySource(), num_workers=3, workers=workers, ordered=False) as prefetcher:
        got = labels_of(prefetcher)
    assert sorted(got) == list(range(NUM_BATCHES))


def test_buffer_bounds_how_far_workers_run_ahead():
    source = RecordingSource()
    with Prefetcher(source, num_workers=3, workers='thread', buffer=3) as prefetcher:
        for done, (_, labels) in enumerate(prefetcher):
            assert labels[0] == done
            time.sleep(0.01)   # a slow consumer: workers would run away if unbounded
            assert max(source.started) <= done + 3
    assert sorted(source.started) == list(range(NUM_BATCHES))


def test_abandoned_pass_is_skipped_then_full_pass():
    source = RecordingSource(delay=0.05)
    with Prefetcher(source, num_workers=1, workers='thread', ordered=False,
                    buffer=6) as prefetcher:
        for _ in prefetcher:
            break   # batches 1-5 were already sent to the worker
        assert sorted(labels_of(prefetcher)) == list(range(NUM_BATCHES))   # none stale
    assert len(source.started) <= NUM_BATCHES + 3   # the leftovers were skipped, not loaded


@pytest.mark.parametrize('workers', ['process', 'thread'])
def test_worker_exception_surfaces_with_index_and_message(workers):
    prefetcher = Prefetcher(SleepySource(fail_at=5), num_workers=3, workers=workers)
    got, error = consume_with_deadline(prefetcher)
    assert isinstance(error, PrefetchError) and isinstance(error, DataError)
    assert got == [0, 1, 2, 3, 4]   # ordered: everything before the failure, then the error
    assert error.index == 5
    assert 'batch 5' in str(error)
    assert 'ValueError: corrupt record in batch 5' in str(error)
    assert '\n' not in str(error)
    assert 'Traceback' in error.details and '__getitem__' in error.details
    assert_no_workers_left()   # closed by the error itself, no `with` needed


def test_killed_worker_is_detected_not_waited_for():
    prefetcher = Prefetcher(SleepySource(exit_at=2), num_workers=3)
    got, error = consume_with_deadline(prefetcher)
    assert isinstance(error, PrefetchError)
    assert 'exit code 3' in str(error) and 'batch 2' in str(error)
    assert error.index == 2 and error.details is None
    assert got == [0, 1]
    assert_no_workers_left()


@pytest.mark.parametrize('workers', ['process', 'thread'])
def test_break_early_then_close_leaves_no_workers(workers):
    prefetcher = Prefetcher(SleepySource(), num_workers=3, workers=workers)
    for done, _ in enumerate(prefetcher):
        if done == 1:
            break
    prefetcher.close()
    prefetcher.close()   # idempotent
    assert_no_workers_left()
    with pytest.raises(ValueError, match='closed'):
        iter(prefetcher)


def test_dropping_an_unfinished_loop_ends_the_workers():
    for done, _ in enumerate(Prefetcher(SleepySource(), num_workers=2)):
        if done == 1:
            break   # no close(): the Prefetcher is dropped with its loop, and ends its workers
    assert_no_workers_left()


def test_consumer_exception_inside_with_block_closes_workers():
    with pytest.raises(KeyError):
        with Prefetcher(SleepySource(), num_workers=2) as prefetcher:
            for _ in prefetcher:
                raise KeyError('consumer failed')
    assert_no_workers_left()


def test_close_from_another_thread_wakes_the_consumer():
    prefetcher = Prefetcher(SleepySource(length=1000), num_workers=2, workers='thread', buffer=2)
    timer = threading.Timer(0.2, prefetcher.close)
    timer.start()
    with pytest.raises(PrefetchError, match='closed'):
        for _ in prefetcher:
            time.sleep(0.01)
    timer.join()


@pytest.mark.parametrize('workers', ['process', 'thread'])
def test_iterable_only_source_with_one_worker(workers):
    with Prefetcher(IterableSource(), num_workers=1, workers=workers) as prefetcher:
        assert len(prefetcher) == NUM_BATCHES
        assert labels_of(prefetcher) == list(range(NUM_BATCHES))
        assert labels_of(prefetcher) == list(range(NUM_BATCHES))   # each pass iterates anew


def test_iterable_only_source_with_two_workers_is_refused():
    with pytest.raises(ValueError, match='__getitem__'):
        Prefetcher(IterableSource(), num_workers=2, workers='thread')


def test_iterable_source_shorter_than_its_len():
    with pytest.raises(PrefetchError, match='ran out after 10 batches'):
        with Prefetcher(IterableSource(short_by=2), num_workers=1, workers='thread') as prefetcher:
            list(prefetcher)


def test_unpicklable_source_gets_a_clear_error():
    with pytest.raises(TypeError, match=r"cannot be pickled.*workers='thread'"):
        Prefetcher(LambdaSource(), num_workers=2, workers='process')
    with Prefetcher(LambdaSource(), num_workers=2, workers='thread') as prefetcher:
        assert labels_of(prefetcher) == list(range(NUM_BATCHES))


def test_bad_arguments():
    with pytest.raises(ValueError, match='num_workers'):
        Prefetcher(SleepySource(), num_workers=0)
    with pytest.raises(ValueError, match='workers'):
        Prefetcher(SleepySource(), workers='fiber')
    with pytest.raises(ValueError, match='buffer'):
        Prefetcher(SleepySource(), buffer=0)
    with pytest.raises(TypeError, match='len'):
        Prefetcher(iter([make_batch(0)]), num_workers=1)


def test_importing_prefetch_does_not_import_tensorflow(tmp_path):
    code = 'import sys, towers.data.prefetch; sys.exit("tensorflow" in sys.modules)'
    assert subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path)).returncode == 0
