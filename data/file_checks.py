"""The user's files, when datasets' loader fails on them or reads holes: which file, which line.

datasets' `json` builder reports a malformed line as "An error occurred while generating the dataset" (the file and
line are lost inside pyarrow), and fills a key that a row lacks with null; its `text` builder says the same of a file
whose name promises a compression (`.gz`, `.zst`) its bytes do not hold. These functions run only after such a
failure, or over the columns a run reads, and say where: `<file> line <n>`, `<file>`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from core.errors import DataError, first_line

if TYPE_CHECKING:
    import datasets


class ColumnsDiffer(Exception):
    """Files of valid JSON that datasets cannot read together: their rows carry other keys, or other types under one
    key (datasets takes the first file's columns and types as every file's)."""


def first_malformed(paths: list[str]) -> DataError | None:
    """The first line (JSON lines) or file (one JSON document) that does not parse, an empty or unreadable file;
    None when every file is JSON."""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            return DataError(f"dataset.files: {path}: unreadable ({getattr(e, 'strerror', None) or e})")
        if not text.strip():  # datasets says StopIteration
            return DataError(f"dataset.files: {path} is empty (no JSON row); fill it or leave it out")
        try:
            json.loads(text)
            continue  # one JSON document (an array of rows, or one row)
        except ValueError:
            pass
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    json.loads(line)
                except ValueError as e:
                    return DataError(
                        f"dataset.files: {path} line {number}: not valid JSON (column "
                        f"{e.colno}: {e.msg}); fix or remove that line"
                    )
    return None


def first_undecompressable(paths: list[str]) -> DataError | None:
    """The first file whose suffix names a compression (datasets' loaders open it through that codec) that does not
    decompress: not that format after all, or a codec whose package is not installed (`.zst` wants zstandard). None
    when each such file opens."""
    import fsspec
    from datasets.utils.file_utils import _get_extraction_protocol  # the loader's own reading of a name and header

    for path in paths:
        try:
            codec = _get_extraction_protocol(path)
            if codec is None:
                continue
            with fsspec.open(path, "rb", compression=codec) as f:
                while f.read(1 << 24):  # to the end: a file cut short (a download stopped) fails only there
                    pass
        except Exception as e:  # each codec its own: BadGzipFile, OSError, ValueError (no such codec), LZMAError
            return DataError(
                f"dataset.files: {path}: read as compressed (its name or first bytes), it does not decompress "
                f"({first_line(e)}); fix, rename or remove it"
            )
    return None


def unreadable_json(paths: list[str], error: Exception) -> DataError:
    """Files of valid JSON that datasets' loader still fails on: its reason, in one line."""
    reason = first_line(error.__cause__ or error)
    return DataError(f"dataset.files: {', '.join(paths[:3])}: datasets cannot read them as JSON ({reason})")


def json_columns(path: str, columns: dict[str, str], cache: str) -> datasets.Dataset:
    """The columns ({config key: column}) of every row of one JSON-lines file (or of one JSON array of rows), read
    in Python into an Arrow dataset under `cache`: for a file whose rows change keys past its first 10 MB, which
    datasets' loader cannot read (it takes the keys of the first 10 MB as the file's). A missing key is null
    (check_filled names its row); a value that is not a string is a DataError naming its line."""
    from datasets import Dataset, Features, Value

    stat = os.stat(path)
    try:
        return Dataset.from_generator(
            _column_rows,
            features=Features(dict.fromkeys(columns.values(), Value("string"))),
            gen_kwargs={"path": path, "columns": columns, "stamp": (stat.st_size, stat.st_mtime_ns)},
            cache_dir=cache,
        )
    except Exception as e:  # datasets wraps what the generator raised in its DatasetGenerationError
        if isinstance(e.__cause__ or e.__context__, DataError):
            raise (e.__cause__ or e.__context__) from None
        raise


def _column_rows(path: str, columns: dict[str, str], stamp: tuple[int, int]) -> Iterator[dict[str, str | None]]:
    """The rows of `path` in the order `_row_labels` numbers them, as {column: value}; `stamp` (the file's size and
    modification time) keys datasets' cache to the file as it is."""
    with open(path, encoding="utf-8") as f:
        array = f.read(1 << 16).lstrip().startswith("[")
        f.seek(0)
        if array:
            rows = ((f" (record {i + 1})", row) for i, row in enumerate(json.load(f)))
        else:
            rows = ((f" line {n}", json.loads(line)) for n, line in enumerate(f, start=1) if line.strip())
        for where, row in rows:
            values = {column: row.get(column) if isinstance(row, dict) else None for column in columns.values()}
            for key, column in columns.items():
                if values[column] is not None and not isinstance(values[column], str):
                    value = values[column]
                    raise DataError(
                        f"dataset.{key}: {column!r} is {json.dumps(value)[:40]} ({type(value).__name__}), not text, "
                        f"in {path}{where}; every record's {column!r} must be a string"
                    )
            yield values


def not_utf8(paths: list[str], error: UnicodeDecodeError) -> DataError:
    """A JSON file with bytes that are not UTF-8 (pyarrow reads them; a column's read fails): the file and line."""
    for path in paths:
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    return DataError(
                        f"dataset.files: {path} line {number}: not UTF-8 (byte {e.start}: {e.reason}); save the file "
                        "as UTF-8 or fix that line"
                    )
    return DataError(f"dataset.files: {', '.join(paths[:3])}: not UTF-8 ({error.reason}); save them as UTF-8")


def check_filled(ds: datasets.Dataset, columns: dict[str, str], paths: list[str]) -> None:
    """Every row has a value in each of `columns` ({config key: column}); else DataError naming the file and line
    (or record) of the first row without one. `ds` holds the rows of `paths`, in order."""
    for key, column in columns.items():
        for start, batch in zip(range(0, len(ds), 4096), ds.select_columns([column]).iter(batch_size=4096)):
            if None in batch[column]:
                file, where = _row_location(paths, start + batch[column].index(None))
                raise DataError(f"dataset.{key}: {column!r} is missing or null in {file}{where}; every record needs it")


def check_strings(ds: datasets.Dataset, columns: dict[str, str], paths: list[str]) -> None:
    """A column that mixes strings with other JSON values (datasets reads it as `Json`): DataError naming the file
    and line of the first row whose value is not a string. Columns of one other type are named by the caller."""
    from datasets import Json

    for key, column in columns.items():
        if column not in ds.column_names or not isinstance(ds.features[column], Json):
            continue
        for start, batch in zip(range(0, len(ds), 4096), ds.select_columns([column]).iter(batch_size=4096)):
            for offset, value in enumerate(batch[column]):
                if value is not None and not isinstance(value, str):
                    file, where = _row_location(paths, start + offset)
                    raise DataError(
                        f"dataset.{key}: {column!r} is {json.dumps(value)[:40]} ({type(value).__name__}), not text, "
                        f"in {file}{where}; every record's {column!r} must be a string"
                    )


def _row_location(paths: list[str], row: int) -> tuple[str, str]:
    for path in paths:
        labels = _row_labels(path)
        if row < len(labels):
            return path, labels[row]
        row -= len(labels)
    return paths[-1], ""


def _row_labels(path: str) -> list[str]:
    """Where each row of a file is: a line of a JSON-lines file, or a record of one JSON document."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        document = json.loads(text)
    except ValueError:
        return [f" line {n}" for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    return [f" (record {i + 1})" for i in range(len(document) if isinstance(document, list) else 1)]
