"""The scripts' command lines: argument types (a bad value is argparse's usage error, exit 2, naming the flag) and
checks of what a flag names."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage error is one line (`error: ...`, exit 2), as the project's other errors are,
    instead of argparse's usage text and error."""

    def error(self, message: str) -> NoReturn:
        import sys

        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _converted(text: str, kind: Callable[[str], Any], noun: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {noun}; got {text!r}") from None


def at_least(low: int) -> Callable[[str], int]:
    """An int type for argparse that refuses values below `low`: `add_argument("--steps", type=at_least(1))`."""

    def parse(text: str) -> int:
        value = _converted(text, int, "an integer")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}; got {value}")
        return value

    return parse


def seed(text: str) -> int:
    """A seed for argparse: an integer in [0, 2**32), as train.seed (a larger one overflowed JAX's key, or gave a
    smaller one's numbers)."""
    value = at_least(0)(text)
    if value >= 2**32:
        raise argparse.ArgumentTypeError(f"must be below 2**32 (4294967296); got {value}")
    return value


def above(low: float) -> Callable[[str], float]:
    """A number type for argparse that refuses values at or below `low`: `add_argument("--limit", type=above(0))`."""

    def parse(text: str) -> float:
        value = _converted(text, float, "a number")
        if not value > low:
            raise argparse.ArgumentTypeError(f"must be > {low:g}; got {text}")
        return value

    return parse


def check_picture(flag: str, path: str | Path, maker: str) -> Path:
    """`path` as a figure `maker` writes (core/pictures.py), checked before the work it would end: matplotlib must
    know its extension's format, its folder must be one that can be created (no file on the way) and written in, and
    a file there must be `maker`'s own picture (a rerun replaces it; anything else is kept). Else a ConfigError
    naming `flag` (one line, exit 2)."""
    from matplotlib.backend_bases import FigureCanvasBase

    from core.checks import writable_ancestor
    from core.errors import ConfigError
    from core.pictures import METADATA_KEY, made_by

    path = Path(path).expanduser()
    # the formats matplotlib writes that carry their maker's name (core/pictures.py): a rerun can tell its own
    formats = sorted(s.lstrip(".") for s in METADATA_KEY if s.lstrip(".") in FigureCanvasBase.get_supported_filetypes())
    if path.suffix.lower().lstrip(".") not in formats:
        raise ConfigError(f"{flag}: {path}: a picture's name ends in one of .{', .'.join(formats)}")
    if path.is_dir():
        raise ConfigError(f"{flag}: {path} is a directory; name a file in it")
    if path.exists() and not made_by(path, maker):
        raise ConfigError(f"{flag}: {path} exists and is not a picture {maker} wrote; name a new file, or remove it")
    writable_ancestor(flag, path.absolute().parent, named=path)  # before the work that a failed save would lose
    return path
