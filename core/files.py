"""Files that several processes share: a write that a reader sees whole or not at all, a wait for a file another
process is writing, and a lock that one process holds while it builds what the others will read. How the processes
of a run (and the runs of a sweep) hand each other the token store, a tokenizer and a sweep's records, before JAX is
involved."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

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


@contextlib.contextmanager
def exclusive(lock_file: Path, wait_s: float, waiting_line: str, timeout_line: str) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` (created if missing) for the block; while another process holds it,
    print `waiting_line` once and wait, failing with `timeout_line` after `wait_s`. An flock: the system releases it
    when its holder ends, however it ends, so a killed process never leaves a lock behind."""
    with open(lock_file, "a") as f:
        deadline, said = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    print(waiting_line, flush=True)
                    said = True
                if time.monotonic() > deadline:
                    raise DataError(timeout_line) from None
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
