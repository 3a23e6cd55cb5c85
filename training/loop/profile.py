"""A jax.profiler trace of chosen steps (`system.profile_steps=[a, b]`), written into the run directory.

The trace covers steps a to b and nothing else: the step before a is waited for before the trace starts, and step b
before it stops, so compilation (step 1), evaluation and checkpoints outside the range stay out of it. It holds the
device's kernels and the host's dispatch side by side: gaps between kernels are the device waiting for the host.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import jax

from training.config import layout

if TYPE_CHECKING:
    from training.step.state import TrainState


class StepProfiler:
    def __init__(self, run_dir: Path, steps: list[int], is_main: bool) -> None:
        self.first, self.last = steps if steps else (0, -1)
        self.out = run_dir / layout.PROFILE
        self.is_main = is_main
        self.tracing = False

    def boundaries(self, first_step: int) -> frozenset[int]:
        """The steps after which the trace starts or stops (a run resumed past them has none)."""
        return frozenset(s for s in (self.first - 1, self.last) if s > first_step and self.last > first_step)

    def at_start(self, first_step: int, state: TrainState) -> None:
        """A trace that begins with the run's first step (or a resumed run's) starts before the loop."""
        if self.first - 1 <= first_step < self.last:
            self._start(state)

    def after_step(self, step: int, state: TrainState) -> None:
        if step == self.first - 1:
            self._start(state)
        elif step == self.last:
            self.stop(state)

    def _start(self, state: TrainState) -> None:
        if self.is_main:
            jax.block_until_ready(state)
            self.out.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.out), create_perfetto_trace=True)
            self.tracing = True

    def stop(self, state: TrainState) -> None:
        """Ends the trace (also when the run stops inside the range)."""
        if self.tracing:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.tracing = False
