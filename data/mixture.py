"""Training on several sources at once: each row of a step is drawn from one source, by weight, as a pure function of
(seed, step, process), so a resumed run reads exactly the rows it would have read.

The run's sample numbers g = 0, 1, 2, ... (data/batches.py `step_samples`: the same numbering whatever the number of
processes or micro-batches) are cut into blocks of MIXTURE_BLOCK. Every block gives each source the same number of
rows (`allot`: the weights' shares of the block, rounded so they sum to it), in an order shuffled per block from
(seed, block). Sample g is then row b * count_s + r of its source s, where b is its block and r the number of rows of
s before it in the block: each source reads its own examples in its own epochs (data/batches.py `TrainBatches`), and
the tokens each source has given up to any step are known exactly, without a counter that would have to be saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from data.batches import BatchSizes, TrainBatches, allot, step_samples

MIXTURE_BLOCK = 4096  # rows per block: the weights are met exactly every 4096 rows, to 1/4096 of the total


@dataclass
class MixtureTrainBatches:
    """Training batches drawn from `sources` (each a TrainBatches over its own split; only their rows are used)
    in proportion to `weights`. `batch(step)` has the shape of a single source's batch."""

    names: list[str]
    weights: list[float]
    sources: list[TrainBatches]
    sizes: BatchSizes | int  # sequences per micro-batch per process, step by step (an int: at every step)
    grad_accum_steps: int
    process_index: int
    process_count: int
    seed: int
    _blocks: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.sizes = BatchSizes.constant(self.sizes) if isinstance(self.sizes, int) else self.sizes
        self.counts = np.asarray(allot(self.weights, MIXTURE_BLOCK))
        self.context = self.sources[0].examples.context

    @property
    def batch_size(self) -> int:
        return self.sizes.sizes[0]

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, all processes together (at the first step)."""
        return self.grad_accum_steps * self.process_count * self.batch_size

    def samples_before(self, step: int) -> int:
        """Sequences of the run's first `step` steps, all processes together."""
        return self.grad_accum_steps * self.process_count * self.sizes.rows_before(step)

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Block b's source per slot, and each slot's row number within its source's share of the block. Called from
        the prefetch thread (batch) and the loop's (tokens_seen): the block is held in a local, so the other thread's
        clearing of the cache between a lookup and a read cannot take it."""
        block = self._blocks.get(b)
        if block is None:
            rng = np.random.Generator(np.random.PCG64([self.seed, b, len(self.sources)]))
            slots = rng.permutation(np.repeat(np.arange(len(self.sources)), self.counts))
            rank = np.empty(MIXTURE_BLOCK, np.int64)
            for s in range(len(self.sources)):
                mine = slots == s
                rank[mine] = np.arange(int(mine.sum()))
            if len(self._blocks) > 8:  # a step spans few blocks; keep the latest ones only
                self._blocks.clear()
            self._blocks[b] = block = (slots, rank)
        return block

    def assign(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run-wide sample numbers -> (source of each, its sample number within that source)."""
        source, local = np.empty_like(samples), np.empty_like(samples)
        blocks = samples // MIXTURE_BLOCK
        for b in np.unique(blocks):
            rows = blocks == b
            slots, rank = self._block(int(b))
            slot = samples[rows] % MIXTURE_BLOCK
            source[rows] = slots[slot]
            local[rows] = b * self.counts[slots[slot]] + rank[slot]
        return source, local

    def sample_indices(self, step: int) -> np.ndarray:
        return step_samples(step, self.grad_accum_steps, self.process_count, self.sizes, self.process_index)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        source, local = self.assign(self.sample_indices(step))
        rows = np.empty(source.shape + (self.context + 1,), np.int64)
        for s, train in enumerate(self.sources):
            chosen = source == s
            if chosen.any():
                rows[chosen] = train.rows(local[chosen])
        return self.sources[0].examples.batch(rows)

    def tokens_seen(self, steps: int) -> dict[str, int]:
        """Tokens of training rows each source has given in the run's first `steps` steps (all processes)."""
        samples = self.samples_before(steps)
        full, part = divmod(samples, MIXTURE_BLOCK)
        counts = full * self.counts
        if part:
            slots, _ = self._block(full)
            counts = counts + np.bincount(slots[:part], minlength=len(self.sources))
        return {name: int(n) * self.context for name, n in zip(self.names, counts)}
