"""Token shards in llm.c's format, the one the modded-nanogpt speedrun caches FineWeb10B in (the Hugging Face dataset
kjj0/fineweb10B-gpt2): a 1,024-byte header of 256 int32 (magic 20240520, version 1, the shard's token count, the rest
0), then the tokens as uint16, every document led by <|endoftext|>.

The shards are read in place, as memory maps: a split is the concatenation of its shards in name order, never copied
(FineWeb10B's 103 training shards are 20 GB), and only the header and the size of each file are read at start-up.
`ShardStore` answers what data/__init__.py asks of a token store (its splits, each split's tokens, the text bytes
they stand for) and `ShardedTokens` what a `Windows` asks of a split's tokens (length, dtype, slices).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import DataError

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DTYPE = np.dtype(np.uint16)
BYTES_SAMPLE = 1 << 20  # tokens of a split whose text bytes are counted; the rest is estimated from them


def write_shard(path: str | Path, tokens: np.ndarray) -> None:
    """Write `tokens` (ids < 65,536) as one shard, by temporary file and rename."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(DTYPE).max):
        raise ValueError(f"token shard {path}: ids must be in [0, 65535]")
    header = np.zeros(HEADER_INTS, np.int32)
    header[:3] = (MAGIC, VERSION, tokens.size)
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(DTYPE).tobytes())
    os.replace(partial, path)


def read_shard(path: str | Path) -> np.ndarray:
    """The shard's tokens as a read-only memory map, its header checked: one line naming the file when it is not a
    shard of this format or is cut short."""
    path = Path(path)
    size = path.stat().st_size
    header = np.fromfile(path, np.int32, HEADER_INTS) if size >= HEADER_BYTES else np.zeros(0, np.int32)
    if header.size < HEADER_INTS or header[0] != MAGIC:
        raise DataError(f"token shard {path}: not a shard of llm.c's format (no magic number {MAGIC} in its header)")
    if header[1] != VERSION:
        raise DataError(f"token shard {path}: version {header[1]}, this reader knows version {VERSION} (uint16)")
    count = int(header[2])
    if size != HEADER_BYTES + count * DTYPE.itemsize:
        raise DataError(
            f"token shard {path}: its header says {count} tokens, the file holds "
            f"{(size - HEADER_BYTES) // DTYPE.itemsize}: cut short by a download? fetch it again"
        )
    if count == 0:
        return np.zeros(0, DTYPE)
    return np.memmap(path, DTYPE, mode="r", offset=HEADER_BYTES, shape=(count,))


class ShardedTokens:
    """The concatenation of shards' tokens, sliced without copying more than the slice: `len`, `dtype`, `shape` and
    `tokens[a:b]` (a new array), as `Windows` reads a split."""

    def __init__(self, shards: list[np.ndarray], limit: int | None = None) -> None:
        shards = [s for s in shards if len(s)]  # an empty shard holds no slice (and would end one early)
        self.shards = shards
        self.starts = np.concatenate([[0], np.cumsum([len(s) for s in shards])]).astype(np.int64)
        self.length = int(self.starts[-1]) if limit is None else min(limit, int(self.starts[-1]))
        self.dtype = DTYPE

    def __len__(self) -> int:
        return self.length

    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("ShardedTokens takes contiguous slices, tokens[a:b]")
        start, stop, _ = index.indices(self.length)
        parts = []
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        for i in range(max(first, 0), len(self.shards)):
            lo, hi = max(start, self.starts[i]), min(stop, self.starts[i + 1])
            if lo >= hi:
                break
            parts.append(self.shards[i][lo - self.starts[i] : hi - self.starts[i]])
        if not parts:  # an empty slice, as a NumPy array's would be
            return np.zeros(0, self.dtype)
        return np.concatenate(parts) if len(parts) > 1 else np.array(parts[0])


@dataclass
class ShardStore:
    """A token store over shard files: {split: its tokens}, and the bytes of text per token of a split."""

    split_tokens: dict[str, ShardedTokens]
    token_bytes: np.ndarray  # [vocab] bytes of text per token id (the tokenizer's)

    @property
    def splits(self) -> list[str]:
        return list(self.split_tokens)

    def tokens(self, split: str) -> ShardedTokens:
        return self.split_tokens[split]

    def text_bytes(self, split: str) -> int:
        """The split's bytes of text, from its first BYTES_SAMPLE tokens' bytes per token (exact when shorter)."""
        tokens = self.split_tokens[split]
        sample = tokens[: min(len(tokens), BYTES_SAMPLE)]
        if not len(sample):
            return 0
        return int(round(self.token_bytes[sample].sum() * len(tokens) / len(sample)))


@dataclass(frozen=True)
class ShardCorpus:
    """A corpus of token shards: each split's shard files (sorted by name), already tokenised."""

    label: str
    files: dict[str, list[str]]  # {"train": [...], "val": [...]}
    limits: dict[str, int | None]  # tokens each split keeps from its start (val: the speedrun's first 10,485,761)

    @property
    def fingerprint(self) -> str:
        """The shards' names and sizes: a tokenizer trained on a corpus is keyed by it (shards are never trained on)."""
        return "shards-v1|" + "|".join(f"{f}:{os.path.getsize(f)}" for split in self.files.values() for f in split)

    def train_texts(self):
        raise DataError(f"dataset {self.label}: token shards hold token ids, not text; a BPE cannot be trained on them")

    def store(self, vocab_size: int, token_bytes: np.ndarray) -> ShardStore:
        """Every shard opened (headers checked), and no id at or past the tokenizer's vocabulary in the first
        BYTES_SAMPLE tokens of each shard (a shard of another tokenizer fails here, not as a gather out of range or a
        NaN loss at the step that reaches it: 2 MB read of each 200 MB shard of fineweb10b)."""
        split_tokens = {}
        for split, files in self.files.items():
            shards = [read_shard(f) for f in files]
            for file, shard in zip(files, shards):
                if len(shard) and (top := int(shard[:BYTES_SAMPLE].max())) >= vocab_size:
                    raise DataError(
                        f"token shard {file}: holds id {top}, past the tokenizer's {vocab_size} ids: choose the "
                        "tokenizer the shards were written with (dataset.tokenizer)"
                    )
            split_tokens[split] = ShardedTokens(shards, self.limits.get(split))
        return ShardStore(split_tokens, token_bytes)


def shard_files(folder: str, pattern: str, what: str, download_hint: str) -> list[str]:
    """The files of `folder` matching `pattern`, sorted; one line naming the folder, the pattern and how to get them
    when there are none."""
    root = Path(folder).expanduser()
    files = sorted(glob.glob(str(root / pattern)))
    if not files:
        where = f"{root} holds no {pattern}" if root.is_dir() else f"{root} does not exist"
        raise DataError(f"dataset {what}: {where}; {download_hint}")
    return files
