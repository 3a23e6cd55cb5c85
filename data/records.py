"""Batches of records: one sequence per row, padded, instead of windows cut from a packed stream.

Fine-tuning needs them (a record is `prompt <GENAI> target <EOS>`, and the loss belongs to the target), and so do
notes, whose records are augmented and tokenised on the fly. `make_record(index, rng)` returns a record's token ids;
`rng` is seeded from (seed, sample number), so training batches stay a pure function of (seed, step, process), and is
None for evaluation (no augmentation, the same records every time).

`loss_mask` is 1 on real targets (not `<PAD>`); with `finetuning` masking also only on targets after the `<GENAI>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from data.packing import eval_layout, step_samples

MakeRecord = Callable[[int, "np.random.Generator | None"], list[int]]


def record_batch(records: list[list[int]], context: int, pad_id: int, genai_id: int, finetuning: bool
                 ) -> dict[str, np.ndarray]:
    """Records -> inputs/targets/loss_mask of shape [len(records), context]; longer records are cut."""
    windows = np.full((len(records), context + 1), pad_id, np.int32)
    for r, ids in enumerate(records):
        ids = ids[: context + 1]
        windows[r, : len(ids)] = ids
    targets = windows[:, 1:]
    mask = targets != pad_id
    if finetuning:
        # Target j is ids[j + 1]: it counts when a <GENAI> came at or before input j.
        mask &= np.cumsum(windows[:, :-1] == genai_id, axis=1) > 0
    return {"inputs": windows[:, :-1], "targets": targets, "loss_mask": mask.astype(np.float32)}


@dataclass
class RecordBatches:
    """Training batches of records for one process: `batch(step)` has arrays [grad_accum, batch_size, context].
    Sample g of the run is record perm_e[g mod N] of epoch e = g div N, perm_e drawn from (seed, e)."""

    num_records: int
    make_record: MakeRecord
    context: int
    batch_size: int
    grad_accum_steps: int
    process_index: int
    process_count: int
    seed: int
    pad_id: int
    genai_id: int
    finetuning: bool

    def __post_init__(self) -> None:
        if self.num_records < 1:
            raise ValueError("the training split has no records")
        self.num_windows = self.num_records  # what an epoch counts, as for packed windows
        self._epoch_cache: tuple[int, np.ndarray] | None = None

    @property
    def global_batch(self) -> int:
        return self.grad_accum_steps * self.process_count * self.batch_size

    def _perm(self, epoch: int) -> np.ndarray:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            self._epoch_cache = (epoch, rng.permutation(self.num_records))
        return self._epoch_cache[1]

    def batch(self, step: int) -> dict[str, np.ndarray]:
        samples = step_samples(step, self.grad_accum_steps, self.process_count, self.batch_size, self.process_index)
        records = []
        for g in samples.reshape(-1).tolist():
            index = int(self._perm(g // self.num_records)[g % self.num_records])
            records.append(self.make_record(index, np.random.Generator(np.random.PCG64([self.seed, 1, g]))))
        flat = record_batch(records, self.context, self.pad_id, self.genai_id, self.finetuning)
        return {k: v.reshape(samples.shape + v.shape[1:]) for k, v in flat.items()}

    def epoch_of(self, step: int) -> float:
        return (step + 1) * self.global_batch / self.num_records


@dataclass
class RecordEvalBatches:
    """A fixed evaluation set of records, evenly spread over the split (all of them when it is short); rows past
    the last record are padding with `loss_mask` 0."""

    num_records: int
    make_record: MakeRecord
    context: int
    batch_size: int  # per process
    num_batches: int
    process_index: int
    process_count: int
    pad_id: int
    genai_id: int
    finetuning: bool

    def __post_init__(self) -> None:
        self.num_windows, self.batches_needed, self.chosen = eval_layout(self.num_records, self.batch_size,
                                                                         self.process_count, self.num_batches)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        per_batch = self.batch_size * self.process_count
        for b in range(self.batches_needed):
            rows = b * per_batch + self.process_index * self.batch_size + np.arange(self.batch_size)
            records = [self.make_record(int(self.chosen[w]), None) if w < self.num_windows else [] for w in rows]
            yield record_batch(records, self.context, self.pad_id, self.genai_id, self.finetuning)

    def __len__(self) -> int:
        return self.batches_needed
