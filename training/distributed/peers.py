"""A process of a multi-process run that dies: noticed by the survivors within system.distributed_timeout_s, and
said in one line that names it, instead of a wait in a collective or JAX's own multi-line fatal error.

Every process runs a watch thread that bumps its own counter in jax.distributed's key-value store every
HEARTBEAT_S and reads the others'. A process whose counter has not moved for distributed_timeout_s is lost; a
coordinator (process 0) that no longer answers is lost at once. A survivor then prints one line and exits with
os._exit: the collectives, Orbax's barriers and jax.distributed's shutdown would all wait for the lost process. A
collective that fails in the main thread (gloo: "Connection closed by peer") waits for that verdict.

JAX's own heartbeat (distributed_timeout_s + JAX_HEARTBEAT_MARGIN_S) stays as the backstop. Resuming is the usual
`checkpoint.load=auto` (or True) with all the processes: the last complete checkpoint is whole.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from typing import Any, Protocol

import jax

from core.errors import PipelineError, first_line

HEARTBEAT_S = 1.0
JAX_HEARTBEAT_MARGIN_S = 30  # JAX declares a process dead this long after the watch does, and ends the survivors
_KEY = "gpt_jax/alive"
_verdict = threading.Event()
_said = threading.Lock()
_stopping = threading.Event()


class Processes(Protocol):
    """What joining and watching the processes read of the `system` section (training/config/system.py's
    SystemConfig; training/distributed/ does not import training/config/)."""

    @property
    def num_processes(self) -> int | None: ...

    @property
    def process_id(self) -> int | None: ...

    @property
    def coordinator_address(self) -> str | None: ...

    @property
    def cpu_devices_per_process(self) -> int | None: ...

    @property
    def distributed_timeout_s(self) -> int: ...


_watched: list[Processes] = []  # the system config of a watched run


def watch_peers(system: Processes) -> None:
    """Start the watch thread (multi-process runs only; call after jax.distributed joined them)."""
    if not jax.distributed.is_initialized() or jax.process_count() == 1:
        return
    _watched.append(system)
    thread = threading.Thread(
        target=_watch,
        args=(jax.process_index(), jax.process_count(), system.distributed_timeout_s, system.coordinator_address),
        name="watch-peers",
        daemon=True,
    )
    thread.start()
    # At exit, before jax's own handler (registered earlier, so run later) shuts the distributed client down: a
    # watch still calling that client while it shuts down ended a finished process with SIGABRT.
    atexit.register(_stop_watching, thread)


def _stop_watching(thread: threading.Thread) -> None:
    _stopping.set()
    thread.join(timeout=10 * HEARTBEAT_S)


def _watch(me: int, count: int, timeout: float, coordinator: str | None) -> None:
    from jax._src import distributed  # the joined processes' client: the key-value store the collectives use too

    client = distributed.global_state.client
    seen = {p: (None, time.monotonic()) for p in range(count) if p != me}
    beat = 0
    while not _stopping.is_set():
        beat += 1
        try:
            client.key_value_set(f"{_KEY}/{me}", str(beat), allow_overwrite=True)
            values = {p: _try_get(client, f"{_KEY}/{p}") for p in seen}
        except Exception as e:  # the store lives in process 0
            if me != 0:
                abandon(
                    f"system: lost process 0 of {count} (the coordinator at {coordinator or 'its address'}): "
                    f"{first_line(e)}"
                )
            values = {p: seen[p][0] for p in seen}
        now = time.monotonic()
        for p, value in values.items():
            if value != seen[p][0]:
                seen[p] = (value, now)
        stale = [p for p, (_, since) in seen.items() if now - since > timeout]
        if stale:
            abandon(
                f"system: lost process {stale[0]} of {count}: no sign of life for {timeout:g} s "
                f"(system.distributed_timeout_s); resume with all {count} processes and checkpoint.load=auto"
            )
        _stopping.wait(HEARTBEAT_S)


def _try_get(client: Any, key: str) -> str | None:  # client: jaxlib's DistributedRuntimeClient (private)
    try:
        return client.key_value_try_get(key)
    except Exception as e:
        if "NOT_FOUND" in str(e):
            return None
        raise


def lost_peer(error: BaseException) -> str | None:
    """For an exception from a collective that lost its peer: the line to exit with (after waiting, up to
    distributed_timeout_s, for the watch to name the process); None for any other exception."""
    if (
        not _watched
        or isinstance(error, PipelineError)
        or not any(s in str(error) for s in ("Connection closed by peer", "Connection reset", "Socket closed", "Gloo"))
    ):
        return None
    system = _watched[0]
    if jax.process_index() != 0 and not _answers(system.coordinator_address):
        return (
            f"system: lost process 0 of {jax.process_count()} (the coordinator at {system.coordinator_address}); "
            f"resume with all {jax.process_count()} processes and checkpoint.load=auto"
        )
    _verdict.wait(system.distributed_timeout_s + 2 * HEARTBEAT_S)  # the watch names the lost process and exits
    return f"system: a collective lost its peer ({first_line(error)}); resume with checkpoint.load=auto"


def _answers(address: str | None) -> bool:
    if not address:
        return True
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except OSError:
        return False


def abandon(line: str) -> None:
    """Print `error: <line>` once and end this process at once."""
    with _said:
        _verdict.set()
        print(f"error: {line}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
