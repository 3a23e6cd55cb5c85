"""Wall time for the loop: throughput over each log interval, elapsed / remaining, and the time budget."""

from __future__ import annotations

import time
from collections.abc import Callable


class RunClock:
    def __init__(
        self, started: float, max_hours: float | None, tokens_before: Callable[[int], int], max_steps: int
    ) -> None:
        self.started = started  # process start: a time limit must cover set-up and compilation too
        self.deadline = None if max_hours is None else started + max_hours * 3600.0
        self.tokens_before = tokens_before  # step -> training tokens of the run's first `step` steps
        self.max_steps = max_steps
        self._mark: tuple[float, int] | None = None
        self._seconds_per_step: float | None = None

    def mark(self, step: int) -> None:
        """Start measuring from here (after the first, compiling step)."""
        self._mark = (time.perf_counter(), step)

    def interval(self, step: int) -> tuple[float, float]:
        """(tokens/s, ms/step) since the last call or mark; needs the device to have finished `step`."""
        now = time.perf_counter()
        if self._mark is None or step <= self._mark[1]:
            self._mark = (now, step)
            return float("nan"), float("nan")
        t0, s0 = self._mark
        seconds_per_step = (now - t0) / (step - s0)
        self._mark = (now, step)
        self._seconds_per_step = seconds_per_step
        tokens = self.tokens_before(step) - self.tokens_before(s0)
        return tokens / (now - t0), 1000.0 * seconds_per_step

    def elapsed(self) -> float:
        return time.time() - self.started

    def remaining(self, step: int) -> float:
        """Time to max_steps at the measured pace, or to the deadline if sooner."""
        estimate = (self.max_steps - step) * (self._seconds_per_step or 0.0)
        if self.deadline is not None:
            estimate = min(estimate, max(self.deadline - time.time(), 0.0))
        return estimate

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline
