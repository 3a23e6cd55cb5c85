"""Where a run's checkpoints are, and whose run they are: what `checkpoint.load_path` names (a run directory or its
`checkpoints/`), the run directory a resumed run, a sample or an evaluation writes beside, and whether a save path
already holds a checkpoint that a fresh run must not overwrite."""

from __future__ import annotations

from pathlib import Path

from core.errors import CheckpointError
from training.config import layout

META = "meta"  # each step's item that says whose run it is (training/checkpoints/metadata.py)
# What names a checkpoint in the messages: the keys of a run's config by default; a tool names its own arguments
# (e.g. ("path", "--which")), a fine-tune init_from.
KEYS = ("checkpoint.load_path", "checkpoint.load_file")


def find_checkpoint_dir(path: str | Path, keys: tuple[str, str] = KEYS) -> Path:
    """`load_path` may name the checkpoint directory itself or the run directory that holds `checkpoints/`. `keys`:
    what names the path and the step in the messages."""
    p, (where, which) = Path(path).expanduser(), keys
    if not p.exists():
        raise CheckpointError(f"{where}: {p} does not exist")
    if not p.is_dir():
        raise CheckpointError(f"{where}: {p} is not a directory")
    if is_step_dir(p):
        raise CheckpointError(
            f"{where}: {p} is one step's folder; name the folder that holds the steps and the step: "
            f"{setting(where, p.parent)} {setting(which, p.name)}"
        )
    checkpoints = p / layout.CHECKPOINTS
    if checkpoints.is_dir() and not (p / layout.CONFIG).exists():
        return checkpoints
    if checkpoints.is_dir() and any(c.name.isdigit() for c in checkpoints.iterdir()):
        return checkpoints
    return p


def is_step_dir(path: Path) -> bool:
    """One step's folder of a run's checkpoints (its items: model/, opt_state/, meta/, ...)."""
    return path.name.isdigit() and (path / META).is_dir()


def checkpoints_folder_of(path: Path) -> Path | None:
    """The run's checkpoints folder that `path` is, or lies in: inside a step at any depth (deleted with it when
    max_to_keep rotates it out), or beside the steps under a step's name (a folder named like one becomes the run's
    newest step, which resume and every tool then fail to read); None when it is in none. `..` and links are taken:
    where files written at `path` would land."""
    where = path.expanduser().resolve()
    step = next((p for p in (where, *where.parents) if is_step_dir(p)), None)
    if step is not None:
        return step.parent
    for folder in (where, where.parent) if where.name.isdigit() else (where,):
        if folder.is_dir() and any(is_step_dir(c) for c in folder.iterdir()):
            return folder
    return None


def setting(key: str, value: object) -> str:
    """How a command sets `key`: a config key (`a.b=v`, `init_from=v`), a tool's flag (`--which v`) or its positional
    argument (`v`)."""
    if key.startswith("-"):
        return f"{key} {value}"
    return f"{key}={value}" if "." in key or key == "init_from" else str(value)


def run_dir_of(checkpoint_dir: Path, meta: dict) -> Path:
    """The run directory of the checkpoints in `checkpoint_dir` (`meta`: one's metadata): the parent of a default
    `checkpoints/` directory, also when the run was moved or copied (what a resumed run, a sample or an evaluation
    writes goes beside this copy, never into the run it was copied from); else the one recorded at save time, where
    it still exists; else the checkpoint directory's parent."""
    if checkpoint_dir.name == layout.CHECKPOINTS:
        return checkpoint_dir.parent
    recorded = meta.get("run_dir")
    return Path(recorded) if recorded and Path(recorded).is_dir() else checkpoint_dir.parent


def holds_checkpoints(path: Path) -> bool:
    """A complete checkpoint is there (a run that stopped before its first one left nothing to protect)."""
    return path.is_dir() and any(c.name.isdigit() for c in path.iterdir())
