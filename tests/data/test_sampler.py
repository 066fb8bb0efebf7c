"""EpochSampler: exactly once per epoch, reproducible, resumable at any step."""
import numpy as np
import pytest

from towers.data.sampler import EpochSampler


def test_every_example_exactly_once_per_epoch_with_a_short_last_batch():
    sampler = EpochSampler(10, 4, seed=1)
    assert sampler.steps_per_epoch == 3
    batches = [sampler.indices(step) for step in range(6)]
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    first, second = np.concatenate(batches[:3]), np.concatenate(batches[3:])
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert list(first) != list(second), 'epochs must be reshuffled'


def test_order_depends_only_on_seed_and_step():
    a, b = EpochSampler(50, 7, seed=3), EpochSampler(50, 7, seed=3)
    # b jumps straight to step 20, as a resumed run does.
    np.testing.assert_array_equal(a.indices(20), b.indices(20))
    assert list(EpochSampler(50, 7, seed=4).indices(0)) != list(a.indices(0))


def test_no_shuffle_serves_in_order():
    sampler = EpochSampler(5, 2, shuffle=False)
    assert [list(sampler.indices(s)) for s in range(4)] == [[0, 1], [2, 3], [4], [0, 1]]


@pytest.mark.parametrize('num_examples,batch_size', [(0, 1), (3, 0)])
def test_bad_sizes_are_errors(num_examples, batch_size):
    with pytest.raises(ValueError):
        EpochSampler(num_examples, batch_size)
