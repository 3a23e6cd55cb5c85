"""Parameter groups: `optimizer.groups` gives labelled parameters their own optimizer, learning-rate multiplier or
hyper-parameters, through optax.partition.

Every parameter has one label from the model (`GPT.parameter_labels`): token_embedding, head (an untied LM head),
position, attn_qkv, attn_out, mlp_in, mlp_out, norm, bias. Coarse labels split all of them in three: matrix (the
blocks' four matrices), vector (norm, bias), embedding (token_embedding, head, position). A group is named by a label,
or lists its labels:

    optimizer.groups={matrix: {name: muon}, embedding: {name: adamw, lr_multiplier: 0.3}, vector: {weight_decay: 0}}
    optimizer.groups={attention: {labels: [attn_qkv, attn_out], lr_multiplier: 0.5}}

and overrides any key of the `optimizer` section its optimizer reads (its `name` too), plus `lr_multiplier` (1) and
`weight_decay` (an optimizer with no decay of its own under weight_decay_mode=native takes 0: nothing is dropped
without a word). The parameters of no group follow the section itself. A group that sets weight_decay decays every
parameter in it; one that does not keeps the usual rule (matrices and the token embedding, optimizers/decay.py). The
schedule is the run's one schedule: a group's learning rate is the schedule's times its lr_multiplier, logged as
`lr/<group>`.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Sequence
from typing import Any, Union

import chex
import jax
import optax

from core.checks import require_above_zero, require_fraction, require_non_negative
from core.errors import ConfigError
from core.param_labels import BLOCK_MATRICES, EMBEDDINGS, LABELS, VECTORS
from core.trees import path_name
from optimizers.decay import fixed, with_decay_mode
from optimizers.protocols import Group, OptimizedModel, OptimizerSection, Section
from optimizers.registry import (
    LR_USE,
    OPTIMIZERS,
    RESERVED,
    RUN_ARGUMENTS,
    build_direction,
    check_bounds,
    hyper_parameter_values,
    hyper_parameters,
)
from optimizers.schedules import own_warmups_in_steps
from optimizers.wrappers import cautious

COARSE = {"matrix": BLOCK_MATRICES, "vector": VECTORS, "embedding": EMBEDDINGS}
GROUP_KEYS = ("name", "labels", "lr_multiplier")  # a group's own keys, beside its optimizer's hyper-parameters
# The optimizer section's keys with a range, checked alike in the section and in each group that sets them.
FRACTIONS = ("beta1", "beta2", "momentum", "decay")  # in [0, 1)
NON_NEGATIVE = ("weight_decay", "grad_clip")
# eps 0: a parameter whose gradient is exactly 0 (a padded vocabulary row) takes 0/0, and the loss turns NaN
ABOVE_ZERO = ("eps",)
REST = ""  # the partition's name for the parameters of no group (no group name in what they report)


def _fail(key: str, reason: str) -> None:
    raise ConfigError(f"config: optimizer.groups.{key}: {reason}")


def group_labels(name: str, group: Group) -> tuple[str, ...]:
    """The fine labels a group covers: its `labels` (or its own name), coarse ones expanded."""
    named = group.get("labels") or [name]
    if not isinstance(named, (str, Sequence)):
        _fail(f"{name}.labels", f"must be a label or a list of labels, e.g. [attn_qkv, attn_out]; got {named!r}")
    named = [named] if isinstance(named, str) else list(named)
    fine: list[str] = []
    for label in named:
        if label not in LABELS and label not in COARSE:
            _fail(
                name,
                f"{label!r} is no parameter label; labels: {', '.join(LABELS)}; coarse: {', '.join(COARSE)}"
                " (a group named otherwise lists its labels: {labels: [...]}; one a preset or recipe set for its "
                f"optimizer is removed with ~optimizer.groups.{name})",
            )
        fine += COARSE.get(label, (label,))
    return tuple(dict.fromkeys(fine))


def check_groups(optimizer_cfg: OptimizerSection) -> None:
    """Each group's labels exist and no label is in two groups; each key is one its optimizer reads."""
    owner: dict[str, str] = {}
    for name, group in (optimizer_cfg.groups or {}).items():
        if not hasattr(group, "get"):
            _fail(name, f"must be a mapping of overrides, e.g. {{lr_multiplier: 0.5}}; got {group!r}")
        for label in group_labels(name, group):
            if label in owner:
                _fail(name, f"{label} is also in group {owner[label]}: a parameter belongs to one group")
            owner[label] = name
        optimizer = group.get("name", optimizer_cfg.name)
        if optimizer not in OPTIMIZERS:
            _fail(f"{name}.name", f"must be one of {', '.join(sorted(OPTIMIZERS))}; got {optimizer!r}")
        if LR_USE.get(optimizer, "schedule") != "schedule":  # (optimizer.name is one that takes the lr: registry.py)
            _fail(
                f"{name}.name",
                f"{optimizer} sets its own step size (and schedule-free its own evaluation weights): "
                "it runs as optimizer.name, for every parameter, without groups",
            )
        # weight_decay for every optimizer: its decay_mode may add one, and a group of an optimizer without its own
        # says 0 where the section's would be dropped (below)
        allowed = set(GROUP_KEYS) | {"weight_decay"} | set(hyper_parameters(OPTIMIZERS[optimizer]))
        for key in group:
            if key not in allowed or key in RESERVED and key != "name":
                _fail(f"{name}.{key}", f"{optimizer} has no such key; a group sets {', '.join(sorted(allowed))}")
        multiplier = group.get("lr_multiplier", 1.0)
        if not isinstance(multiplier, (int, float)) or multiplier < 0:
            _fail(f"{name}.lr_multiplier", f"must be a number >= 0; got {multiplier!r}")
        hints = typing.get_type_hints(OPTIMIZERS[optimizer])
        for key, value in group.items():  # of the section's type: a string where a number goes fails here, not in optax
            like = _like(getattr(optimizer_cfg, key, None), hints.get(key))
            if key not in GROUP_KEYS and like is not None and not _same_kind(value, like):
                _fail(f"{name}.{key}", f"must be {_a(type(like).__name__)}, as optimizer.{key}; got {value!r}")
        for key, parameter in hyper_parameters(OPTIMIZERS[optimizer]).items():  # (the section's words name it there)
            needed = parameter.default is inspect.Parameter.empty and key not in RUN_ARGUMENTS
            if needed and group.get(key, getattr(optimizer_cfg, key, None)) is None:
                _fail(f"{name}.{key}", f"{optimizer} needs a value; set it in the group ({{{key}: ...}})")
        cfg = group_config(optimizer_cfg, group)
        if (
            cfg.weight_decay > 0
            and cfg.weight_decay_mode == "native"
            and "weight_decay" not in hyper_parameters(OPTIMIZERS[optimizer])
        ):
            _fail(
                f"{name}.name",
                f"{optimizer} has no decay of its own (optimizer.weight_decay_mode=native), so the weight_decay "
                f"{cfg.weight_decay} would be dropped for this group; set weight_decay: 0 in the group, or "
                "optimizer.weight_decay_mode=decoupled or l2",
            )
        check_bounds(cfg, f"optimizer.groups.{name}")  # its optimizer's own keys, as the section's
        require_fraction(cfg, f"optimizer.groups.{name}", *(k for k in FRACTIONS if k in group))
        require_non_negative(cfg, f"optimizer.groups.{name}", *(k for k in NON_NEGATIVE if k in group))
        require_above_zero(cfg, f"optimizer.groups.{name}", *(k for k in ABOVE_ZERO if k in group))


