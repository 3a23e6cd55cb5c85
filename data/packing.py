"""Documents -> one token stream per split, kept in the token store; prompt/completion rows -> token id records.

Each document is tokenised and followed by `<EOS>`; a split is the concatenation of its documents, kept in the token
store (data/token_store.py: built once, read as a memory map, so a process holds its batches, not its corpus) and cut
into windows by data/examples.py `Windows`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.files import exclusive
from data.config import HfConfig, TextConfig
from data.sources import TextCorpus
from data.token_store import (
    BuildContext,
    Chunk,
    TokenStore,
    build_chunk,
    build_chunks,
    clear_stale,
    finish_store,
    open_store,
    store_key,
    token_dtype,
)
from data.tokenizers import Tokenizer

if TYPE_CHECKING:
    import datasets

STREAM_SPLITS = ("train", "val", "test")

ENCODE_BATCH_DOCS = 64  # documents per encode_batch call while building a token store


def tokenized_corpus(
    corpus: TextCorpus, tokenizer: Tokenizer, d: TextConfig, process_index: int = 0, process_count: int = 1
) -> TokenStore:
    """The corpus's token store for this tokenizer: opened when it exists, built (by all processes) when not."""
    inputs = {"corpus": corpus.fingerprint, "tokenizer": tokenizer.fingerprint(), "docs_per_chunk": d.docs_per_chunk}
    slug, key = "".join(c if c.isalnum() or c in "-_." else "_" for c in corpus.label)[:40], store_key(inputs)
    stores = Path(d.cache_dir) / "tokens"
    root = stores / f"{slug}-{key}"
    # The label names the folder for people; the key says what it holds: the same files under another name (another
    # dataset.name, a mixture's source name) open the store already built, not a copy tokenised again. In a run of
    # one process only: the processes of a run must agree on one folder, and another run's store finishing between
    # their lookups would leave one building and the other reading elsewhere, each waiting on the other.
    others = sorted(p for p in stores.glob(f"*-{key}") if p != root) if process_count == 1 else []
    for other in [root, *others]:
        if (store := open_store(other, inputs)) is not None:
            return store
    root.mkdir(parents=True, exist_ok=True)
    # Process 0 of each run builds under a lock, so that two runs wanting the same store at once (a sweep's jobs)
    # do not build it over each other: the second waits, then opens what the first built. The lock file sits beside
    # the store's folder, which a stale build's clean-up empties.
    lock = (
        exclusive(
            root.with_name(root.name + ".lock"),
            d.build_timeout_s,
            f"token store: another run is building {root}; waiting for it",
            f"dataset: waited {d.build_timeout_s:.0f} s for another run building the token store {root}; "
            "raise dataset.build_timeout_s or remove that run",
        )
        if process_index == 0
        else contextlib.nullcontext()
    )
    with lock:
        return open_store(root, inputs) or _build_store(
            root, inputs, corpus, tokenizer, d, process_index, process_count
        )


def _build_store(
    root: Path,
    inputs: dict,
    corpus: TextCorpus,
    tokenizer: Tokenizer,
    d: TextConfig,
    process_index: int,
    process_count: int,
) -> TokenStore:
    clear_stale(root, process_index, d.build_timeout_s)
    bar = _BuildProgress(corpus.label) if process_index == 0 else None
    splits = list(STREAM_SPLITS) if corpus.stream else list(corpus.datasets)
    ctx = BuildContext(
        root,
        inputs,
        splits,
        tokenizer.encode_documents,
        tokenizer.token_byte_lengths(),
        token_dtype(tokenizer.vocab_size),
        process_index,
        process_count,
        d.build_timeout_s,
        progress=bar.advance if bar else None,
    )
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


def _build_stream(ctx: BuildContext, corpus: TextCorpus, d: HfConfig) -> int:
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
        self.bar = tqdm(
            desc=f"tokenising {label}",
            unit=" tokens",
            unit_scale=True,
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=1.0,
            delay=2.0,
        )  # quiet for small builds

    def advance(self, documents: int, tokens: int) -> None:
        self.docs += documents
        self.bar.set_postfix_str(f"{self.docs:,} documents", refresh=False)
        self.bar.update(tokens)

    def close(self) -> None:
        self.bar.close()


def tokenize_prompts(ds: datasets.Dataset, tokenizer: Tokenizer) -> tuple[Sequence[list[int]], np.ndarray]:
    """Rows with `prompt` and `completion` columns -> `prompt <GENAI> completion <EOS>` id lists, and where each
    row's `<GENAI>` is (its prompt's length in tokens); cached on disk by datasets under a fingerprint of the rows and
    the tokenizer. In this process: the tokenizers batch-encode on threads of their own, and no worker is forked
    after JAX has started."""
    fingerprint = hashlib.sha256(f"{ds._fingerprint}|{tokenizer.fingerprint()}|prompt-v2".encode()).hexdigest()[:16]
    rows = ds.map(
        _encode_prompts,
        batched=True,
        batch_size=ENCODE_BATCH_DOCS,
        remove_columns=ds.column_names,
        fn_kwargs={"tokenizer": tokenizer},
        new_fingerprint=fingerprint,
    )
    return rows["ids"], rows.data.column("genai_at").to_numpy()


def _encode_prompts(batch: dict, tokenizer: Tokenizer) -> dict:
    prompts = tokenizer.encode_batch([p or "" for p in batch["prompt"]])
    completions = tokenizer.encode_batch([c or "" for c in batch["completion"]])
    return {
        "ids": [p + [tokenizer.genai_id] + c + [tokenizer.eos_id] for p, c in zip(prompts, completions)],
        "genai_at": [len(p) for p in prompts],
    }
