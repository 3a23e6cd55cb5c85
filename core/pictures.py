"""Figures the tools write: each carries its maker's name in its metadata, so that a tool run again replaces its own
picture and never a file it did not write (a user's, or another tool's of the same name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROJECT = "gpt-jax"
METADATA_KEY = {".png": "Software", ".svg": "Creator", ".pdf": "Creator"}  # formats that carry a maker's name


def stamp(maker: str) -> str:
    return f"{PROJECT} {maker}"


def save_picture(fig: Any, path: str | Path, maker: str, dpi: int) -> Path:
    """`fig` written to `path`, its folder made, with `maker` in its metadata where the format holds one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = METADATA_KEY.get(path.suffix.lower())
    fig.savefig(path, dpi=dpi, **({"metadata": {key: stamp(maker)}} if key else {}))
    return path


def made_by(path: Path, maker: str) -> bool:
    """`path` is a picture `maker` wrote (its name in the file's metadata)."""
    try:
        return path.suffix.lower() in METADATA_KEY and stamp(maker).encode() in path.read_bytes()
    except OSError:  # unreadable: not known to be the maker's, so kept
        return False
