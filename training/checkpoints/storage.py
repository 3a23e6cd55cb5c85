"""The disk a run writes to: its directories checked before anything is written, and a full disk said in one line.

`check_writable` runs while the run is planned, for every directory it will write (run directory, checkpoints):
a file in the way, a directory that cannot be created, a read-only or full file system stop it there with one line
naming the key and the path, and nothing written. What fills up later (a disk that runs full during a save) is an
`OSError` with one of `DISK_FULL_ERRNOS`, which `storage_error` turns into one line.
"""

from __future__ import annotations

import errno
import re
import tempfile
from pathlib import Path

from core.checks import existing_ancestor
from core.errors import ConfigError, PipelineError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, over the file-size limit
PROBE_BYTES = 1 << 16  # what the check writes (to a nameless temporary file) to see that the disk takes data


def check_writable(key: str, path: str | Path, probe: bool = True) -> None:
    """`path` is a directory this run can create (if missing) and (`probe`) write to; else ConfigError naming `key`."""
    path = Path(path).expanduser().absolute()
    if re.search(r"\[[^\]]+\]", str(path)):  # measured: Orbax saves there, and TensorStore then finds nothing
        raise ConfigError(
            f"{key}: {path} holds a bracketed name ([...]), which TensorStore reads as a pattern: its "
            "checkpoints would not restore; choose a path without brackets"
        )
    existing = existing_ancestor(key, path)
    if not probe:
        return
    try:
        with tempfile.TemporaryFile(dir=existing) as probe:  # O_TMPFILE: no name in the directory, gone on close
            probe.write(b"\0" * PROBE_BYTES)
            probe.flush()
    except OSError as e:
        full = " (disk full?)" if e.errno in DISK_FULL_ERRNOS else ""
        raise ConfigError(f"{key}: {path}: cannot write in {existing}: {e.strerror}{full}") from None


def storage_error(e: OSError) -> PipelineError | None:
    """A write that failed because the disk is full (or read-only) as one line naming the file; None for others."""
    if e.errno not in DISK_FULL_ERRNOS + (errno.EROFS,):
        return None
    where = f" {e.filename}" if e.filename else ""
    return PipelineError(
        f"writing{where}: {e.strerror}; free some space and rerun (checkpoint.load=auto resumes "
        "from the last complete checkpoint)"
    )
