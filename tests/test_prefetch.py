"""Prefetching changes when batches are built, never what they hold."""

import time

import numpy as np
import pytest

from data.packing import TrainBatches
from data.prefetch import Prefetcher


def test_prefetched_batches_are_the_direct_batches_in_order():
    source = TrainBatches(np.arange(5000).astype(np.uint16) % 300, 16, 4, 2, 0, 1, seed=0, pad_id=257)
    prefetcher = Prefetcher(source.batch, 3, 12, depth=2)
    for step in range(3, 12):
        np.testing.assert_array_equal(prefetcher.get(step)["inputs"], source.batch(step)["inputs"])
    prefetcher.close()


def test_the_next_batch_is_built_while_the_loop_works():
    built = []
    prefetcher = Prefetcher(lambda s: built.append(s) or s, 0, 10, depth=2)
    assert prefetcher.get(0) == 0
    time.sleep(0.2)  # "the step runs"
    assert built == [0, 1, 2, 3]  # built ahead: `depth` waiting in the queue plus one waiting for room, no more
    prefetcher.close()


def test_errors_surface_where_the_batch_is_wanted():
    def make(step):
        if step == 2:
            raise ValueError("broken window")
        return step

    prefetcher = Prefetcher(make, 0, 5)
    assert [prefetcher.get(0), prefetcher.get(1)] == [0, 1]
    with pytest.raises(ValueError, match="broken window"):
        prefetcher.get(2)
    prefetcher.close()


def test_steps_must_be_asked_for_in_order():
    prefetcher = Prefetcher(lambda s: s, 0, 5)
    with pytest.raises(ValueError, match="expected step 0"):
        prefetcher.get(1)
    prefetcher.close()
