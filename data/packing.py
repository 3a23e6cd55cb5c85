"""Documents -> one token stream per split -> windows of context+1 tokens -> batches.

Each document is tokenised (datasets.map, cached on disk) and followed by `<EOS>`; a split is the concatenation of its
documents. A batch is `inputs`, `targets` (inputs shifted by one) and `loss_mask` (1 where the target counts).

Training batches are a pure function of (seed, step, process): sample g of the run is window perm_e[g mod W] of epoch
e = g div W, where W is the number of windows and perm_e and the epoch's start offset come from (seed, e). Nothing
about the position in the data lives in an iterator, so a resumed run reads exactly the batches it would have read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator

import datasets
import numpy as np

from data.tokenizers import Tokenizer

SMALL_SPLIT_DOCS = 64  # below this many documents, tokenising in worker processes costs more than it saves


def tokenize_split(ds: datasets.Dataset, tokenizer: Tokenizer, num_proc: int) -> np.ndarray:
    """All documents of a split as one token stream, each followed by <EOS>. Cached by datasets' fingerprint."""
    tokenized = _map_ids(ds, _encode_documents, tokenizer, num_proc, "eos-v1")
    ids = tokenized.data.column("ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return ids.astype(np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)


def tokenize_prompts(ds: datasets.Dataset, tokenizer: Tokenizer, num_proc: int) -> list[list[int]]:
    """Rows with `prompt` and `completion` columns -> `prompt <GENAI> completion <EOS>` id lists."""
    return _map_ids(ds, _encode_prompts, tokenizer, num_proc, "prompt-v1")["ids"]


def _map_ids(ds: datasets.Dataset, encode, tokenizer: Tokenizer, num_proc: int, version: str) -> datasets.Dataset:
    """`encode` over the split in batches (worker processes for big splits), into one `ids` column; cached on disk
    under a fingerprint of the data, the tokenizer and `version`."""
    fingerprint = hashlib.sha256(f"{ds._fingerprint}|{tokenizer.fingerprint()}|{version}".encode()).hexdigest()[:16]
    return ds.map(
        encode,
        batched=True,
        batch_size=64,
        num_proc=num_proc if len(ds) >= SMALL_SPLIT_DOCS and num_proc > 1 else None,
        remove_columns=ds.column_names,
        fn_kwargs={"tokenizer": tokenizer},
        new_fingerprint=fingerprint,
    )


def _encode_prompts(batch: dict, tokenizer: Tokenizer) -> dict:
    prompts = tokenizer.encode_batch([p or "" for p in batch["prompt"]])
    completions = tokenizer.encode_batch([c or "" for c in batch["completion"]])
    return {"ids": [p + [tokenizer.genai_id] + c + [tokenizer.eos_id] for p, c in zip(prompts, completions)]}


def _encode_documents(batch: dict, tokenizer: Tokenizer) -> dict:
    texts = [t for t in batch["text"] if t]  # empty rows (blank lines in some Hub corpora) are not documents
    return {"ids": [ids + [tokenizer.eos_id] for ids in tokenizer.encode_batch(texts)]}


def step_samples(step: int, grad_accum: int, process_count: int, batch_size: int, process_index: int) -> np.ndarray:
    """Run-wide sample numbers for one process at `step`: [grad_accum, batch_size].

    Sample numbers of one step are laid out [grad_accum, process, batch], so the processes' rows of a micro-batch
    are adjacent and their concatenation is the single-process micro-batch.
    """
    A, P, B = grad_accum, process_count, batch_size
    layout = step * A * P * B + np.arange(A * P * B).reshape(A, P, B)
    return layout[:, process_index, :]


def eval_layout(available: int, batch_size: int, process_count: int, num_batches: int
                ) -> tuple[int, int, np.ndarray]:
    """An evaluation set of up to `num_batches` global batches out of `available` windows (or records): how many
    it takes, how many batches that fills, and which ones (an even stride over the whole split)."""
    per_batch = batch_size * process_count
    taken = min(available, num_batches * per_batch)
    return taken, -(-taken // per_batch), np.arange(taken) * available // max(taken, 1)


def _window_batch(windows: np.ndarray, pad_id: int) -> dict[str, np.ndarray]:
    """[..., T+1] token windows -> inputs/targets/loss_mask of shape [..., T]."""
    return {
        "inputs": windows[..., :-1].astype(np.int32),
        "targets": windows[..., 1:].astype(np.int32),
        "loss_mask": (windows[..., 1:] != pad_id).astype(np.float32),
    }


@dataclass
class TrainBatches:
    """Training batches for one process: `batch(step)` has arrays of shape [grad_accum, batch_size, context]."""

    tokens: np.ndarray
    context: int
    batch_size: int  # per process per micro-batch
    grad_accum_steps: int
    process_index: int
    process_count: int
    seed: int
    pad_id: int

    def __post_init__(self) -> None:
        # One window's worth of slack so that every epoch's random start offset keeps all windows in range.
        self.num_windows = (len(self.tokens) - 1 - self.context) // self.context
        if self.num_windows < 1:
            raise ValueError(f"the training split has {len(self.tokens)} tokens, fewer than two windows of {self.context}")
        self._epoch_cache: tuple[int, int, np.ndarray] | None = None

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, all processes together."""
        return self.grad_accum_steps * self.process_count * self.batch_size

    def _epoch(self, epoch: int) -> tuple[int, np.ndarray]:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            offset = int(rng.integers(self.context))
            self._epoch_cache = (epoch, offset, rng.permutation(self.num_windows))
        return self._epoch_cache[1], self._epoch_cache[2]

    def sample_indices(self, step: int) -> np.ndarray:
        return step_samples(step, self.grad_accum_steps, self.process_count, self.batch_size, self.process_index)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        samples = self.sample_indices(step)
        windows = np.empty(samples.shape + (self.context + 1,), self.tokens.dtype)
        for idx, g in np.ndenumerate(samples):
            offset, perm = self._epoch(int(g) // self.num_windows)
            start = offset + int(perm[int(g) % self.num_windows]) * self.context
            windows[idx] = self.tokens[start : start + self.context + 1]
        return _window_batch(windows, self.pad_id)

    def epoch_of(self, step: int) -> float:
        return (step + 1) * self.global_batch / self.num_windows


@dataclass
class EvalBatches:
    """A fixed evaluation set: `num_batches` x global-batch windows spread evenly over the whole split (all of its
    windows when it is short). The same windows at every evaluation, so the curve measures the model, not the
    sample. Rows past the last window are padding with `loss_mask` 0."""

    tokens: np.ndarray
    context: int
    batch_size: int  # per process
    num_batches: int
    process_index: int
    process_count: int
    pad_id: int

    def __post_init__(self) -> None:
        available = max((len(self.tokens) - 1) // self.context, 0)
        self.num_windows, self.batches_needed, chosen = eval_layout(available, self.batch_size, self.process_count,
                                                                    self.num_batches)
        self.starts = chosen * self.context  # window w of the evaluation set starts here in the split

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        per_batch = self.batch_size * self.process_count
        for b in range(self.batches_needed):
            rows = b * per_batch + self.process_index * self.batch_size + np.arange(self.batch_size)
            windows = np.full((self.batch_size, self.context + 1), self.pad_id, self.tokens.dtype)
            for r, w in enumerate(rows):
                if w < self.num_windows:
                    windows[r] = self.tokens[self.starts[w] : self.starts[w] + self.context + 1]
            yield _window_batch(windows, self.pad_id)

    def __len__(self) -> int:
        return self.batches_needed
