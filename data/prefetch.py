"""Batches for the next steps, prepared in a background thread while the current step runs.

The thread calls `make(step)` (read the windows, build the arrays, put them on the devices) for each step in order
and keeps up to `depth` finished batches waiting (plus the one it holds until there is room), so the loop only ever
picks one up. Batches stay a pure function of
the step: prefetching changes when they are built, never what they hold.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class Prefetcher:
    def __init__(self, make: Callable[[int], Any], first_step: int, end_step: int, depth: int = 2) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._next = first_step
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._fill, args=(make, first_step, end_step), daemon=True, name="batch-prefetch"
        )
        self._thread.start()

    def _fill(self, make: Callable[[int], Any], first: int, end: int) -> None:
        for step in range(first, end):
            try:
                item = (step, make(step), None)
            except BaseException as e:  # handed to the loop, which raises it where the batch was wanted
                item = (step, None, e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or item[2] is not None:
                return

    def get(self, step: int) -> Any:
        """The batch of `step`; steps must be asked for in order."""
        if step != self._next:
            raise ValueError(f"prefetcher expected step {self._next}, was asked for {step}")
        got, batch, error = self._queue.get()
        if error is not None:
            raise error
        self._next += 1
        return batch

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
