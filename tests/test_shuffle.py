"""The constant-memory epoch order (data/shuffle.py): a bijection, different per key, and no array of size n."""

import tracemalloc

import numpy as np
import pytest

from data.shuffle import IndexShuffle


def rng(*seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(list(seed)))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097, 65537])
def test_every_position_maps_to_a_distinct_index_in_range(n):
    order = IndexShuffle(n, rng(0, 1))[np.arange(n)]
    assert order.min() >= 0 and order.max() < n
    assert np.array_equal(np.sort(order), np.arange(n))


def test_scalar_and_vector_lookups_agree_and_keys_change_the_order():
    a, b = IndexShuffle(1000, rng(0, 0)), IndexShuffle(1000, rng(0, 1))
    assert [a[i] for i in range(10)] == a[np.arange(10)].tolist()
    assert not np.array_equal(a[np.arange(1000)], b[np.arange(1000)])
    assert np.array_equal(a[np.arange(1000)], IndexShuffle(1000, rng(0, 0))[np.arange(1000)])


def test_the_order_looks_random():
    """Not the identity nor a near-identity: positions move far, and neighbours do not stay neighbours."""
    n = 10_000
    order = IndexShuffle(n, rng(3, 0))[np.arange(n)]
    assert np.mean(order == np.arange(n)) < 0.01
    assert np.mean(np.abs(np.diff(order)) == 1) < 0.01
    first_half = order[: n // 2]
    assert 0.45 < np.mean(first_half < n // 2) < 0.55  # the first half of the epoch covers both halves alike


def test_memory_does_not_grow_with_n():
    tracemalloc.start()
    shuffle = IndexShuffle(10**12, rng(0, 0))  # a trillion windows: a materialised order would need 8 TB
    picks = shuffle[np.arange(10**12 - 64, 10**12)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert picks.min() >= 0 and picks.max() < 10**12 and len(set(picks.tolist())) == 64
    assert peak < 1 << 20


def test_out_of_range_positions_are_refused():
    with pytest.raises(IndexError):
        IndexShuffle(10, rng(0))[10]
