"""metrics.jsonl: one JSON object per logged event (a training interval, an evaluated split, a measurement), appended
and line-buffered, so that a run killed at any moment leaves every line it logged. Non-finite numbers are written as
strings ("nan"), which JSON has no number for."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from core.files import write_atomic
from training.config import layout


class MetricsFile:
    def __init__(self, run_dir: Path, start_step: int | None = None) -> None:
        """`start_step`: the step the run starts at (a resumed run's checkpoint step); the rows past it are set aside
        (None: every row is kept)."""
        drop_cut_off_line(run_dir / layout.METRICS)
        if start_step is not None:
            set_aside_rows_after(run_dir / layout.METRICS, start_step)
        self.file = open(run_dir / layout.METRICS, "a", buffering=1)

    def log(self, step: int, split: str, values: dict[str, float]) -> None:
        row = {"step": step, "split": split, "time": time.time(), **as_json(values)}
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


def set_aside_rows_after(path: Path, step: int) -> Path | None:
    """The rows of steps after `step`, which a run resumed at `step` trains again (the segment before got past its
    last checkpoint, or the resume took an older one), move to metrics.superseded-<time>.jsonl beside the file, kept:
    the file then holds one history, as the summary, the plots and compare_runs read it (a resume from step 4 of a
    run that had reached 8, stopped at 6, was summarised as ending at step 8). Where it moved them, or None."""
    if not path.exists():
        return None
    keep, later = [], []
    for line in path.read_text().splitlines(keepends=True):
        try:
            past = json.loads(line)["step"] > step
        except (ValueError, KeyError, TypeError):
            past = False  # read_metrics names a damaged line; it stays where it is
        (later if past else keep).append(line)
    if not later:
        return None
    aside = path.with_name(f"{path.stem}.superseded-{time.strftime('%Y%m%d-%H%M%S')}{path.suffix}")
    with open(aside, "a") as f:  # two resumes in one second add to one file
        f.write("".join(later))
    write_atomic(path, "".join(keep))
    return aside


def as_json(value: Any) -> Any:
    """`value` (a number, or a dict or list of them) with its non-finite numbers as strings ("nan", "inf"), which JSON
    has no number for: how metrics.jsonl and summary.json write them. `from_json` reads them back."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


# as_json's strings, read back as numbers: as strings, a NaN evaluation was skipped by the summary (which then named
# an earlier finite loss as the final one) and plotted as a category
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def from_json(row: dict) -> dict:
    """A metrics.jsonl row with as_json's strings as the numbers they stand for (its split's name stays a name)."""
    return {k: _NON_FINITE.get(v, v) if k != "split" and isinstance(v, str) else v for k, v in row.items()}
