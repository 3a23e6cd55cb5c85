"""Files that several processes share: a write that a reader sees whole or not at all, and a wait for a file another
process is writing. How the processes of a run hand each other the token store, a tokenizer and a sweep's records,
before JAX is involved."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, TypeVar

from core.errors import DataError

T = TypeVar("T")
POLL_S = 0.5


def write_atomic(path: Path, data: bytes | str) -> None:
    """`data` to `path` through a temporary file in the same folder, flushed to disk, then renamed over `path`."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def wait_for(get: Callable[[], T | None], wait_s: float, timeout_line: str) -> T:
    """Poll `get()` until it returns something other than None; after `wait_s`, fail with `timeout_line`."""
    deadline = time.monotonic() + wait_s
    while (value := get()) is None:
        if time.monotonic() > deadline:
            raise DataError(timeout_line)
        time.sleep(POLL_S)
    return value
