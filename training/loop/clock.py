"""Wall time for the loop: throughput over each log interval, elapsed / remaining, the time budget, and the time
spent training (`time_trained_s`)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator


class RunClock:
    def __init__(
        self, started: float, max_hours: float | None, tokens_before: Callable[[int], int], max_steps: int
    ) -> None:
        self.started = started  # process start: a time limit must cover set-up and compilation too
        self.deadline = None if max_hours is None else started + max_hours * 3600.0
        self.tokens_before = tokens_before  # step -> training tokens of the run's first `step` steps
        self.max_steps = max_steps
        self._mark: tuple[float, int] | None = None  # (time, step) timing runs from; None: not timing
        self._timed = (0.0, 0, 0)  # the open interval's timed seconds, steps and tokens
        self._seconds_per_step: float | None = None

    def mark(self, step: int) -> None:
        """Time from here: after a step that compiled (the run's first, a later stage's first)."""
        self._mark = (time.perf_counter(), step)

    def pause(self, step: int) -> None:
        """Stop timing after `step` (the device done with it) until the next mark: what follows is not training (an
        evaluation, a save) or compiles (a later stage's first step). What was timed since the mark stays in the open
        interval (a mark alone dropped it: a log at a stage's first step had no rate)."""
        if self._mark is not None:
            self._add(time.perf_counter(), step)
        self._mark = None

    def _add(self, now: float, step: int) -> None:
        t0, s0 = self._mark
        if step > s0:
            seconds, steps, tokens = self._timed
            tokens += self.tokens_before(step) - self.tokens_before(s0)
            self._timed = (seconds + now - t0, steps + step - s0, tokens)

    def interval(self, step: int) -> tuple[float, float]:
        """(tokens/s, ms/step) over the steps timed since the last call; NaN when none was (the interval of a step
        that compiled, before any mark); needs the device to have finished `step`."""
        now = time.perf_counter()
        if self._mark is not None:
            self._add(now, step)
            self._mark = (now, step)
        seconds, steps, tokens = self._timed
        self._timed = (0.0, 0, 0)
        if not steps:
            self._mark = self._mark or (now, step)
            return float("nan"), float("nan")
        self._seconds_per_step = seconds / steps
        return tokens / seconds, 1000.0 * seconds / steps

    def remaining(self, step: int) -> float:
        """Time to max_steps at the measured pace, or to the deadline if sooner; NaN before a pace is measured (it
        was 0, which read as a run about to end)."""
        if self._seconds_per_step is None:
            return math.nan
        estimate = (self.max_steps - step) * self._seconds_per_step
        if self.deadline is not None:
            estimate = min(estimate, max(self.deadline - time.time(), 0.0))
        return estimate

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline


class TrainingTime:
    """Seconds spent training: running from the loop's start to its end, paused while the run evaluates, saves or
    measures (what `time_trained_s` names); a run that trains no step adds nothing."""

    def __init__(self) -> None:
        self.total = 0.0
        self._since: float | None = None

    def start(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def stop(self) -> None:
        if self._since is not None:
            self.total += time.perf_counter() - self._since
            self._since = None

    def seconds(self) -> float:
        return self.total + (0.0 if self._since is None else time.perf_counter() - self._since)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        running = self._since is not None
        self.stop()
        try:
            yield
        finally:
            if running:
                self.start()
