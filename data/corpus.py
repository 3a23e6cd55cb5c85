"""`dataset.source` -> the loader of its corpus: one table for every source, text and notes.

`load_corpus(cfg.dataset)` returns what the source's loader gives: a `TextCorpus` for text (data/sources.py), a
`ShardCorpus` for token shards (data/token_shards.py),
`{split: datasets.Dataset}` of pieces for notes (data/note_sources.py); source=mixture gives a `MixtureCorpus` of the
text corpora of its sources.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from core.errors import DataError
from data.config import DatasetConfig, TextConfig, TokenShardsConfig
from data.note_sources import maestro_corpus, midi_files_corpus, music21_corpus
from data.sources import MixtureCorpus, TextCorpus, hub_corpus, json_files_corpus, pystdlib_corpus, text_files_corpus
from data.token_shards import ShardCorpus, shard_files

if TYPE_CHECKING:
    import datasets


def token_shards_corpus(d: TokenShardsConfig) -> ShardCorpus:
    """The shard files of each split (the training ones up to max_train_shards), named in order; nothing is read."""
    hint = (
        f"get the shards with `python -m scripts.tools.download_fineweb --shards 8 --folder {d.folder}` (the Hugging "
        "Face dataset kjj0/fineweb10B-gpt2; needs the network), or point dataset.folder at them"
    )
    train = shard_files(d.folder, d.train_files, d.name, hint)[: d.max_train_shards]
    val = shard_files(d.folder, d.val_files, d.name, hint)
    if both := sorted(set(map(os.path.realpath, train)) & set(map(os.path.realpath, val))):
        named = ", ".join(os.path.basename(f) for f in both[:3]) + (
            f" and {len(both) - 3} more" if len(both) > 3 else ""
        )
        raise DataError(
            f"dataset {d.name}: dataset.train_files={d.train_files} and dataset.val_files={d.val_files} both match "
            f"{named}: validation would score data the model trains on; narrow one of the two patterns"
        )
    # val_tokens targets, as the speedrun scores them: the first val_tokens + 1 tokens (a window reads one past its end)
    val_limit = None if d.val_tokens is None else d.val_tokens + 1
    return ShardCorpus(d.name, {"train": train, "val": val}, {"val": val_limit})


TEXT_SOURCES: dict[str, Callable[..., TextCorpus | ShardCorpus]] = {  # each takes its source's section
    "pystdlib": pystdlib_corpus,
    "text_files": text_files_corpus,
    "json_files": json_files_corpus,
    "hf": hub_corpus,
    "token_shards": token_shards_corpus,
}
NOTE_SOURCES: dict[str, Callable[..., dict[str, datasets.Dataset]]] = {
    "music21": music21_corpus,
    "maestro": maestro_corpus,
    "midi_files": midi_files_corpus,
}
LOADERS = {**TEXT_SOURCES, **NOTE_SOURCES}


def load_corpus(
    d: DatasetConfig, mixture: list[tuple[str, float, TextConfig]] = ()
) -> TextCorpus | MixtureCorpus | dict:
    """The corpus of the dataset section `d`; for source=mixture, `mixture` holds each source's name, weight and
    dataset section (training/config/mixture.py `mixture_sources`)."""
    if d.source == "mixture":
        return MixtureCorpus(
            [n for n, _, _ in mixture],
            [w for _, w, _ in mixture],
            [load_corpus(c) for _, _, c in mixture],
            [c for _, _, c in mixture],
        )
    return LOADERS[d.source](d)
