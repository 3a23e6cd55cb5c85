"""Where text comes from: the Python standard library (embedded default), the user's files, or the HF Hub.

Each loader (`pystdlib_corpus`, `text_files_corpus`, `json_files_corpus`, `hub_corpus`; data/corpus.py picks one by
`dataset.source`) returns a `TextCorpus`: a cheap fingerprint of the documents, and `datasets` giving
`{split name: datasets.Dataset}` with one `text` column and one document per row (read only when needed): `train`,
`val` (the main validation split), any extra validation splits, and `test` when there is one; or, for a streamed Hub
corpus, a resumable stream of (split, text). Sources without their own splits are split deterministically by a hash
of each document's identity (a path, or a row number), so the same files always land in the same split.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import DataError, first_line
from core.hf_datasets import hf_datasets
from core.hub import hub_reachable, offline_hub
from core.secrets import secret
from data.config import (
    DatasetConfig,
    HfConfig,
    JsonFilesConfig,
    PystdlibConfig,
    RecordsConfig,
    TextConfig,
    TextFilesConfig,
)
from data.files import expand_files, file_stamps, named_files

if TYPE_CHECKING:
    import datasets

# Directories of the standard library that hold tests or bundled third-party code, not the library itself.
STDLIB_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
# datasets writes its Arrow cache every this many rows (default 10,000); a row here is a whole file, so the default
# held up to 10,000 files in memory: 840 MB of anonymous memory for 1 GB of 256 KB files, against 127 MB with 16.
FILES_PER_ARROW_WRITE = 16
TEXT_ENCODING_ERRORS = "replace"  # a few files are not UTF-8; keep them, with U+FFFD where a byte is invalid


@dataclass
class TextCorpus:
    """A text source before tokenising. `fingerprint` identifies its documents and their split cheaply (file
    sizes and times, the Hub's own fingerprint, or the stream's settings), so that a run whose token store exists
    starts without reading the documents; `datasets` reads them, once, only when something needs them."""

    label: str
    fingerprint: str
    load: Callable[[], dict[str, datasets.Dataset]] | None  # {split: Dataset with a `text` (or prompt) column}
    stream: Callable[[dict | None], HubStream] | None = None  # streamed sources: rows from a saved state on
    _loaded: dict[str, datasets.Dataset] | None = None

    @property
    def datasets(self) -> dict[str, datasets.Dataset]:
        if self._loaded is None:
            self._loaded = _checked(self.load(), self.label)
        return self._loaded

    def train_texts(self) -> Iterator[str]:
        """What a BPE learns from: the train split's documents, or its prompts and completions."""
        for batch in self.datasets["train"].iter(batch_size=1024):
            if "text" in batch:
                yield from batch["text"]
            else:
                yield from (t for pair in zip(batch["prompt"], batch["completion"]) for t in pair if t)


@dataclass
class MixtureCorpus:
    """dataset.source=mixture: several text sources, each with its name, weight and own dataset section."""

    names: list[str]
    weights: list[float]
    parts: list[TextCorpus]
    configs: list[TextConfig]

    @property
    def label(self) -> str:
        return "+".join(self.names)

    @property
    def fingerprint(self) -> str:
        return _fingerprint("mixture-v1", [(n, c.fingerprint) for n, c in zip(self.names, self.parts)])

    def train_texts(self) -> Iterator[str]:
        for part in self.parts:
            yield from part.train_texts()


def _checked(corpus: dict[str, datasets.Dataset], label: str) -> dict[str, datasets.Dataset]:
    # Where a source splits its documents by hash, the fractions decide which split is left empty.
    fix = {"train": "lower dataset.val_fraction and dataset.test_fraction", "val": "raise dataset.val_fraction"}
    for name in ("train", "val"):
        if len(corpus.get(name, [])) == 0:
            raise DataError(f"dataset {label}: the {name} split is empty; add documents or {fix[name]}")
    return corpus


def _capped(corpus: dict[str, datasets.Dataset], d: DatasetConfig) -> dict[str, datasets.Dataset]:
    if d.max_documents is None:
        return corpus
    return {k: v.select(range(min(len(v), d.max_documents))) for k, v in corpus.items()}


def _fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
    files = []
    for folder, subfolders, names in os.walk(root):  # excluded folders are not entered: site-packages can be huge
        subfolders[:] = [name for name in subfolders if name not in STDLIB_EXCLUDED_DIRS]
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    return root, sorted(files)


def pystdlib_corpus(d: PystdlibConfig) -> TextCorpus:
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
    return _file_corpus("pystdlib", by_split, d)


