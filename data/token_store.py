"""The token store: each split's tokens as one flat file on disk, built once, read as a memory map.

A store is a directory under `<dataset.cache_dir>/tokens/`, named by a hash of everything its bytes depend on (the
source's fingerprint, the tokenizer's fingerprint, the format version). For each split it holds

    <split>.tokens    every document's ids followed by <EOS>, concatenated (uint16 if the vocabulary fits, else uint32)
    <split>.docs      int64 end offset of each document in <split>.tokens (its boundaries)

and `store.json`, written last, which names the inputs and the sizes. Only a directory whose `store.json` matches
what the run expects, with files of the recorded sizes, is used; anything else is built (again).

Building is split into chunks of documents, each a unit of work that writes its shard files and then a small
`chunk-<k>.json` marker, all by write-to-temporary-then-rename: a build killed at any moment leaves only whole
chunks with markers (trusted) and temporaries (ignored), so the next build skips the finished chunks and ends with the
same bytes. In a run of several processes, chunk k is built by process k mod P; process 0 waits for every marker,
joins the shards into the split files and writes `store.json`, while the others wait for it. Which documents make a
chunk does not depend on the number of processes, so the store's bytes do not either.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.files import wait_for, write_atomic

STORE_VERSION = "token-store-v1"
COPY_BLOCK = 64 << 20  # bytes per read when shards are joined: constant memory whatever the corpus size


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32)


def store_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps({"version": STORE_VERSION, **inputs}, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class TokenStore:
    """An opened store: `tokens(split)` and `document_ends(split)` are read-only memory maps."""

    root: Path
    meta: dict

    @property
    def splits(self) -> list[str]:
        return list(self.meta["splits"])

    def tokens(self, split: str) -> np.ndarray:
        return _memmap(self.root / f"{split}.tokens", np.dtype(self.meta["dtype"]))

    def document_ends(self, split: str) -> np.ndarray:
        return _memmap(self.root / f"{split}.docs", np.dtype(np.int64))

    def text_bytes(self, split: str) -> int:
        """UTF-8 bytes of text the split's tokens stand for (special tokens count 0)."""
        return int(self.meta["splits"][split]["bytes"])


