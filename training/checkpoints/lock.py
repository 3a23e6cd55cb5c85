"""One writer per checkpoint directory: the run that saves there holds `<save_path>/.lock`.

The lock is an flock on that file, which the kernel releases when its holder ends, however it ends (kill -9
included), so a dead holder's lock is taken over by the next run without anyone deleting anything. The file names
the holder (host, pid, start time) for the line that refuses a second run: a requeued job whose first copy still
runs would otherwise interleave its checkpoints and metrics with it. In a multi-process run, process 0 holds it for
all, and all agree on the outcome.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

import jax

from core.errors import CheckpointError
from training.distributed.sharding import max_over_processes

LOCK_FILE = ".lock"


class SaveLock:
    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> SaveLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.read(fd, 4096))
            os.close(fd)
            raise CheckpointError(
                f"checkpoint.save_path: {self.path.parent} is in use by another run ({holder}); let it finish or "
                "stop it (its lock goes with it), or choose another checkpoint.save_path"
            ) from None
        os.ftruncate(fd, 0)
        os.write(
            fd,
            json.dumps(
                {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            ).encode(),
        )
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # while still held: the next holder writes its own name
            os.close(self._fd)  # releases the flock
            self._fd = None


def _describe(raw: bytes) -> str:
    try:
        holder = json.loads(raw)
        return f"pid {holder['pid']} on host {holder['host']}, since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def lock_save_path(directory: Path) -> SaveLock | None:
    """Process 0 takes the lock; every process raises the same CheckpointError when it is held elsewhere."""
    lock, refused = None, None
    if jax.process_index() == 0:
        try:
            lock = SaveLock(directory).acquire()
        except CheckpointError as e:
            refused = e
    if max_over_processes(int(refused is not None)):
        raise refused or CheckpointError(
            f"checkpoint.save_path: {directory} is in use by another run (process 0 says which)"
        )
    return lock
