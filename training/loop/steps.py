"""The training loop: a small loop state, and actions that fire every N steps.

Each iteration dispatches one `train_step` and moves on; JAX runs it asynchronously, so the host is already preparing
the next step while the device computes. Only an action that reads results (logging fetches the metrics, evaluation,
saving, agreeing with the other processes to stop) makes the host wait for the device, and actions fire only at their
steps. An action is a function of the loop state and a rule for when it is due; adding one touches no other.

`guard=True` proves it: every iteration at which no syncing action is due runs inside
`training/loop/transfer_guard.no_device_to_host()`, so any device-to-host transfer there raises.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from training.loop.transfer_guard import no_device_to_host

if TYPE_CHECKING:
    from training.step.losses import Batch
    from training.step.state import TrainState


@dataclass
class LoopState:
    """What the loop and its actions share between steps."""

    state: TrainState  # on the devices
    step: int  # optimizer steps completed
    tokens_seen: int
    pending: list = field(default_factory=list)  # metrics of the steps since the last log, not yet fetched
    train_loss: float = math.nan  # the last logged interval's
    val_loss: float | None = None  # the last evaluation's main split
    best_val: float = math.inf
    results: dict | None = None  # the last evaluation, every split
    stop: str | None = None  # why the loop ends before max_steps: "time limit", "SIGTERM", ...


@dataclass
class Action:
    """`fire(loop)` after every step that `every` divides, after the `steps` listed, and (`at_end`) after the last
    step. `syncs`: it may make the host wait for the device (the transfer guard is off when one is due)."""

    fire: Callable[[LoopState], None]
    every: int | None = None
    steps: frozenset[int] = frozenset()
    at_end: bool = False
    syncs: bool = True

    def due(self, step: int, end: int) -> bool:
        return bool(self.every and step % self.every == 0) or step in self.steps or (self.at_end and step == end)


def run_loop(
    loop: LoopState,
    train_step: Callable,
    batch_of: Callable[[int], Batch],
    actions: list[Action],
    end: int,
    tokens_of: Callable[[int], int],
    after_step: Callable[[], None] = lambda: None,
    guard: bool = False,
) -> None:
    """Steps until `end` or until an action sets `loop.stop`; the due actions run in list order after each step."""
    while loop.step < end and loop.stop is None:
        due = [a for a in actions if a.due(loop.step + 1, end)]
        with no_device_to_host() if guard and not any(a.syncs for a in due) else contextlib.nullcontext():
            loop.state, metrics = train_step(loop.state, batch_of(loop.step), loop.step)
            loop.pending.append(metrics)
            loop.tokens_seen += tokens_of(loop.step)
            loop.step += 1
            after_step()
            for action in due:
                action.fire(loop)