def text_files_corpus(d: TextFilesConfig) -> TextCorpus:
    """One document per file; a file's split is a hash of its name below its pattern's directory (files.named_files),
    so adding a file moves no other one, and another spelling of the same folder (absolute, relative) moves none."""
    by_split: dict[str, list[str]] = {}
    for path, name in sorted(named_files(d.files).items()):
        by_split.setdefault(split_of(name, d.val_fraction, d.test_fraction), []).append(path)
    return _file_corpus(d.name, by_split, d)


def _file_corpus(label: str, by_split: dict[str, list[str]], d: TextConfig) -> TextCorpus:
    stamps = {name: file_stamps(paths) for name, paths in sorted(by_split.items())}
    files = _fingerprint("files-v1", stamps)
    return TextCorpus(
        label,
        _fingerprint("files-v1", stamps, d.max_documents),
        lambda: _capped(_load_text_files(by_split, d, sample_by="document", cache=_arrow_cache(d, files)), d),
    )


def _arrow_cache(d: DatasetConfig, files: str) -> str:
    """Where `datasets` keeps its Arrow copy of local files: a folder per fingerprint of their paths, sizes and times.
    `datasets` tells local files apart by path and modification time alone, so a file rewritten and given its old
    time back (`cp -p`, `rsync -a`, `tar x`) was read from its old copy, into a store built for the new one."""
    return str(Path(d.cache_dir) / "hf" / f"files-{files}")


def json_files_corpus(d: JsonFilesConfig) -> TextCorpus:
    """JSON / JSON-lines files (datasets' `json` loader): one row per object, split by a hash of the row index."""
    paths = expand_files(d.files)

    def load() -> dict[str, datasets.Dataset]:
        from data.file_checks import not_utf8

        try:
            return _load_json(paths, d, _arrow_cache(d, _fingerprint("json-v1", file_stamps(paths))))
        except UnicodeDecodeError as e:
            raise not_utf8(paths, e) from None

    columns = [d.text_column, d.prompt_column, d.completion_column]
    return TextCorpus(
        d.name,
        _fingerprint("json-v1", file_stamps(paths), columns, d.val_fraction, d.test_fraction, d.max_documents),
        load,
    )


def _load_json(paths: list[str], d: JsonFilesConfig, cache: str) -> dict[str, datasets.Dataset]:
    """The rows of `paths` as text (or records), checked, then split and capped."""
    from data.file_checks import ColumnsDiffer

    keys = ("prompt_column", "completion_column") if d.prompt_column else ("text_column",)
    columns = {key: getattr(d, key) for key in keys}
    try:
        rows = _json_rows(paths, d, columns, cache)
    except ColumnsDiffer:  # other keys beside the run's (`id` here, `url` there; numbers here, strings there)
        datasets = hf_datasets()
        parts = [_json_rows([path], d, columns, cache) for path in paths]
        text = datasets.Value("string")  # a column of nulls alone in one file is null-typed there
        rows = datasets.concatenate_datasets(
            [part.cast(datasets.Features(dict.fromkeys(part.column_names, text))) for part in parts]
        )
    return _capped(_hash_split(rows, d), d)


def _json_rows(paths: list[str], d: JsonFilesConfig, columns: dict[str, str], cache: str) -> datasets.Dataset:
    """The run's columns of the rows of `paths`, read together (one schema), checked: each holds a string in every
    row."""
    from data.file_checks import (
        ColumnsDiffer,
        check_filled,
        check_strings,
        first_malformed,
        json_columns,
        unreadable_json,
    )

    datasets = hf_datasets()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a malformed line is said once, below
    try:
        loaded = datasets.load_dataset("json", data_files=paths, cache_dir=cache)["train"]
    except Exception as e:  # a malformed line: DatasetGenerationError, which names neither file nor line
        if len(paths) > 1:  # keys or types that differ from file to file: each file read alone (a malformed line
            raise ColumnsDiffer from None  # is then named by its own file's read, the one file parsed in Python)
        if (malformed := first_malformed(paths)) is not None:
            raise malformed from None
        if type(e.__cause__ or e).__name__ != "CastError":
            raise unreadable_json(paths, e) from None
        # one file whose rows past datasets' first 10 MB carry other keys: its rows read here, the run's columns only
        loaded = json_columns(paths[0], columns, cache)
    finally:
        datasets.logging.set_verbosity_error()
    check_strings(loaded, columns, paths)
    rows = _text_column(loaded, d, label=" ".join(paths[:3]) + (" ..." if len(paths) > 3 else ""))
    check_filled(loaded, columns, paths)
    return rows


