"""metrics.jsonl: one JSON object per logged event (a training interval, an evaluated split, a measurement), appended
and line-buffered, so that a run killed at any moment leaves every line it logged. Non-finite numbers are written as
strings ("nan"), which JSON has no number for."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from training.config import layout


class MetricsFile:
    def __init__(self, run_dir: Path) -> None:
        drop_cut_off_line(run_dir / layout.METRICS)
        self.file = open(run_dir / layout.METRICS, "a", buffering=1)

    def log(self, step: int, split: str, values: dict[str, float]) -> None:
        row = {"step": step, "split": split, "time": time.time(), **{k: _plain(v) for k, v in values.items()}}
        self.file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self.file.close()


def drop_cut_off_line(path: Path) -> None:
    """A row a killed process left half-written ends the file without its newline: cut it off, so that the next row
    appended does not continue it into one line that is neither."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, 2)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        f.truncate(f.read().rfind(b"\n") + 1)


def _plain(v: float) -> float | str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
