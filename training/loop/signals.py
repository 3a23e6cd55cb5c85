"""Preemption and Ctrl-C: SIGTERM or SIGINT asks the loop to finish its step, checkpoint and exit 0.

A second SIGINT raises KeyboardInterrupt at once, for when the checkpoint itself is what hangs. A signal a sweep
received before its job's loop started (training/cli/app.py notes it in `pending`) is taken as received: if the
KeyboardInterrupt raised then was lost on its way out (a library's `except`, a finalizer's "Exception ignored"), the
loop still stops after its first step, with a checkpoint.
"""

from __future__ import annotations

import signal
import threading

pending: list[str] = []  # signals received outside a loop that the next loop must honour (a sweep's)


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: str | None = pending[-1] if pending else None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def __bool__(self) -> bool:
        return self.signal_name is not None

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