def _like(current: object, annotation: Any) -> object:
    """A value of the kind a group's value for a key must have: the section's, or, where the section leaves the key
    null (an optimizer's own key), one of the builder's annotation (Optional[...] unwrapped); None: anything."""
    if current is not None:
        return current
    if typing.get_origin(annotation) is Union:
        annotation = next((a for a in typing.get_args(annotation) if a is not type(None)), None)
    return annotation() if annotation in (bool, int, float, str) else None


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _same_kind(value: object, current: object) -> bool:
    """A number for a number (an int for a float too), a bool for a bool, a string for a string; anything for others."""
    if isinstance(current, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(current, bool)
    if isinstance(current, (int, float)):
        return isinstance(value, (int, float))
    return isinstance(value, str) if isinstance(current, str) else True


def check_labels_present(optimizer_cfg: OptimizerSection, present: set[str]) -> None:
    """Each group names at least one label the model has (`present`: the labels of its parameters)."""
    for name, group in (optimizer_cfg.groups or {}).items():
        if not present & set(group_labels(name, group)):
            _fail(
                name,
                f"the model has no parameter labelled {' or '.join(group_labels(name, group))} (its labels: "
                f"{', '.join(label for label in LABELS if label in present)})",
            )


def matrix_optimizers(optimizer_cfg: OptimizerSection) -> set[str]:
    """The optimizers that step the blocks' matrices (BLOCK_MATRICES): a group's for the labels it covers, the
    section's for the rest."""
    names, covered = set(), set()
    for name, group in (optimizer_cfg.groups or {}).items():
        if mine := set(group_labels(name, group)) & set(BLOCK_MATRICES):
            names.add(group.get("name", optimizer_cfg.name))
            covered |= mine
    return names | ({optimizer_cfg.name} if covered != set(BLOCK_MATRICES) else set())


def group_config(optimizer_cfg: Section, group: Group) -> Section:
    """The `optimizer` section as the group's builder reads it: the section with the group's overrides."""
    overrides = {k: v for k, v in group.items() if k not in ("labels", "lr_multiplier")}
    names = {f.name for f in dataclasses.fields(optimizer_cfg)}
    cfg = dataclasses.replace(optimizer_cfg, groups={}, **{k: v for k, v in overrides.items() if k in names})
    hyper_parameter_values(cfg)  # every hyper-parameter the group's optimizer needs has a value
    return cfg


def lr_multipliers(optimizer_cfg: OptimizerSection) -> dict[str, float]:
    """Each group's learning rate relative to the schedule's (what `lr/<group>` reports)."""
    return {name: float(group.get("lr_multiplier", 1.0)) for name, group in (optimizer_cfg.groups or {}).items()}


class _GroupView:
    """The model as a group's builder sees it: the same model, with the group's weight-decay mask."""

    def __init__(self, model: OptimizedModel, decay_mask: chex.ArrayTree) -> None:
        self._model, self._decay_mask = model, decay_mask

    def weight_decay_mask(self) -> chex.ArrayTree:
        return self._decay_mask

    def __getattr__(self, name: str) -> Any:  # any other attribute of the model, as it is
        return getattr(self._model, name)


def directed(
    optimizer_cfg: OptimizerSection, model: OptimizedModel, run_steps: int | None = None
) -> optax.GradientTransformation:
    """One optimizer's direction with its weight decay as `optimizer.weight_decay_mode` says (optimizers/decay.py); its
    own `*_warmup` below 1 a fraction of the run's `run_steps` (the section's and each group's alike)."""
    if run_steps is not None:
        optimizer_cfg = own_warmups_in_steps(optimizer_cfg, run_steps)
    return with_decay_mode(
        optimizer_cfg.weight_decay_mode,
        optimizer_cfg.weight_decay,
        model.weight_decay_mask(),
        lambda wd: build_direction(dataclasses.replace(optimizer_cfg, weight_decay=wd), model, run_steps),
        cautious if optimizer_cfg.cautious else lambda t: t,
    )


def assignment_of(optimizer_cfg: OptimizerSection, model: OptimizedModel) -> chex.ArrayTree:
    """Each parameter's group (REST for none), as a tree shaped like the model's parameter labels."""
    labels = model.parameter_labels()
    check_labels_present(optimizer_cfg, set(jax.tree.leaves(labels)))
    membership = {
        label: name for name, group in (optimizer_cfg.groups or {}).items() for label in group_labels(name, group)
    }
    return jax.tree.map(lambda label: membership.get(label, REST), labels)


def geometry_groups(
    optimizer_cfg: OptimizerSection, model: OptimizedModel, whole: str = "model", rest: str = "rest"
) -> tuple[tuple[str, str], ...]:
    """(parameter path, its group) for every parameter, as the update geometry reports them
    (training/step/geometry.py): the optimizer's groups, `rest` for the parameters of none; every parameter `whole`'s
    when there are no groups."""
    tree = assignment_of(optimizer_cfg, model)
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    return tuple((path_name(path), whole if not optimizer_cfg.groups else (name or rest)) for path, name in paths)


def build_grouped_direction(
    optimizer_cfg: OptimizerSection, model: OptimizedModel, run_steps: int | None = None
) -> optax.GradientTransformation:
    """The step's direction for a unit learning rate: the section's optimizer, or one per group (optax.partition).
    `run_steps`: the run's optimizer steps, for a builder that asks for them (registry.RUN_ARGUMENTS)."""
    groups = dict(optimizer_cfg.groups or {})
    if not groups:
        return directed(optimizer_cfg, model, run_steps)
    assignment = assignment_of(optimizer_cfg, model)
    transforms = {}
    for name, group in {**groups, REST: {}}.items():
        cfg = group_config(optimizer_cfg, group) if group else optimizer_cfg
        decay_mask = model.weight_decay_mask()
        if "weight_decay" in group:  # set for the group: it decays every parameter of the group
            decay_mask = jax.tree.map(lambda _: True, decay_mask)
        try:
            direction = directed(cfg, _GroupView(model, decay_mask), run_steps)
        except ConfigError as e:  # a builder's check names the section's key; the value came from the group
            if not group:
                raise
            raise ConfigError(str(e).replace("config: optimizer.", f"config: optimizer.groups.{name}.", 1)) from None
        multiplier = float(group.get("lr_multiplier", 1.0))
        transforms[name] = direction if multiplier == 1.0 else optax.chain(direction, optax.scale(multiplier))
    return optax.partition(transforms, fixed(assignment))
