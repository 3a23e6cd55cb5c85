"""The `optimizer` section and its `lr_config`: which optax optimizer, its hyper-parameters, the learning-rate
schedule, and the checks on their values."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from core.checks import fail, refuse_unread, require_above_zero, require_fraction, require_non_negative
from optimizers.groups import ABOVE_ZERO, FRACTIONS, NON_NEGATIVE, check_groups
from optimizers.registry import check_optimizer, with_hyper_parameters


class DecayMode(StrEnum):
    """How weight decay is applied (optimizers/decay.py)."""

    native = "native"  # as the optimizer defines it (decoupled for adamw, lion, muon; L2 for adam, sgdm, ...)
    decoupled = "decoupled"  # -weight_decay x w beside the optimizer's direction, times the lr
    l2 = "l2"  # weight_decay x w added to the gradient before the optimizer


class Schedule(StrEnum):
    """The learning-rate schedule after the warmup (optimizers/schedules.py)."""

    constant = "constant"  # lr throughout
    linear = "linear"  # lr -> the floor in a straight line
    cosine = "cosine"  # lr -> the floor along half a cosine
    trapezoid = "trapezoid"  # lr, then linearly to the floor over the last decay_fraction (warmup-stable-decay)
    piecewise_linear = "piecewise_linear"  # straight lines through (boundaries[i], boundary_lrs[i])

    @property
    def decays_to_floor(self) -> bool:
        return self in (Schedule.linear, Schedule.cosine, Schedule.trapezoid)


@dataclass(frozen=True)
class LrConfig:
    name: Schedule = Schedule.cosine  # the schedule's shape
    lr: float = 1e-3  # peak learning rate
    # linear warmup: 1 or more = steps (the first step's lr is lr / warmup, never 0); below 1 = that fraction of the
    # schedule's steps (so that a preset's warmup fits a run of any length)
    warmup: float = 0
    min_lr_ratio: float = 0.1  # the floor reached at the end of the decay, as a fraction of lr
    max_steps: Optional[int] = None  # schedule length; null = train.max_steps
    decay_fraction: float = 0.2  # trapezoid: share of the steps spent in the final linear decay
    boundaries: list[int] = field(default_factory=list)  # piecewise_linear: steps after warmup (repeated: a jump) ...
    boundary_lrs: list[float] = field(default_factory=list)  # ... and the lr reached at each of them

    def check(self) -> None:
        at = "optimizer.lr_config"
        require_non_negative(self, at, "lr")
        if not 0 <= self.min_lr_ratio <= 1:
            fail(f"{at}.min_lr_ratio", f"must be in [0, 1] (the floor as a fraction of lr); got {self.min_lr_ratio}")
        require_non_negative(self, at, "warmup")
        if self.warmup >= 1 and self.warmup != int(self.warmup):
            fail(
                f"{at}.warmup",
                f"1 or more is a number of steps, a whole one (below 1, a fraction of the run); got {self.warmup}",
            )
        if self.max_steps is not None and self.max_steps < 1:
            fail(f"{at}.max_steps", f"must be >= 1 (or null for train.max_steps); got {self.max_steps}")
        if not 0.0 <= self.decay_fraction <= 1.0:
            fail(f"{at}.decay_fraction", f"must be in [0, 1]; got {self.decay_fraction}")
        if self.name == Schedule.piecewise_linear:
            if not self.boundaries or len(self.boundaries) != len(self.boundary_lrs):
                fail(f"{at}.boundaries", "piecewise_linear needs boundaries and boundary_lrs of equal, non-zero length")
            if list(self.boundaries) != sorted(self.boundaries) or self.boundaries[0] <= 0:
                fail(
                    f"{at}.boundaries",
                    f"must be non-decreasing positive steps (a repeated one is a jump); got {list(self.boundaries)}",
                )
            if any(v < 0 for v in self.boundary_lrs):
                fail(f"{at}.boundary_lrs", f"must all be >= 0; got {list(self.boundary_lrs)}")
        piecewise, schedule = self.name == Schedule.piecewise_linear, f"the {self.name} schedule"
        refuse_unread(
            self,
            at,
            {
                "boundaries": (
                    piecewise,
                    f"piecewise_linear ({schedule} here)",
                    "optimizer/lr_config=piecewise_linear",
                ),
                "boundary_lrs": (
                    piecewise,
                    f"piecewise_linear ({schedule} here)",
                    "optimizer/lr_config=piecewise_linear",
                ),
                "decay_fraction": (
                    self.name == Schedule.trapezoid,
                    f"trapezoid ({schedule} here)",
                    "optimizer/lr_config=trapezoid",
                ),
            },
        )


@dataclass(frozen=True)
class OptimizerConfig:
    # A registered optimizer (a module of optimizers/ with @register(name)): a plain string, so that adding that file
    # is all it takes to choose it here.
    name: str = "adamw"
    lr_config: LrConfig = field(default_factory=LrConfig)  # the learning-rate schedule
    beta1: float = 0.9  # first-moment decay (adam family, lion, muon's Adam fallback)
    beta2: float = 0.95  # second-moment decay (adam family, muon's Adam fallback); lion: its update interpolation
    eps: float = 1e-8  # added to the second moment's root (adam family); rmsprop: inside the root (optax's)
    weight_decay: float = 0.1  # matrices only (unless a group sets it); decoupled for adamw, lion, muon
    momentum: float = 0.9  # sgdm, rmsprop, muon
    nesterov: bool = False  # sgdm, muon
    decay: float = 0.9  # rmsprop: squared-gradient averaging
    grad_clip: float = 1.0  # global-norm clipping threshold; 0 = off
    weight_decay_mode: DecayMode = DecayMode.native  # the optimizer's own decay, or decoupled, or L2, for any optimizer
    # keep only the direction's entries that agree in sign with the descent (Cautious, 2024): an optimizer's own decay
    # is masked with its direction; weight_decay_mode=decoupled keeps the decay outside the mask, as the paper's
    cautious: bool = False
    mechanic: bool = False  # wrap the optimizer in Mechanic, which learns the scale of its steps (Cutkosky et al.)
    # parameter groups (optimizers/groups.py): {group: {labels: [...], name: <optimizer>, lr_multiplier: x, <key>: v}};
    # a group named by a label needs no `labels`; labels: token_embedding, head, position, attn_qkv, attn_out, mlp_in,
    # mlp_out, norm, bias, or matrix, vector, embedding; parameters of no group follow this section
    groups: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        check_optimizer(self)  # a registered name, and every hyper-parameter its builder needs
        self.lr_config.check()
        require_fraction(self, "optimizer", *FRACTIONS)
        require_non_negative(self, "optimizer", *NON_NEGATIVE)
        require_above_zero(self, "optimizer", *ABOVE_ZERO)
        check_groups(self)


# Each registered optimizer's own hyper-parameters (its builder's keyword arguments that are not fields above) join
# the section, typed by the builder's annotations; null = the builder's default (optimizers/registry.py).
OptimizerConfig = with_hyper_parameters(OptimizerConfig)  # type: ignore[misc]
