"""train.stages: the run in stages, as the GPT-2 speedrun trains (batches that grow, attention windows that grow with
YaRN's rescaling of the rotary positions, an lr multiplier per stage), derived from the config where it is used.

A stage is a pure function of the step, so a resumed run is in the stage it would have been in, reads the batches it
would have read and applies the lr it would have applied. Stage i runs steps [first_step_i, first_step_(i+1)); its
boundaries are its `until` fractions of the lr schedule's length, rounded to steps. Without train.stages the run is
one stage, as configured.

Where each part lands: the data reads `batch_sizes` (data/batches.py BatchSizes), the train step multiplies the
schedule's lr by `lr_multiplier_at` of its step (training/step/train_step.py TrainStep), the step reads the model
under `stage_model_config` (each stage's program is compiled at its first step), and the model the run ends with,
the one its checkpoints describe and every tool rebuilds, is `final_model` (the last stage's window, and with
train.yarn the windows before it); `model_after` reads it as the stage of a given step did (evaluations during the
run, a mid-run checkpoint's tools).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np

from core.checks import fail
from data.batches import BatchSizes
from training.config.root import schedule_steps

if TYPE_CHECKING:
    from models.config import GPTConfig
    from models.gpt import GPT
    from training.config.root import Config


@dataclass(frozen=True)
class Stage:
    first_step: int
    batch_size: int  # sequences per micro-batch per process
    attention_window: int | None
    lr_multiplier: float


def plan_stages(cfg: Config) -> tuple[Stage, ...]:
    """The run's stages, the first at step 0; one stage (the run as configured) without train.stages."""
    t, steps = cfg.train, schedule_steps(cfg)
    if not t.stages:
        return (Stage(0, t.batch_size, cfg.model.attention_window, 1.0),)
    starts = [0] + [round(s.until * steps) for s in t.stages[:-1]]
    for i in range(1, len(starts)):
        if starts[i] <= starts[i - 1]:
            fail(
                f"train.stages[{i - 1}].until",
                f"{t.stages[i - 1].until} leaves stage {i - 1} no step of the run's {steps}: space the stages wider",
            )
    context = cfg.model.context_size
    return tuple(
        Stage(first, s.batch_size or t.batch_size, _within(s.attention_window, context), s.lr_multiplier)
        for first, s in zip(starts, t.stages)
    )


def _within(window: int | None, context: int) -> int | None:
    """A window at most the model's context: a wider one is full attention, and as itself it grew under train.yarn
    where nothing could (the speedrun's windows of 64 to 256 over a 32-token context: rotary positions rescaled at
    each stage for positions no query sees)."""
    return None if window is None else min(window, context)


def stage_index(stages: tuple[Stage, ...], step: int) -> int:
    """The stage that runs `step` (0-based: the step after `step` completed ones)."""
    return max(i for i, s in enumerate(stages) if s.first_step <= step)


def batch_sizes(stages: tuple[Stage, ...]) -> BatchSizes:
    return BatchSizes(tuple(s.first_step for s in stages), tuple(s.batch_size for s in stages))


def lr_multiplier_at(stages: tuple[Stage, ...]):
    """step -> the lr multiplier of the stage that runs `step` (0-based, traceable: the train step's state.step), or
    None when every stage's is 1. A step, not an update count: after a skipped step the count is behind, and the
    stage's batch and window follow the step."""
    if all(s.lr_multiplier == 1.0 for s in stages):
        return None
    starts = np.asarray([s.first_step for s in stages])
    multipliers = np.asarray([s.lr_multiplier for s in stages], np.float32)

    def at(step):
        return jnp.asarray(multipliers)[jnp.searchsorted(jnp.asarray(starts), step, side="right") - 1]

    return at


def yarn_windows(stages: tuple[Stage, ...], upto: int, yarn: bool) -> tuple[int, ...]:
    """With train.yarn, the distinct windows the stages before `upto` grew through to reach its window."""
    if not yarn:
        return ()
    path: list[int] = []
    for s in stages[: upto + 1]:
        if s.attention_window is not None and (not path or path[-1] != s.attention_window):
            path.append(s.attention_window)
    return tuple(path[:-1])


def final_model(cfg: Config) -> Config:
    """`cfg` with the `model` section the run ends with: the last stage's attention window, and with train.yarn the
    windows it grew through (model.yarn_windows). `cfg` itself without stages that name windows."""
    stages = plan_stages(cfg) if cfg.train.stages else ()
    if not stages or stages[-1].attention_window is None:
        return cfg
    last = len(stages) - 1
    model = dataclasses.replace(
        cfg.model,
        attention_window=stages[last].attention_window,
        yarn_windows=list(yarn_windows(stages, last, cfg.train.yarn)) or cfg.model.yarn_windows,
    )
    return dataclasses.replace(cfg, model=model)


def stage_model_config(model_cfg: GPTConfig, stages: tuple[Stage, ...], index: int, yarn: bool) -> GPTConfig | None:
    """The model's static description in stage `index` (its window and YaRN's windows so far), or None where it is
    the model's own (no stage names a window, or the last stage)."""
    stage = stages[index]
    if stage.attention_window is None or index == len(stages) - 1:
        return None
    windows = yarn_windows(stages, index, yarn) if yarn else model_cfg.yarn_windows
    return dataclasses.replace(model_cfg, attention_window=stage.attention_window, yarn_windows=windows)


def model_config_at(cfg: Config, model_cfg: GPTConfig):
    """step -> the model's static description in that step's stage (the train step's), None where it is the
    model's own."""
    stages = plan_stages(cfg)
    configs = [stage_model_config(model_cfg, stages, i, cfg.train.yarn) for i in range(len(stages))]
    return lambda step: configs[stage_index(stages, step)]


def model_after(model: GPT, cfg: Config, steps_done: int) -> GPT:
    """`model` (the run's final description) as the stage of its last step read it after `steps_done` steps: what
    evaluating, sampling or exporting a checkpoint of that step should see."""
    from models.gpt import with_config

    view = model_config_at(cfg, model.cfg)(max(steps_done - 1, 0))
    return model if view is None else with_config(model, view)