def _memmap(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:  # numpy cannot map an empty file
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def open_store(root: Path, inputs: dict) -> TokenStore | None:
    """The store at `root` if it is complete and was built from `inputs`; None when it must be built."""
    try:
        meta = json.loads((root / "store.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("version") != STORE_VERSION or meta.get("inputs") != inputs:
        return None
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split, info in meta["splits"].items():
        sizes = {f"{split}.tokens": info["tokens"] * itemsize, f"{split}.docs": info["documents"] * 8}
        for name, size in sizes.items():
            path = root / name
            if not path.exists() or path.stat().st_size != size:
                return None
    return TokenStore(root, meta)


def clear_stale(root: Path, process_index: int, wait_s: float) -> None:
    """A store.json that does not verify (another tokenizer's, half-overwritten, a file missing) means the
    directory's contents are not to be trusted: process 0 deletes them, store.json last; the others wait until it
    is gone before they build anything there."""
    stale = root / "store.json"
    if not stale.exists():
        return
    if process_index == 0:
        for path in root.iterdir():
            if path != stale:
                path.unlink()
        stale.unlink()
        return
    wait_for(
        lambda: None if stale.exists() else True,
        wait_s,
        f"dataset: waited {wait_s:.0f} s for process 0 to clear the stale token store {root}",
    )


# --- building -------------------------------------------------------------------------------------------------------

Encode = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]  # texts -> (ids with <EOS> after each, lengths)


@dataclass
class Chunk:
    """A unit of the build: `texts()` yields (split, batch of document texts) in the order they are stored."""

    index: int
    texts: Callable[[], Iterator[tuple[str, list[str]]]]


@dataclass
class BuildContext:
    root: Path
    inputs: dict
    splits: list[str]
    encode: Encode
    token_bytes: np.ndarray  # [vocab] bytes of text per id
    dtype: np.dtype
    process_index: int = 0
    process_count: int = 1
    wait_s: float = 6 * 3600
    progress: Callable[[int, int], None] | None = None  # (documents, tokens) of each finished chunk

    def chunk_done(self, k: int) -> dict | None:
        try:
            return json.loads((self.root / f"chunk-{k:05d}.json").read_text())
        except (OSError, ValueError):
            return None


def build_chunk(ctx: BuildContext, chunk: Chunk, extra: Callable[[dict], dict] | None = None) -> dict:
    """Tokenise one chunk into a shard per split, appending batch by batch (memory bounded by a batch, not a
    chunk), then write its marker: the counts per split and `extra(counts)`. Returns the marker."""
    counts = {s: {"tokens": 0, "documents": 0, "bytes": 0} for s in ctx.splits}
    files: dict[str, tuple] = {}
    try:
        for split, texts in chunk.texts():
            if not texts:
                continue
            tokens, lens = ctx.encode(texts)
            if split not in files:
                names = [ctx.root / f"{split}.shard-{chunk.index:05d}.{ext}" for ext in ("tokens", "lens")]
                tmps = [p.with_name(f"{p.name}.tmp{os.getpid()}") for p in names]
                files[split] = (names, tmps, [open(t, "wb") for t in tmps])
            out_tokens, out_lens = files[split][2]
            out_tokens.write(tokens.astype(ctx.dtype, copy=False).tobytes())
            out_lens.write(lens.astype(np.int64, copy=False).tobytes())
            c = counts[split]
            c["tokens"] += len(tokens)
            c["documents"] += len(lens)
            c["bytes"] += int(ctx.token_bytes[tokens].sum(dtype=np.int64))
    finally:
        for _, _, handles in files.values():
            for f in handles:
                f.flush()
                os.fsync(f.fileno())
                f.close()
    for names, tmps, _ in files.values():
        for tmp, name in zip(tmps, names):
            os.replace(tmp, name)
    marker = {"splits": counts, "process": ctx.process_index, **(extra(counts) if extra else {})}
    write_atomic(ctx.root / f"chunk-{chunk.index:05d}.json", json.dumps(marker).encode())
    if ctx.progress:
        ctx.progress(sum(c["documents"] for c in counts.values()), sum(c["tokens"] for c in counts.values()))
    return marker


def build_chunks(ctx: BuildContext, chunks: Iterable[Chunk]) -> None:
    """This process's share of `chunks` (index mod process count), skipping the ones already built.

    Only process 0 builds under the build's lock (data/packing.py): another process of a run may still be building
    when another run (a sweep's job wanting the same store) finishes the store and its clean-up takes the chunks'
    files, this process's half-written ones too. It then stops, and opens the finished store (finish_store)."""
    for chunk in chunks:
        if chunk.index % ctx.process_count != ctx.process_index or ctx.chunk_done(chunk.index) is not None:
            continue
        if ctx.process_index and open_store(ctx.root, ctx.inputs) is not None:
            return
        try:
            build_chunk(ctx, chunk)
        except FileNotFoundError:
            if not ctx.process_index or open_store(ctx.root, ctx.inputs) is None:
                raise
            return


def finish_store(ctx: BuildContext, num_chunks: int) -> TokenStore:
    """Process 0: wait for every chunk, join the shards into the split files, write store.json. Other processes:
    wait for store.json. Both give up after `ctx.wait_s` with one line saying what was waited for."""
    if ctx.process_index != 0:
        return _wait_for(
            lambda: open_store(ctx.root, ctx.inputs),
            ctx,
            "process 0 to finish the token store (is dataset.cache_dir on a filesystem all processes share?)",
        )
    markers = [
        _wait_for(
            lambda k=k: ctx.chunk_done(k),
            ctx,
            f"chunk {k} of {num_chunks} from process "
            f"{k % ctx.process_count} (is dataset.cache_dir on a filesystem all processes share?)",
        )
        for k in range(num_chunks)
    ]
    built_by = [m["process"] for m in markers]
    meta: dict = {
        "version": STORE_VERSION,
        "inputs": ctx.inputs,
        "dtype": ctx.dtype.name,
        "splits": {},
        "chunks_built_by_process": {str(p): built_by.count(p) for p in sorted(set(built_by))},
    }
    for split in ctx.splits:
        _join(ctx, split, markers)
        meta["splits"][split] = {
            key: sum(m["splits"][split][key] for m in markers) for key in ("tokens", "documents", "bytes")
        }
    write_atomic(ctx.root / "store.json", json.dumps(meta, indent=1).encode())
    # The chunks, and what builds killed midway left: a join's temporaries are as large as their split. Process 0
    # of every run joins under the build's lock (data/packing.py), so none of them is being written now.
    leftovers = ["*.shard-*", "chunk-*.json*", *(f"{s}.{ext}.tmp*" for s in ctx.splits for ext in ("tokens", "docs"))]
    for path in [p for pattern in leftovers for p in ctx.root.glob(pattern)]:
        path.unlink(missing_ok=True)
    store = open_store(ctx.root, ctx.inputs)
    assert store is not None, f"the token store at {ctx.root} did not verify right after it was written"
    return store


def _join(ctx: BuildContext, split: str, markers: list[dict]) -> None:
    """Concatenate the split's shards in chunk order into <split>.tokens, and their lengths into <split>.docs."""
    parts = [k for k, m in enumerate(markers) if m["splits"][split]["documents"]]
    tmp_tokens = ctx.root / f"{split}.tokens.tmp{os.getpid()}"
    tmp_docs = ctx.root / f"{split}.docs.tmp{os.getpid()}"
    offset = 0
    with open(tmp_tokens, "wb") as tokens_out, open(tmp_docs, "wb") as docs_out:
        for k in parts:
            with open(ctx.root / f"{split}.shard-{k:05d}.tokens", "rb") as f:
                while block := f.read(COPY_BLOCK):
                    tokens_out.write(block)
            lens = np.fromfile(ctx.root / f"{split}.shard-{k:05d}.lens", dtype=np.int64)
            docs_out.write((offset + np.cumsum(lens)).tobytes())
            offset += int(lens.sum())
        for f in (tokens_out, docs_out):
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp_tokens, ctx.root / f"{split}.tokens")
    os.replace(tmp_docs, ctx.root / f"{split}.docs")


def _wait_for(get: Callable, ctx: BuildContext, what: str):
    return wait_for(
        get,
        ctx.wait_s,
        f"dataset: waited {ctx.wait_s:.0f} s for {what}; raise "
        f"dataset.build_timeout_s or delete {ctx.root} to build it again",
    )
