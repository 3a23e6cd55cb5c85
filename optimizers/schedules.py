"""Learning-rate schedules built from optax: a linear warmup joined to a decay shape, with a floor of `min_lr_ratio`
times the peak (so that a preset's floor follows its own lr, whatever lr a run gives it).

The warmup is `warmup` steps, or (below 1) that fraction of the schedule's steps, so that a preset's warmup fits a
run of any length. Step s (0-based) of a warmup of w steps uses lr * (s + 1) / w, so the first step learns (lr / w,
not 0) and step w - 1 reaches the peak. The decay then runs from step w to `max_steps`:
  constant          lr throughout
  linear            lr -> the floor in a straight line
  cosine            lr -> the floor along half a cosine
  trapezoid         lr until the last decay_fraction of the steps, then linearly to the floor (warmup-stable-decay)
  piecewise_linear  straight lines through (boundaries[i], boundary_lrs[i]), counted from the end of the warmup; a
                    boundary given twice is a jump (scripts/experiments/schedule_search.py writes piecewise-constant
                    schedules so)
Past `max_steps` every schedule holds its final value. A decay reaches its floor at update count `max_steps`, one past
the run's last update (count max_steps - 1), as optax's schedules and the modded-nanogpt speedrun's count: a linear
decay's last update is at 1/decay_steps of the way from the floor, and a trapezoid's cool-down of n steps takes n - 1
of them below the peak (in a 10-step run, decay_fraction 0.1 is one step, at the peak: no decay).
"""

from __future__ import annotations

import dataclasses

import optax

from optimizers.protocols import LrSection, Section


def warmup_steps(lr_cfg: LrSection, total_steps: int) -> int:
    """The warmup in steps: `warmup` (1 or more), or that fraction of `total_steps` (rounded, at least 1)."""
    if 0 < lr_cfg.warmup < 1:
        return max(1, round(lr_cfg.warmup * total_steps))
    return int(lr_cfg.warmup)


def own_warmups_in_steps(optimizer_cfg: Section, total_steps: int) -> Section:
    """The `optimizer` section (a dataclass) with the warmups its method runs inside itself (`sf_warmup` of the
    schedule-free methods: any hyper-parameter named `*_warmup`) in steps: like `lr_config.warmup`, a value below 1
    is that fraction of `total_steps` (rounded, at least 1)."""
    warmups = {
        f.name: getattr(optimizer_cfg, f.name) for f in dataclasses.fields(optimizer_cfg) if f.name.endswith("_warmup")
    }
    fractions = {
        name: max(1, round(value * total_steps))
        for name, value in warmups.items()
        if isinstance(value, (int, float)) and 0 < value < 1
    }
    return dataclasses.replace(optimizer_cfg, **fractions) if fractions else optimizer_cfg


def build_schedule(lr_cfg: LrSection, total_steps: int) -> optax.Schedule:
    """`total_steps`: the schedule's length (optimizer steps), `lr_config.max_steps` or else `train.max_steps`."""
    peak, floor, warmup = lr_cfg.lr, lr_cfg.min_lr_ratio * lr_cfg.lr, warmup_steps(lr_cfg, total_steps)
    decay_steps = total_steps - warmup
    name = lr_cfg.name
    if name == "constant":
        decay = optax.constant_schedule(peak)
    elif decay_steps < 1 and name != "piecewise_linear":  # the warmup is the whole schedule: the floor after it
        decay = optax.constant_schedule(floor)
    elif name == "linear":
        decay = optax.linear_schedule(peak, floor, decay_steps)
    elif name == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=lr_cfg.min_lr_ratio)
    elif name == "trapezoid":
        # the last decay_fraction of the run, or all that the warmup leaves of it: the run ends at the floor
        cooldown = min(max(round(lr_cfg.decay_fraction * total_steps), 1), decay_steps)
        stable = max(decay_steps - cooldown, 0)
        decay = optax.join_schedules(
            [optax.constant_schedule(peak), optax.linear_schedule(peak, floor, cooldown)], [stable]
        )
    elif name == "piecewise_linear":
        points = [(0, peak)] + list(zip(lr_cfg.boundaries, lr_cfg.boundary_lrs))
        pieces = [optax.linear_schedule(v0, v1, s1 - s0) for (s0, v0), (s1, v1) in zip(points, points[1:])]
        pieces.append(optax.constant_schedule(points[-1][1]))
        decay = optax.join_schedules(pieces, [s for s, _ in points[1:]])
    else:
        raise ValueError(f"unknown schedule {name!r}")
    if warmup == 0:
        return decay
    ramp = optax.linear_schedule(peak / warmup, peak, max(warmup - 1, 0))
    return optax.join_schedules([ramp, decay], [warmup])
