"""Examples (data/examples.py) -> batches: training batches that are a pure function of (seed, step, process), and
fixed evaluation sets.

Sample g of the run is the example at position g mod n of epoch e = g div n (n: the examples per epoch; the epoch's
order drawn from (seed, e)). Nothing about the position in the data lives in an iterator, so a resumed run reads
exactly the batches it would have read. A batch is `inputs`, `targets` (inputs shifted by one) and `loss_mask` (1
where the target counts), plus `segment_ids` with document masking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from data.examples import Examples, Seed, seeded_rng


@dataclass(frozen=True)
class BatchSizes:
    """Sequences per micro-batch per process, step by step: `sizes[i]` from step `starts[i]` on (starts[0] = 0; the
    run's stages, training/config/stages.py). One entry: the same size at every step."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]

    @staticmethod
    def constant(size: int) -> BatchSizes:
        return BatchSizes((0,), (size,))

    def at(self, step: int) -> int:
        return self.sizes[int(np.searchsorted(self.starts, step, side="right")) - 1]

    def rows_before(self, step: int) -> int:
        """Sequences per process per micro-batch slot in the run's first `step` steps, all summed."""
        ends = (*self.starts[1:], step)
        return sum(size * max(0, min(end, step) - start) for start, end, size in zip(self.starts, ends, self.sizes))


def step_samples(step: int, grad_accum: int, process_count: int, sizes: BatchSizes, process_index: int) -> np.ndarray:
    """Run-wide sample numbers for one process at `step`: [grad_accum, batch size at the step].

    Sample numbers of one step are laid out [grad_accum, process, batch], so the processes' rows of a micro-batch
    are adjacent and their concatenation is the single-process micro-batch. Steps follow one another: a step's
    first sample is the one after the last step's, whatever their batch sizes.
    """
    A, P, B = grad_accum, process_count, sizes.at(step)
    layout = A * P * sizes.rows_before(step) + np.arange(A * P * B).reshape(A, P, B)
    return layout[:, process_index, :]


def allot(weights: list[float], total: int) -> list[int]:
    """`total` split in proportion to `weights`, rounded by largest remainder so the parts sum to `total`."""
    shares = np.asarray(weights, np.float64) / float(np.sum(weights)) * total
    parts = np.floor(shares).astype(np.int64)
    order = np.argsort(-(shares - parts), kind="stable")  # ties: the earlier source first
    parts[order[: total - int(parts.sum())]] += 1
    return parts.tolist()


class TrainBatches:
    """Training batches for one process: `batch(step)` has arrays of shape [grad_accum, batch_size, context]."""

    def __init__(
        self,
        examples: Examples,
        batch_size: int | BatchSizes,
        grad_accum_steps: int,
        process_index: int,
        process_count: int,
        seed: Seed,
    ) -> None:
        if examples.num_examples < 1:
            raise ValueError(f"the training split has {examples.num_examples} examples; an epoch needs one")
        self.sizes = BatchSizes.constant(batch_size) if isinstance(batch_size, int) else batch_size
        self.examples, self.batch_size, self.grad_accum_steps = examples, self.sizes.sizes[0], grad_accum_steps
        self.process_index, self.process_count, self.seed = process_index, process_count, seed
        self._epoch: tuple[int, Callable[[np.ndarray], np.ndarray]] | None = None  # the latest epoch's order

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, all processes together (at the first step: `samples_before` counts later
        stages' sizes)."""
        return self.grad_accum_steps * self.process_count * self.batch_size

    def samples_before(self, step: int) -> int:
        """Sequences of the run's first `step` steps, all processes together."""
        return self.grad_accum_steps * self.process_count * self.sizes.rows_before(step)

    def sample_indices(self, step: int) -> np.ndarray:
        return step_samples(step, self.grad_accum_steps, self.process_count, self.sizes, self.process_index)

    def _order(self, epoch: int) -> Callable[[np.ndarray], np.ndarray]:
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self.examples.epoch_order(seeded_rng(self.seed, epoch)))
        return self._epoch[1]

    def rows(self, samples: np.ndarray) -> np.ndarray:
        """[..., context + 1] token rows of these run-wide sample numbers."""
        n = self.examples.num_examples
        ids = np.empty(samples.shape, np.int64)
        epochs = samples // n
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            ids[chosen] = self._order(int(epoch))(samples[chosen] % n)
        return self.examples.rows(ids, self.seed, samples)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        return self.examples.batch(self.rows(self.sample_indices(step)))


class EvalBatches:
    """A fixed evaluation set: `num_batches` x global-batch examples spread evenly over the whole split (all of them
    when it is short). The same examples at every evaluation, so the curve measures the model, not the sample. Rows
    past the last example are padding with `loss_mask` 0.

    `splits` may also be several splits with `weights` (a mixture's sources): the set then takes from each its
    weight's share of the examples, spread evenly over that split."""

    def __init__(
        self,
        splits: Examples | list[Examples],
        batch_size: int,
        num_batches: int,
        process_index: int,
        process_count: int,
        weights: list[float] | None = None,
    ) -> None:
        self.splits = splits if isinstance(splits, list) else [splits]
        self.batch_size, self.process_index, self.process_count = batch_size, process_index, process_count
        per_batch = batch_size * process_count
        weights = weights or [1.0] * len(self.splits)
        wanted = allot(weights, num_batches * per_batch)
        # a split shorter than its share shrinks every share alike, so the set keeps the weights (it took all of the
        # short one and the others' full shares: 0.9 / 0.1 sources made a 58 / 42 set)
        short = min((split.num_fixed / n for split, n in zip(self.splits, wanted) if n and split.num_fixed), default=1)
        if short < 1 and len(self.splits) > 1:  # rounded: int() of 56.99999 left a split's last example out
            wanted = allot(weights, round(sum(wanted) * short))
        split_of, ids = [], []
        for s, (split, n) in enumerate(zip(self.splits, wanted)):
            taken = min(split.num_fixed, n)
            split_of.append(np.full(taken, s))
            ids.append(split.fixed_ids(np.arange(taken) * split.num_fixed // max(taken, 1)))
        self.split_of, self.ids = np.concatenate(split_of), np.concatenate(ids)  # example k: which split, which id
        self.num_examples = len(self.ids)
        self.batches_needed = -(-self.num_examples // per_batch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        first = self.splits[0]
        per_batch = self.batch_size * self.process_count
        for b in range(self.batches_needed):
            wanted = b * per_batch + self.process_index * self.batch_size + np.arange(self.batch_size)
            rows = np.full((self.batch_size, first.context + 1), first.pad_id, np.int64)
            real = wanted < self.num_examples
            for s, split in enumerate(self.splits):
                mine = real.copy()
                mine[real] = self.split_of[wanted[real]] == s
                if mine.any():
                    rows[mine] = split.rows(self.ids[wanted[mine]])
            yield first.batch(rows)

    def __len__(self) -> int:
        return self.batches_needed