def _load_text_files(
    by_split: dict[str, list[str]], d: DatasetConfig, sample_by: str, cache: str
) -> dict[str, datasets.Dataset]:
    """datasets' own `text` loader, one document per file, its Arrow copy in `cache` (_arrow_cache)."""
    from data.file_checks import first_undecompressable

    try:
        loaded = hf_datasets().load_dataset(
            "text",
            data_files=by_split,
            sample_by=sample_by,
            encoding_errors=TEXT_ENCODING_ERRORS,
            writer_batch_size=FILES_PER_ARROW_WRITE,
            cache_dir=cache,
        )
    except Exception:  # datasets says "An error occurred while generating the dataset", naming no file
        if (bad := first_undecompressable([path for paths in by_split.values() for path in paths])) is not None:
            raise bad from None
        raise
    return {name: loaded[name] for name in by_split}


def _hash_split(ds: datasets.Dataset, d: DatasetConfig) -> dict[str, datasets.Dataset]:
    """Split rows by a hash of their index (for sources that come as one split)."""
    labels = [split_of(f"row-{i}", d.val_fraction, d.test_fraction) for i in range(len(ds))]
    out = {}
    for name in ("train", "val", "test"):
        rows = [i for i, label in enumerate(labels) if label == name]
        if rows:
            out[name] = ds.select(rows)
    return out


def hub_corpus(d: HfConfig) -> TextCorpus:
    label = d.hf_path + (f" ({d.hf_name})" if d.hf_name else "")
    kwargs = dict(
        path=d.hf_path,
        name=d.hf_name,
        data_files=list(d.files) or None,
        cache_dir=str(Path(d.cache_dir) / "hf"),
        token=secret("HF_TOKEN"),
    )
    if d.streaming:
        columns = [d.text_column, d.prompt_column, d.completion_column]
        stamps = file_stamps(expand_files(d.files)) if d.files else []
        fingerprint = _fingerprint(
            "stream-v1",
            d.hf_path,
            d.hf_name,
            d.train_split,
            stamps,
            columns,
            d.val_fraction,
            d.test_fraction,
            d.max_documents,
            d.max_tokens,
        )
        return TextCorpus(label, fingerprint, None, stream=lambda state: HubStream(d, kwargs, label, state))
    stamps = file_stamps(expand_files(d.files)) if d.files else []
    if stamps:  # local files through a Hub builder (json, csv, parquet): their Arrow copy per stamps (_arrow_cache)
        kwargs["cache_dir"] = _arrow_cache(d, _fingerprint("hub-files-v1", stamps))
    corpus = _hub_call(label, d, lambda: _local_splits(d, kwargs) if stamps else _hub_splits(d, kwargs))
    fingerprint = _fingerprint(
        "hub-v1", {k: v._fingerprint for k, v in sorted(corpus.items())}, d.max_documents, *([stamps] if stamps else [])
    )
    return TextCorpus(label, fingerprint, lambda: _capped(corpus, d))


def _hub_call(label: str, d: HfConfig, load: Callable, connect: bool = True):
    """Run `load` against the Hub (first going offline when it is unreachable, if `connect`); any failure to reach
    or read it becomes one line."""
    if connect and not hub_reachable():
        offline_hub()
    try:
        return load()
    except DataError:
        raise
    except Exception as e:  # the Hub raises many types: connection, offline mode, not found, gated, bad config
        reason = first_line(e)
        raise DataError(
            f"dataset {label}: could not load it from the Hugging Face Hub: {reason}. Offline? Use dataset=pystdlib "
            "or dataset=text_files dataset.files=[...], or download it once online (it is then read from "
            f"{d.cache_dir}/hf)"
        ) from None


def _local_splits(d: HfConfig, kwargs: dict) -> dict[str, datasets.Dataset]:
    """`_hub_splits` of dataset.files: a file the builder cannot read is named in one line (a compressed file that
    does not decompress; for the json builder, an empty file or the first line that does not parse), not taken for
    the Hub out of reach."""
    from data.file_checks import first_malformed, first_undecompressable

    datasets = hf_datasets()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # the loader's own ERROR line: said once, below
    try:
        return _hub_splits(d, kwargs)
    except DataError:
        raise
    except Exception as e:
        paths = expand_files(d.files)
        named = first_undecompressable(paths)
        if named is None and d.hf_path == "json":
            named = first_malformed([path for path in paths if path.endswith((".json", ".jsonl"))])
        if named is not None:
            raise named from None
        cause = e  # datasets' 'An error occurred while generating the dataset' wraps the reader's own reason
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        which = paths[0] if len(paths) == 1 else f"{len(paths)} files"
        raise DataError(
            f"dataset.files: the {d.hf_path} builder (dataset.hf_path) could not read {which}: {first_line(cause)}"
        ) from None
    finally:
        datasets.logging.set_verbosity_error()


