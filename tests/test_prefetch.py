"""Prefetching changes when batches are built, never what they hold."""

import threading

import numpy as np
import pytest

from data.batches import TrainBatches
from data.examples import Windows
from data.prefetch import Prefetcher


def test_prefetched_batches_are_the_direct_batches_in_order():
    source = TrainBatches(Windows(np.arange(5000).astype(np.uint16) % 300, 16, pad_id=257), 4, 2, 0, 1, seed=0)
    prefetcher = Prefetcher(source.batch, 3, 12, depth=2)
    for step in range(3, 12):
        np.testing.assert_array_equal(prefetcher.get(step)["inputs"], source.batch(step)["inputs"])
    prefetcher.close()


def test_batches_are_built_ahead_of_the_loop_and_no_further():
    """Before the loop asks for step s, steps s .. s + depth are already built, unasked (`depth` waiting in the queue
    plus one waiting for room); and no build ever runs further than `depth` ahead of the steps asked for."""
    depth, steps, asked = 2, 12, [0]
    built = [threading.Event() for _ in range(steps)]
    ahead = []

    def make(step):
        ahead.append(step - asked[0])
        built[step].set()
        return step

    prefetcher = Prefetcher(make, 0, steps, depth=depth)
    for step in range(steps):
        assert built[min(step + depth, steps - 1)].wait(timeout=60), f"step {step + depth} was not built ahead"
        asked[0] = step + 1
        assert prefetcher.get(step) == step
    prefetcher.close()
    assert max(ahead) == depth, ahead


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
