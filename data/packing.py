"""Documents -> one token stream per split -> windows of context+1 tokens -> batches.

Each document is tokenised and followed by `<EOS>`; a split is the concatenation of its documents, kept in the token
store (data/token_store.py: built once, read as a memory map, so a process holds its batches, not its corpus). A
batch is `inputs`, `targets` (inputs shifted by one) and `loss_mask` (1 where the target counts).

Training batches are a pure function of (seed, step, process): sample g of the run is window perm_e[g mod W] of epoch
e = g div W, where W is the number of windows and perm_e (data/shuffle.py: evaluated per index, never materialised)
and the epoch's start offset come from (seed, e). Nothing about the position in the data lives in an iterator, so a
resumed run reads exactly the batches it would have read.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import datasets
import numpy as np

from data.shuffle import IndexShuffle
from data.sources import TextCorpus
from data.token_store import (BuildContext, Chunk, TokenStore, build_chunk, build_chunks, clear_stale, finish_store,
                              open_store, store_key, token_dtype)
from data.tokenizers import Tokenizer

STREAM_SPLITS = ("train", "val", "test")

ENCODE_BATCH_DOCS = 64  # documents per encode_batch call while building a token store


def tokenized_corpus(corpus: TextCorpus, tokenizer: Tokenizer, d: Any, process_index: int = 0,
                     process_count: int = 1) -> TokenStore:
    """The corpus's token store for this tokenizer: opened when it exists, built (by all processes) when not."""
    inputs = {"corpus": corpus.fingerprint, "tokenizer": tokenizer.fingerprint(), "docs_per_chunk": d.docs_per_chunk}
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in corpus.label)[:40]
    root = Path(d.cache_dir) / "tokens" / f"{slug}-{store_key(inputs)}"
    store = open_store(root, inputs)
    if store is not None:
        return store
    root.mkdir(parents=True, exist_ok=True)
    clear_stale(root, process_index, d.build_timeout_s)
    bar = _BuildProgress(corpus.label) if process_index == 0 else None
    splits = list(STREAM_SPLITS) if corpus.stream else list(corpus.datasets)
    ctx = BuildContext(root, inputs, splits, tokenizer.encode_documents, tokenizer.token_byte_lengths(),
                       token_dtype(tokenizer.vocab_size), process_index, process_count, d.build_timeout_s,
                       progress=bar.advance if bar else None)
    try:
        if corpus.stream is None:
            chunks = _dataset_chunks(corpus.datasets, d.docs_per_chunk)
            build_chunks(ctx, chunks)
            return finish_store(ctx, len(chunks))
        num_chunks = _build_stream(ctx, corpus, d) if process_index == 0 else 0
        return finish_store(ctx, num_chunks)
    finally:
        if bar:
            bar.close()


