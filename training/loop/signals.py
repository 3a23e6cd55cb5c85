"""Preemption and Ctrl-C: SIGTERM or SIGINT asks the loop to finish its step, checkpoint and exit 0.

A second SIGINT raises KeyboardInterrupt at once, for when the checkpoint itself is what hangs. A signal a sweep
received before its job's loop started (core/signals.py) is taken as received.
"""

from __future__ import annotations

import signal
import threading

from core.signals import pending as received


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: str | None = received[-1] if received else None
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
