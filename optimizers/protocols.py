"""What the optimizers read of the objects they are handed, named as protocols: optimizers/ imports neither the model
(models/) nor the run's config (training/config/), so each is typed by the attributes read here.

  OptimizedModel    the model (models/gpt.py's GPT): its weight-decay mask and parameter labels, trees shaped like it
  OptimizerSection  the `optimizer` config section (training/config/optimizer.py's OptimizerConfig, a frozen
                    dataclass: groups.py and schedules.py replace its fields); builders' own hyper-parameters are
                    read by name (registry.py)
  LrSection         its `lr_config` (LrConfig): the learning-rate schedule
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

import chex

Group = Mapping[str, Any]  # a parameter group's overrides: labels, lr_multiplier and hyper-parameters (config values)


class OptimizedModel(Protocol):
    def weight_decay_mask(self) -> chex.ArrayTree:
        """A tree shaped like the model: True for the parameters weight decay applies to."""
        ...

    def parameter_labels(self) -> chex.ArrayTree:
        """A tree shaped like the model: each parameter's label (core/param_labels.py)."""
        ...


class LrSection(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def lr(self) -> float: ...

    @property
    def warmup(self) -> float: ...

    @property
    def min_lr_ratio(self) -> float: ...

    @property
    def decay_fraction(self) -> float: ...

    @property
    def boundaries(self) -> Sequence[int]: ...

    @property
    def boundary_lrs(self) -> Sequence[float]: ...


class OptimizerSection(Protocol):
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # a dataclass: its fields have any types

    @property
    def name(self) -> str: ...

    @property
    def lr_config(self) -> LrSection: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def weight_decay_mode(self) -> str: ...

    @property
    def grad_clip(self) -> float: ...

    @property
    def cautious(self) -> bool: ...

    @property
    def mechanic(self) -> bool: ...

    @property
    def groups(self) -> Mapping[str, Group]: ...


Section = TypeVar("Section", bound=OptimizerSection)  # a function that returns the section it got, changed
