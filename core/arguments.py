"""Argument types for the scripts' command lines: a bad value is argparse's usage error (exit 2), naming the flag."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(low: int) -> Callable[[str], int]:
    """An int type for argparse that refuses values below `low`: `add_argument("--steps", type=at_least(1))`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}; got {value}")
        return value

    return parse