def _dataset_chunks(splits: dict[str, datasets.Dataset], docs_per_chunk: int) -> list[Chunk]:
    """Each split in runs of `docs_per_chunk` documents (Dataset.shard, contiguous): the same chunks whatever the
    number of processes that build them."""
    chunks = []
    for split, ds in splits.items():
        n = max(-(-len(ds) // docs_per_chunk), 1)
        for j in range(n):
            chunks.append(Chunk(len(chunks), functools.partial(_shard_texts, split, ds, n, j)))
    return chunks


def _shard_texts(split: str, ds: datasets.Dataset, num_shards: int, index: int) -> Iterator[tuple[str, list[str]]]:
    for batch in ds.shard(num_shards=num_shards, index=index, contiguous=True).iter(batch_size=ENCODE_BATCH_DOCS):
        yield split, [t for t in batch["text"] if t]  # an empty row (a blank line) is not a document


def _build_stream(ctx: BuildContext, corpus: TextCorpus, d: Any) -> int:
    """Read the stream into chunks of `docs_per_chunk` rows until it ends or dataset.max_tokens is reached, going
    on after the last chunk a previous build finished. Returns the number of chunks."""
    k, state, total = 0, None, 0
    while (marker := ctx.chunk_done(k)) is not None:
        k, state = k + 1, marker["state"]
        total += sum(v["tokens"] for v in marker["splits"].values())
        if marker["last"]:
            return k
    stream = corpus.stream(state)
    rows = iter(stream)
    while True:
        taken = list(itertools.islice(rows, d.docs_per_chunk))
        buffers: dict[str, list[str]] = {}
        for split, text in taken:
            if text:
                buffers.setdefault(split, []).append(text)

        def texts(buffers=buffers):
            for split, docs in buffers.items():
                for i in range(0, len(docs), ENCODE_BATCH_DOCS):
                    yield split, docs[i : i + ENCODE_BATCH_DOCS]

        def position(counts: dict, state=stream.state(), ended=len(taken) < d.docs_per_chunk) -> dict:
            """Where the stream stands after this chunk (a resumed build goes on from there) and whether it is the
            last one: the stream ended, or the tokens so far reach dataset.max_tokens."""
            tokens = total + sum(c["tokens"] for c in counts.values())
            return {"state": state, "last": ended or (d.max_tokens is not None and tokens >= d.max_tokens)}

        marker = build_chunk(ctx, Chunk(k, texts), extra=position)
        total += sum(v["tokens"] for v in marker["splits"].values())
        k += 1
        if marker["last"]:
            return k


class _BuildProgress:
    """documents, tokens and tokens/s of the build, on stderr (process 0)."""

    def __init__(self, label: str) -> None:
        from tqdm import tqdm

        self.docs = 0
        self.bar = tqdm(desc=f"tokenising {label}", unit=" tokens", unit_scale=True, file=sys.stderr,
                        dynamic_ncols=True, mininterval=1.0, delay=2.0)  # quiet for small builds

    def advance(self, documents: int, tokens: int) -> None:
        self.docs += documents
        self.bar.set_postfix_str(f"{self.docs:,} documents", refresh=False)
        self.bar.update(tokens)

    def close(self) -> None:
        self.bar.close()


def tokenize_prompts(ds: datasets.Dataset, tokenizer: Tokenizer) -> list[list[int]]:
    """Rows with `prompt` and `completion` columns -> `prompt <GENAI> completion <EOS>` id lists; cached on disk by
    datasets under a fingerprint of the rows and the tokenizer. In this process: the tokenizers batch-encode on
    threads of their own, and no worker is forked after JAX has started."""
    fingerprint = hashlib.sha256(f"{ds._fingerprint}|{tokenizer.fingerprint()}|prompt-v1".encode()).hexdigest()[:16]
    return ds.map(_encode_prompts, batched=True, batch_size=ENCODE_BATCH_DOCS, remove_columns=ds.column_names,
                  fn_kwargs={"tokenizer": tokenizer}, new_fingerprint=fingerprint)["ids"]


def _encode_prompts(batch: dict, tokenizer: Tokenizer) -> dict:
    prompts = tokenizer.encode_batch([p or "" for p in batch["prompt"]])
    completions = tokenizer.encode_batch([c or "" for c in batch["completion"]])
    return {"ids": [p + [tokenizer.genai_id] + c + [tokenizer.eos_id] for p, c in zip(prompts, completions)]}


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


def window_batch(windows: np.ndarray, pad_id: int, eos_id: int | None = None) -> dict[str, np.ndarray]:
    """[..., T+1] token windows -> inputs/targets/loss_mask of shape [..., T]; with `eos_id` (document masking) also
    `segment_ids`: the number of <EOS> before each input in its window, so a document's tokens, its <EOS> included,
    share one id."""
    inputs = windows[..., :-1].astype(np.int32)
    batch = {
        "inputs": inputs,
        "targets": windows[..., 1:].astype(np.int32),
        "loss_mask": (windows[..., 1:] != pad_id).astype(np.float32),
    }
    if eos_id is not None:
        ends = inputs == eos_id
        batch["segment_ids"] = (np.cumsum(ends, axis=-1) - ends).astype(np.int32)
    return batch


@dataclass
class TrainBatches:
    """Training batches for one process: `batch(step)` has arrays of shape [grad_accum, batch_size, context]."""

    tokens: np.ndarray
    context: int
    batch_size: int  # per process per micro-batch
    grad_accum_steps: int
    process_index: int
    process_count: int
    seed: int | tuple[int, ...]  # a mixture's sources: (run seed, source index), so each has an order of its own
    pad_id: int
    eos_id: int | None = None  # set: batches carry segment_ids (document masking)

    def __post_init__(self) -> None:
        # One window's worth of slack so that every epoch's random start offset keeps all windows in range.
        self.num_windows = (len(self.tokens) - 1 - self.context) // self.context
        if self.num_windows < 1:
            raise ValueError(f"the training split has {len(self.tokens)} tokens, fewer than two windows of {self.context}")
        self._epoch_cache: tuple[int, int, IndexShuffle] | None = None

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, all processes together."""
        return self.grad_accum_steps * self.process_count * self.batch_size

    def _epoch(self, epoch: int) -> tuple[int, IndexShuffle]:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.Generator(np.random.PCG64([*np.atleast_1d(self.seed).tolist(), epoch]))
            offset = int(rng.integers(self.context))
            self._epoch_cache = (epoch, offset, IndexShuffle(self.num_windows, rng))
        return self._epoch_cache[1], self._epoch_cache[2]

    def window_starts(self, samples: np.ndarray) -> np.ndarray:
        """Where in the split each run-wide sample number's window starts."""
        starts = np.empty(samples.shape, np.int64)
        epochs = samples // self.num_windows
        for epoch in np.unique(epochs):
            rows = epochs == epoch
            offset, order = self._epoch(int(epoch))
            starts[rows] = offset + order[samples[rows] % self.num_windows] * self.context
        return starts

    def sample_indices(self, step: int) -> np.ndarray:
        return step_samples(step, self.grad_accum_steps, self.process_count, self.batch_size, self.process_index)

    def windows(self, samples: np.ndarray) -> np.ndarray:
        """[..., context + 1] token windows of these run-wide sample numbers."""
        starts = self.window_starts(samples)
        windows = np.empty(starts.shape + (self.context + 1,), self.tokens.dtype)
        for idx, start in np.ndenumerate(starts):
            windows[idx] = self.tokens[start : start + self.context + 1]
        return windows

    def batch(self, step: int) -> dict[str, np.ndarray]:
        return window_batch(self.windows(self.sample_indices(step)), self.pad_id, self.eos_id)

    def epoch_of(self, step: int) -> float:
        return (step + 1) * self.global_batch / self.num_windows


class EvalBatches:
    """A fixed evaluation set: `num_batches` x global-batch windows spread evenly over the whole split (all of its
    windows when it is short). The same windows at every evaluation, so the curve measures the model, not the
    sample. Rows past the last window are padding with `loss_mask` 0.

    `tokens` may also be several splits with `weights` (a mixture's sources): the set then takes from each its
    weight's share of the windows, spread evenly over that split."""

    def __init__(self, tokens: np.ndarray | list[np.ndarray], context: int, batch_size: int, num_batches: int,
                 process_index: int, process_count: int, pad_id: int, eos_id: int | None = None,
                 weights: list[float] | None = None) -> None:
        self.sources = tokens if isinstance(tokens, list) else [tokens]
        self.context, self.batch_size, self.process_index, self.process_count = (context, batch_size, process_index,
                                                                                  process_count)
        self.pad_id, self.eos_id = pad_id, eos_id  # eos_id set: batches carry segment_ids (document masking)
        per_batch = batch_size * process_count
        wanted = allot(weights or [1.0] * len(self.sources), num_batches * per_batch)
        source, starts = [], []
        for s, (split, n) in enumerate(zip(self.sources, wanted)):
            available = max((len(split) - 1) // context, 0)
            taken = min(available, n)
            source.append(np.full(taken, s))
            starts.append(np.arange(taken) * available // max(taken, 1) * context)
        self.window_source, self.starts = np.concatenate(source), np.concatenate(starts)  # window w: where it is
        self.num_windows = len(self.starts)
        self.batches_needed = -(-self.num_windows // per_batch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        per_batch = self.batch_size * self.process_count
        for b in range(self.batches_needed):
            rows = b * per_batch + self.process_index * self.batch_size + np.arange(self.batch_size)
            windows = np.full((self.batch_size, self.context + 1), self.pad_id, self.sources[0].dtype)
            for r, w in enumerate(rows):
                if w < self.num_windows:
                    start = self.starts[w]
                    windows[r] = self.sources[self.window_source[w]][start : start + self.context + 1]
            yield window_batch(windows, self.pad_id, self.eos_id)

    def __len__(self) -> int:
        return self.batches_needed


def allot(weights: list[float], total: int) -> list[int]:
    """`total` split in proportion to `weights`, rounded by largest remainder so the parts sum to `total`."""
    shares = np.asarray(weights, np.float64) / float(np.sum(weights)) * total
    parts = np.floor(shares).astype(np.int64)
    order = np.argsort(-(shares - parts), kind="stable")  # ties: the earlier source first
    parts[order[: total - int(parts.sum())]] += 1
    return parts.tolist()
