"""The disk a run writes to: its directories checked before anything is written, and a full disk said in one line.

`check_writable` runs while the run is planned, for every directory it will write (run directory, checkpoints):
a file in the way, a directory that cannot be created, a read-only or full file system stop it there with one line
naming the key and the path, and nothing written. What fills up later (a disk that runs full during a save) is an
`OSError` with one of `DISK_FULL_ERRNOS`, which `storage_error` turns into one line. `check_no_foreign_file` keeps
a new run from writing over a file of a run's name (config.yaml, summary.json) that no run wrote.
"""

from __future__ import annotations

import dataclasses
import errno
import re
from pathlib import Path

import yaml

from core.checks import DISK_FULL_ERRNOS, existing_ancestor, writable_ancestor
from core.errors import ConfigError, PipelineError


def check_writable(key: str, path: str | Path, probe: bool = True) -> None:
    """`path` is a directory this run can create (if missing) and (`probe`) write to; else ConfigError naming `key`."""
    path = Path(path).expanduser().absolute()
    if re.search(r"\[[^\]]+\]", str(path)):  # measured: Orbax saves there, and TensorStore then finds nothing
        raise ConfigError(
            f"{key}: {path} holds a bracketed name ([...]), which TensorStore reads as a pattern: its "
            "checkpoints would not restore; choose a path without brackets"
        )
    (writable_ancestor if probe else existing_ancestor)(key, path)


def storage_error(e: OSError) -> PipelineError | None:
    """A write that failed because the disk is full (or read-only) as one line naming the file; None for others."""
    if e.errno not in DISK_FULL_ERRNOS + (errno.EROFS,):
        return None
    where = f" {e.filename}" if e.filename else ""
    return PipelineError(
        f"writing{where}: {e.strerror}; free some space and rerun (checkpoint.load=auto resumes "
        "from the last complete checkpoint)"
    )


def check_no_foreign_file(key: str, directory: Path, names: tuple[str, ...]) -> None:
    """A new run writes its config.yaml and summary.json into its directories; a file of such a name that no run
    wrote (a project's own config.yaml, with `logging.run_dir=.`) would be lost: ConfigError naming it."""
    for name in names:
        path = Path(directory).expanduser().absolute() / name
        if path.is_file() and not _written_by_a_run(path):
            raise ConfigError(
                f"{key}: {path} is not a file a run wrote, and this run would write over it; choose another "
                "directory, or move the file"
            )


def _written_by_a_run(path: Path) -> bool:
    """What a run writes, whole or cut short (a full disk leaves an empty or truncated file, which the rerun that
    storage_error suggests must get past): a config.yaml whose top-level keys are the first of a run config's, in its
    order, from `mode: train` or `mode: eval`; a summary.json that opens with its first key (`steps`). Another tool's
    config.yaml (its `model:` beside a `trainer:`, or a `mode: production`) is not."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    if not text.strip():
        return True  # nothing to lose
    if path.suffix == ".json":
        return re.match(r'\{\s*"steps"', text) is not None
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError:  # cut inside a value: its first line still says whose it is
        return text.splitlines()[0] in ("mode: train", "mode: eval")
    from training.config import Config  # here: the tools that check a folder (bench_peer's parent) import no JAX

    fields = [f.name for f in dataclasses.fields(Config)]
    return (
        isinstance(content, dict)
        and list(content) == fields[: len(content)]
        and content.get("mode") in ("train", "eval")
    )
