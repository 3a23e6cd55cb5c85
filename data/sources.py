"""Where documents come from: the Python standard library (embedded default), the user's files, or the HF Hub.

`load_corpus(cfg.dataset)` returns `{split name: datasets.Dataset}` with one `text` column and one document per row:
`train`, `val` (the main validation split), any extra validation splits, and `test` when there is one. Sources without
their own splits are split deterministically by a hash of each document's identity (a path, or a row index), so the
same files always land in the same split.
"""

from __future__ import annotations

import glob
import hashlib
import os
import socket
import sysconfig
from pathlib import Path
from typing import Any

import datasets

from training.errors import DataError
from training.secrets import secret

# Directories of the standard library that hold tests or bundled third-party code, not the library itself.
STDLIB_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
TEXT_ENCODING_ERRORS = "replace"  # a few files are not UTF-8; keep them, with U+FFFD where a byte is invalid


def load_corpus(d: Any) -> dict[str, datasets.Dataset]:
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    if d.source in ("music21", "maestro", "midi_files"):
        from data.note_sources import load_note_corpus

        return load_note_corpus(d)
    if d.source == "pystdlib":
        corpus = _pystdlib(d)
    elif d.source == "text_files":
        corpus = _text_files(d)
    elif d.source == "json_files":
        corpus = _json_files(d)
    else:
        corpus = _hub(d)
    if d.max_documents is not None:
        corpus = {k: v.select(range(min(len(v), d.max_documents))) for k, v in corpus.items()}
    for name in ("train", "val"):
        if len(corpus.get(name, [])) == 0:
            raise DataError(f"dataset {d.name}: the {name} split is empty; add documents or raise dataset.val_fraction")
    return corpus


def split_of(identity: str, val_fraction: float, test_fraction: float) -> str:
    """train / val / test for a document, from a hash of its identity: stable across runs and machines."""
    u = int(hashlib.sha256(identity.encode()).hexdigest()[:12], 16) / 16**12
    if u < val_fraction:
        return "val"
    if u < val_fraction + test_fraction:
        return "test"
    return "train"