def _load_split(d: HfConfig, name: str, hf_split: str, kwargs: dict) -> datasets.Dataset:
    """One split; a split the dataset does not have (a builder over local files has only `train`) is one line
    naming the key that asked for it."""
    try:
        return hf_datasets().load_dataset(split=hf_split, **kwargs)
    except ValueError as e:
        if not str(e).startswith("Unknown split"):
            raise
        if name == "train":
            held_out = ""
        elif name == "val" or d.val_split is None:
            held_out = f"; dataset.{name}_split=null holds out dataset.{name}_fraction of train instead"
        else:  # a share of train is held out only for a source without its own validation split (_hub_splits)
            held_out = (
                "; dataset.test_split=null runs without a test split (dataset.test_fraction of train is held out only "
                f"when dataset.val_split, here {d.val_split}, is null too)"
            )
        raise DataError(f"dataset.{name}_split: {first_line(e)}{held_out}") from None


def _hub_splits(d: HfConfig, kwargs: dict) -> dict[str, datasets.Dataset]:
    splits = {"train": d.train_split, "val": d.val_split, "test": d.test_split}
    corpus = {
        name: _text_column(_load_split(d, name, hf_split, kwargs), d)
        for name, hf_split in splits.items()
        if hf_split is not None
    }
    if d.val_split is None:  # validation held out of train; the test split too, unless the source has its own
        own_test = d.test_split is not None
        held_out = _hash_split(corpus.pop("train"), replace(d, test_fraction=0.0) if own_test else d)
        corpus = {**held_out, **{k: v for k, v in corpus.items() if k not in held_out}}
    return corpus


class HubStream:
    """The streamed train split, resumable: rows from `row` on, each with the split its row number hashes to.
    `state()` after a row is what `HubStream(..., state)` needs to go on after it without reading the rows before
    (datasets' own IterableDataset.state_dict)."""

    def __init__(self, d: HfConfig, kwargs: dict, label: str, state: dict | None) -> None:
        self.d, self.label = d, label
        self._stream = _hub_call(
            label, d, lambda: hf_datasets().load_dataset(split=d.train_split, streaming=True, **kwargs)
        )
        self.row = 0
        if state is not None:
            self._stream.load_state_dict(state["stream"])
            self.row = state["row"]

    def state(self) -> dict:
        return {"stream": self._stream.state_dict(), "row": self.row}

    def __iter__(self) -> Iterator[tuple[str, str]]:
        d = self.d
        rows = iter(self._stream)
        while d.max_documents is None or self.row < d.max_documents:
            row = _hub_call(self.label, d, lambda: next(rows, None), connect=False)
            if row is None:
                return
            if d.text_column not in row:
                raise DataError(
                    f"dataset.text_column: {d.text_column!r} is not a column of {self.label}; it has {', '.join(row)}"
                )
            text = row[d.text_column]
            if text is not None and not isinstance(text, str):
                raise DataError(
                    f"dataset.text_column: {d.text_column!r} of {self.label} holds {type(text).__name__}, not text "
                    f"(row {self.row}); name a column of strings"
                )
            split = split_of(f"row-{self.row}", d.val_fraction, d.test_fraction)
            self.row += 1
            yield split, text or ""


def _text_column(ds: datasets.Dataset, d: RecordsConfig, label: str | None = None) -> datasets.Dataset:
    """The column(s) the run reads, renamed to `text`, or to `prompt` and `completion` for fine-tuning records."""
    wanted = (
        {"prompt_column": "prompt", "completion_column": "completion"} if d.prompt_column else {"text_column": "text"}
    )
    columns = {key: getattr(d, key) for key in wanted}
    for key, column in columns.items():
        if column not in ds.column_names:
            raise DataError(
                f"dataset.{key}: {column!r} is not a column of {label or d.hf_path}; it has "
                f"{', '.join(ds.column_names)}"
            )
    for key, column in columns.items():
        if not _holds_text(ds.features[column]):
            texts = [name for name, feature in ds.features.items() if _holds_text(feature)]
            raise DataError(
                f"dataset.{key}: {column!r} of {label or d.hf_path} holds {_kind(ds.features[column])}, not text; "
                + (f"its text columns: {', '.join(texts)}" if texts else "it has no column of text")
            )
    ds = ds.select_columns(list(columns.values()))
    return ds.rename_columns({columns[key]: new for key, new in wanted.items() if columns[key] != new})


def _holds_text(feature: Any) -> bool:
    """A column of strings (or of nulls only: the check for missing values names their rows)."""
    return isinstance(feature, hf_datasets().Value) and feature.dtype in ("string", "large_string", "null")


def _kind(feature: Any) -> str:
    return feature.dtype if isinstance(feature, hf_datasets().Value) else type(feature).__name__.lower()
