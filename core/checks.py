"""How a config check fails (one `ConfigError` naming the key) and the common checks: for the sections of the run's
config, wherever their package defines them (data/config.py, models/config.py, training/config/)."""

from __future__ import annotations

import errno
import math
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, NoReturn

from core.errors import ConfigError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, over the file-size limit
PROBE_BYTES = 1 << 16  # what a write check writes (to a nameless temporary file) to see that the disk takes data


def fail(key: str, reason: str) -> NoReturn:
    raise ConfigError(f"config: {key}: {reason}")


def either(choices: Iterable[str]) -> str:
    """`a, b or c`: the choices a message names."""
    *most, last = [str(c) for c in choices]
    return f"{', '.join(most)} or {last}" if most else last


def refuse_non_finite(node: object, at: str, infinite_ok: frozenset[str] = frozenset()) -> None:
    """Every number in `node` (a dataclass, mapping or list, at `at`) is finite: NaN passed every range check (each
    comparison is false) and trained to a NaN loss, or switched off what it set (a NaN grad_clip, a NaN time limit);
    inf did the same for most keys. `infinite_ok`: the keys (last name) where inf means unbounded."""
    if is_dataclass(node):
        for f in fields(node):
            refuse_non_finite(getattr(node, f.name), f"{at}.{f.name}" if at else f.name, infinite_ok)
    elif isinstance(node, dict):
        for key, value in node.items():
            refuse_non_finite(value, f"{at}.{key}" if at else str(key), infinite_ok)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            refuse_non_finite(value, f"{at}[{i}]", infinite_ok)
    elif isinstance(node, float) and not math.isfinite(node):
        if math.isnan(node):
            fail(at, "must be a number; got nan")
        if at.rsplit(".", 1)[-1] not in infinite_ok:
            fail(at, f"must be finite; got {node}")


def _require(section: object, at: str, names: tuple[str, ...], ok: Callable[[Any], bool], want: str) -> None:
    """Each field `names` of `section` (which sits at `at` in the config) passes `ok`, else a ConfigError naming it."""
    for name in names:
        value = getattr(section, name)
        if not ok(value):
            fail(f"{at}.{name}", f"must be {want}; got {value}")


def require_positive(section: object, at: str, *names: str) -> None:
    """A count: >= 1."""
    _require(section, at, names, lambda v: v is not None and not v < 1, ">= 1")


def require_fraction(section: object, at: str, *names: str) -> None:
    """A probability or a decay rate: in [0, 1)."""
    _require(section, at, names, lambda v: 0.0 <= v < 1.0, "in [0, 1)")


def require_above_zero(section: object, at: str, *names: str) -> None:
    _require(section, at, names, lambda v: not v <= 0, "> 0")


def require_non_negative(section: object, at: str, *names: str) -> None:
    _require(section, at, names, lambda v: not v < 0, ">= 0")


def refuse_unread(section: object, at: str, unread: dict[str, tuple[bool, str, str]]) -> None:
    """A key of `section` (a dataclass at `at`) set away from its default where the other keys leave it unread is
    refused, not ignored. `unread`: key -> (whether it is read, what reads it, how to have it read)."""
    for f in fields(section):  # type: ignore[arg-type]
        if f.name in unread and not unread[f.name][0] and getattr(section, f.name) != _default(f):
            _, reader, fix = unread[f.name]
            default = "null" if _default(f) is None else _default(f)
            fail(f"{at}.{f.name}", f"read only by {reader}: set {fix}, or leave it at {default}")


def existing_ancestor(key: str, directory: Path) -> Path:
    """The nearest of `directory` and its ancestors that exists: where creating `directory` starts. A file (or a
    dangling link) there is a ConfigError naming `key`, before anything is written."""
    existing = directory
    while not (existing.exists() or existing.is_symlink()):
        existing = existing.parent
    if not existing.is_dir():
        where = "" if existing == directory else f": {existing}"
        raise ConfigError(f"{key}: {directory}{where} is a file, not a directory; choose a directory")
    return existing


def writable_ancestor(key: str, directory: Path, named: Path | None = None) -> Path:
    """`existing_ancestor`, and one that takes data: a nameless temporary file of PROBE_BYTES written there (a
    read-only or full file system is a ConfigError naming `key` and `named`, `directory` by default)."""
    existing = existing_ancestor(key, directory)
    try:
        with tempfile.TemporaryFile(dir=existing) as probe:  # O_TMPFILE: no name in the directory, gone on close
            probe.write(b"\0" * PROBE_BYTES)
            probe.flush()
    except OSError as e:
        full = " (disk full?)" if e.errno in DISK_FULL_ERRNOS else ""
        raise ConfigError(f"{key}: {named or directory}: cannot write in {existing}: {e.strerror}{full}") from None
    return existing


def _default(f) -> object:
    return f.default_factory() if callable(f.default_factory) else f.default