def stdlib_files() -> tuple[Path, list[Path]]:
    """The running Python's standard library: every .py file outside tests and site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if not STDLIB_EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    return root, files


def _pystdlib(d: Any) -> dict[str, datasets.Dataset]:
    root, files = stdlib_files()
    if not files:
        raise DataError(f"dataset pystdlib: no .py files found under {root}; use dataset=text_files instead")
    packages = {p.relative_to(root).parts[0].removesuffix(".py") for p in files}
    missing = [name for name in d.extra_val_splits if name not in packages]
    if missing:
        raise DataError(
            f"dataset.extra_val_splits: {', '.join(missing)} not in this Python's standard library ({root})"
        )
    by_split: dict[str, list[str]] = {}
    for path in files:
        rel = path.relative_to(root)
        package = rel.parts[0].removesuffix(".py")
        name = package if package in d.extra_val_splits else split_of(rel.as_posix(), d.val_fraction, d.test_fraction)
        by_split.setdefault(name, []).append(str(path))
    return _load_text_files(by_split, d, sample_by="document")


def _text_files(d: Any) -> dict[str, datasets.Dataset]:
    everything = _load_text_files({"documents": expand_files(d.files)}, d, sample_by="document")["documents"]
    return _hash_split(everything, d)


def _json_files(d: Any) -> dict[str, datasets.Dataset]:
    """JSON / JSON-lines files (datasets' `json` loader): one row per object, split by a hash of the row index."""
    loaded = datasets.load_dataset("json", data_files=expand_files(d.files), cache_dir=str(Path(d.cache_dir) / "hf"))
    return {name: _text_column(ds, d, label="dataset.files") for name, ds in _hash_split(loaded["train"], d).items()}


def expand_files(patterns: list[str]) -> list[str]:
    """`dataset.files`: paths, directories (every file under them) or globs -> sorted file paths."""
    paths: list[str] = []
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if os.path.isdir(expanded):
            matches = [str(p) for p in sorted(Path(expanded).rglob("*")) if p.is_file()]
        else:
            matches = sorted(glob.glob(expanded, recursive=True))
        if not matches:
            raise DataError(f"dataset.files: {pattern!r} matches no file")
        paths.extend(m for m in matches if os.path.isfile(m))
    return sorted(set(paths))


def _load_text_files(by_split: dict[str, list[str]], d: Any, sample_by: str) -> dict[str, datasets.Dataset]:
    """datasets' own `text` loader, one document per file, cached under dataset.cache_dir."""
    loaded = datasets.load_dataset(
        "text",
        data_files=by_split,
        sample_by=sample_by,
        encoding_errors=TEXT_ENCODING_ERRORS,
        cache_dir=str(Path(d.cache_dir) / "hf"),
    )
    return {name: loaded[name] for name in by_split}


def _hash_split(ds: datasets.Dataset, d: Any) -> dict[str, datasets.Dataset]:
    """Split rows by a hash of their index (for sources that come as one split)."""
    labels = [split_of(f"row-{i}", d.val_fraction, d.test_fraction) for i in range(len(ds))]
    out = {}
    for name in ("train", "val", "test"):
        rows = [i for i, label in enumerate(labels) if label == name]
        if rows:
            out[name] = ds.select(rows)
    return out


def hub_reachable(host: str = "huggingface.co") -> bool:
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def offline_hub() -> None:
    """Without this, huggingface_hub retries for ~25 s when the Hub is unreachable; offline mode still reads a
    local cache and local folders."""
    import huggingface_hub.constants

    datasets.config.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True


def _hub(d: Any) -> dict[str, datasets.Dataset]:
    if not hub_reachable():
        offline_hub()
    label = d.hf_path + (f" ({d.hf_name})" if d.hf_name else "")
    kwargs = dict(
        path=d.hf_path, name=d.hf_name, cache_dir=str(Path(d.cache_dir) / "hf"), token=secret("HF_TOKEN")
    )
    try:
        if d.streaming:
            return _hub_streamed(d, kwargs)
        splits = {"train": d.train_split, "val": d.val_split, "test": d.test_split}
        corpus = {}
        for name, hf_split in splits.items():
            if hf_split is not None:
                corpus[name] = _text_column(datasets.load_dataset(split=hf_split, **kwargs), d)
    except DataError:
        raise
    except Exception as e:  # the Hub raises many types: connection, offline mode, not found, gated, bad config
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise DataError(
            f"dataset {label}: could not load it from the Hugging Face Hub: {reason}. Offline? Use dataset=pystdlib "
            "or dataset=text_files dataset.files=[...], or download it once online (it is then read from "
            f"{d.cache_dir}/hf)"
        ) from None
    if d.val_split is None:
        held_out = _hash_split(corpus.pop("train"), d)
        corpus = {**held_out, **{k: v for k, v in corpus.items() if k not in held_out}}
    return corpus


def _hub_streamed(d: Any, kwargs: dict) -> dict[str, datasets.Dataset]:
    """Read the first max_documents documents of a streamed split into a cached Arrow dataset, then hash-split."""
    stream = datasets.load_dataset(split=d.train_split, streaming=True, **kwargs)

    def documents(path: str, name: str | None, split: str, n: int, column: str):
        for row in stream.take(n):
            yield {"text": row[column]}

    taken = datasets.Dataset.from_generator(
        documents,
        gen_kwargs=dict(path=d.hf_path, name=d.hf_name, split=d.train_split, n=d.max_documents, column=d.text_column),
        cache_dir=kwargs["cache_dir"],
    )
    return _hash_split(taken, d)


def _text_column(ds: datasets.Dataset, d: Any, label: str | None = None) -> datasets.Dataset:
    """The column(s) the run reads, renamed to `text`, or to `prompt` and `completion` for fine-tuning records."""
    wanted = {"prompt_column": "prompt", "completion_column": "completion"} if d.prompt_column else {"text_column": "text"}
    for key in wanted:
        if d[key] not in ds.column_names:
            raise DataError(f"dataset.{key}: {d[key]!r} is not a column of {label or d.hf_path}; it has "
                            f"{', '.join(ds.column_names)}")
    ds = ds.select_columns([d[key] for key in wanted])
    return ds.rename_columns({d[key]: new for key, new in wanted.items() if d[key] != new})
