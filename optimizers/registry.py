"""Optimizers by name: a module of this package registers its builder with `@register("name")`, and
optimizers/__init__.py imports every module of the package, so a new file is all it takes to add one.

A builder is `builder(model, *, <hyper-parameters>) -> optax.GradientTransformation`: the model gives the
weight-decay and Muon masks, and the keyword arguments are the hyper-parameters it reads from the `optimizer` config
section. Names the schema already has (training/config/optimizer.py: beta1, beta2, eps, weight_decay, momentum,
nesterov, decay) come typed from there; any other name joins the schema when the builder registers, typed by the
builder's annotation, null by default (null = the builder's own default), so conf/optimizer/<name>.yaml and the
command line (`optimizer.<key>=...`) can set it. The builder returns the step's direction for a unit learning rate
(already negated): the learning rate, clipping and accumulation are added around it (optimizers/__init__.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any, Optional

import optax

from core.errors import ConfigError
from optimizers.protocols import OptimizedModel, OptimizerSection

Builder = Callable[..., optax.GradientTransformation]
OPTIMIZERS: dict[str, Builder] = {}  # name -> builder, in the order the modules registered them
# Keys of the `optimizer` section that belong to the wrapping (schedule, clipping) or to the choice, never to a builder.
RESERVED = ("name", "lr_config", "grad_clip")
# Keyword arguments a builder may declare that the run fills, not the config: `run_steps`, the optimizer steps the
# run's schedule spans (for what a method does at the end of a run, Muon's momentum cool-down).
RUN_ARGUMENTS = ("run_steps",)
OWN_KEYS: dict[str, list[str]] = {}  # hyper-parameters the schema gained from builders -> the optimizers that read them


LR_USES = ("schedule", "estimate", "own")
LR_USE: dict[str, str] = {}  # name -> how the optimizer takes the run's lr schedule (default "schedule")
STEP_SIZE: dict[str, str] = {}  # lr="own": the key that sets the method's step size (what a sweep over it sets)
AVERAGED: set[str] = set()  # the optimizers whose evaluation weights are an average their state keeps (schedule-free)
# the optimizers whose step on a matrix scales with width by a rule of their own, not Adam's (μP's 1/m does not fit)
OWN_WIDTH_RULE: dict[str, str] = {}
# The ranges a builder's own hyper-parameters may take, checked with the config (register's `bounds`): rule -> (test,
# what the error says)
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "positive": (lambda v: v > 0, "> 0"),
    "non_negative": (lambda v: v >= 0, ">= 0"),
    "fraction": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "count": (lambda v: v >= 1, ">= 1"),
}
BOUNDS: dict[str, dict[str, str]] = {}  # name -> {hyper-parameter: rule}


def register(
    name: str,
    lr: str = "schedule",
    averaged: bool = False,
    bounds: dict[str, str] | None = None,
    step_size: str = "",
    width_rule: str = "",
) -> Callable[[Builder], Builder]:
    """`@register("name")` on a builder `(model, *, hyper-parameters) -> optax.GradientTransformation`. `lr`: how its
    direction takes the run's learning-rate schedule: `schedule` (times it), `estimate` (times it, and the method
    reads it too: Prodigy and D-Adaptation multiply the step size they estimate by it, as their authors' lr, 1 in
    their papers; their estimate's sums weigh each step by it), `own` (not at all: a method whose step size is a key
    of its own and breaks under any other, schedule-free, COCOB). `averaged`: the weights it evaluates are an average
    of its iterates that its state rebuilds from its own steps (schedule-free), so nothing may change a step after it
    (optimizers/__init__.py's eval_params). `bounds`: {hyper-parameter: rule} (a rule of RULES) for the values that
    would train without an error and wrongly, checked with the config (check_bounds); a check that spans keys stays
    in the builder. `step_size`: with lr="own", the key that sets the method's step size (named where a run sets the
    lr). `width_rule`: how its step on a hidden matrix should scale with the model's width where that is not Adam's
    1/m, which μP applies (models/mup.py): said where μP is refused."""
    if lr not in LR_USES:
        raise TypeError(f"register({name!r}, lr={lr!r}): lr must be one of {', '.join(LR_USES)}")
    if unknown := [rule for rule in (bounds or {}).values() if rule not in RULES]:
        raise TypeError(f"register({name!r}): bounds' rules are {', '.join(RULES)}; got {', '.join(unknown)}")
    LR_USE[name] = lr
    BOUNDS[name] = dict(bounds or {})
    if step_size:
        STEP_SIZE[name] = step_size
    if averaged:
        AVERAGED.add(name)
    if width_rule:
        OWN_WIDTH_RULE[name] = width_rule

    def add(builder: Builder) -> Builder:
        where = f"{builder.__module__}.{builder.__qualname__}"
        if name in OPTIMIZERS:
            raise TypeError(f"{where}: optimizer {name!r} is already registered by {OPTIMIZERS[name].__module__}")
        kinds = [p.kind for p in inspect.signature(builder).parameters.values()]
        if kinds[:1] != [inspect.Parameter.POSITIONAL_OR_KEYWORD] or set(kinds[1:]) - {inspect.Parameter.KEYWORD_ONLY}:
            raise TypeError(
                f"{where}: a builder takes the model, then its hyper-parameters as keyword-only "
                "arguments: def build(model, *, beta1: float, ...)"
            )
        if reserved := [k for k in hyper_parameters(builder) if k in RESERVED]:
            raise TypeError(
                f"{where}: {', '.join(reserved)} belong to every optimizer (the wrapping), not to a builder"
            )
        OPTIMIZERS[name] = builder
        return builder

    return add


def hyper_parameters(builder: Builder) -> dict[str, inspect.Parameter]:
    """The builder's keyword-only arguments but the run's (RUN_ARGUMENTS): the config keys it reads."""
    return {
        p.name: p
        for p in inspect.signature(builder).parameters.values()
        if p.kind == p.KEYWORD_ONLY and p.name not in RUN_ARGUMENTS
    }


def with_hyper_parameters(schema: type) -> type:
    """`schema` (the `optimizer` section's dataclass) with a field for every registered builder's hyper-parameter it
    lacks: Optional[<the builder's annotation>], default None (= the builder's own default)."""
    known = {f.name for f in dataclasses.fields(schema)}
    types: dict[str, object] = {}  # key -> its annotation (a type or a typing form)
    OWN_KEYS.clear()
    for name, builder in OPTIMIZERS.items():
        hints = typing.get_type_hints(builder)
        for key in hyper_parameters(builder):
            if key in known:
                continue
            annotation = hints.get(key, Any)
            if types.setdefault(key, annotation) != annotation:
                raise TypeError(
                    f"optimizer hyper-parameter {key!r}: {name} annotates it {annotation}, "
                    f"{OWN_KEYS[key][0]} {types[key]}; one key has one type"
                )
            OWN_KEYS.setdefault(key, []).append(name)
    if not types:
        return schema
    fields = [(key, Optional[annotation], dataclasses.field(default=None)) for key, annotation in types.items()]
    frozen = schema.__dataclass_params__.frozen  # a frozen section's subclass must be frozen too
    extended = dataclasses.make_dataclass(schema.__name__, fields, bases=(schema,), frozen=frozen)
    # Named where the schema's module binds it (training/config/optimizer.py), so that pickle (submitit's jobs carry
    # the config to their process) finds this class by name instead of copying it into a class of its own.
    extended.__module__, extended.__qualname__ = schema.__module__, schema.__qualname__
    return extended


def build_direction(
    optimizer_cfg: OptimizerSection, model: OptimizedModel, run_steps: int | None = None
) -> optax.GradientTransformation:
    """The registered builder of `optimizer_cfg.name`, called with the hyper-parameters it names (and `run_steps`,
    the run's optimizer steps or None where unknown, if it declares it)."""
    builder = OPTIMIZERS[optimizer_cfg.name]
    run = {"run_steps": run_steps} if "run_steps" in inspect.signature(builder).parameters else {}
    return builder(model, **hyper_parameter_values(optimizer_cfg), **run)


def hyper_parameter_values(optimizer_cfg: OptimizerSection) -> dict[str, Any]:
    """What the chosen builder receives: each of its hyper-parameters from the config, but those left null that the
    builder has a default for. Raises ConfigError naming a key the builder needs and nothing sets."""
    name = optimizer_cfg.name
    values = {}
    for key, parameter in hyper_parameters(OPTIMIZERS[name]).items():
        value = getattr(optimizer_cfg, key, None)
        if value is None and parameter.default is inspect.Parameter.empty:
            raise ConfigError(
                f"config: optimizer.{key}: {name} needs a value; set it in conf/optimizer/{name}.yaml "
                f"or with optimizer.{key}=..."
            )
        if value is not None or parameter.default is inspect.Parameter.empty:
            values[key] = value
    return values


def check_optimizer(optimizer_cfg: OptimizerSection) -> None:
    """`optimizer.name` is a registered optimizer, and its builder gets every hyper-parameter it needs."""
    if optimizer_cfg.name not in OPTIMIZERS:
        raise ConfigError(
            f"config: optimizer.name: must be one of {', '.join(sorted(OPTIMIZERS))}; got "
            f'{optimizer_cfg.name!r} (a new optimizer: a module in optimizers/ with @register("name") '
            "and conf/optimizer/<name>.yaml)"
        )
    # every other optimizer's key at once: a recipe's (recipe=speedrun-micro optimizer=adamw) were refused one by one
    foreign = {
        key: readers
        for key, readers in OWN_KEYS.items()
        if getattr(optimizer_cfg, key, None) is not None and optimizer_cfg.name not in readers
    }
    if foreign:
        (key, readers), *more = foreign.items()
        owners = sorted({r for rs in foreign.values() for r in rs})
        also = f", nor {', '.join(f'optimizer.{k}' for k, _ in more)}" if more else ""
        nulls = " ".join(f"optimizer.{k}=null" for k in foreign)
        raise ConfigError(
            f"config: optimizer.{key}: {optimizer_cfg.name} does not take it{also} (they are {' and '.join(owners)}'s, "
            f"set by a preset or recipe, or on the command line); leave them null: {nulls}"
            if more
            else f"config: optimizer.{key}: {optimizer_cfg.name} does not take it (it is {' and '.join(readers)}'s); "
            f"leave it null"
        )
    check_shared_keys_read(optimizer_cfg)
    check_bounds(optimizer_cfg)
    check_own_step_size(optimizer_cfg)
    if (
        optimizer_cfg.weight_decay > 0
        and optimizer_cfg.weight_decay_mode == "native"
        and "weight_decay" not in hyper_parameters(OPTIMIZERS[optimizer_cfg.name])
    ):
        raise ConfigError(
            f"config: optimizer.weight_decay: {optimizer_cfg.name} has no decay of its own "
            "(optimizer.weight_decay_mode=native); set weight_decay_mode=decoupled or l2, or weight_decay=0"
        )


def check_shared_keys_read(optimizer_cfg: OptimizerSection) -> None:
    """A key the schema shares between optimizers (beta1, momentum, nesterov, ...) set away from its default, where
    the chosen optimizer does not read it: refused, as another optimizer's own key is, instead of ignored. (Weight
    decay reaches every optimizer: weight_decay_mode.)"""
    builder = hyper_parameters(OPTIMIZERS[optimizer_cfg.name])
    shared = {k for b in OPTIMIZERS.values() for k in hyper_parameters(b)} - set(OWN_KEYS) - {"weight_decay"}
    for f in dataclasses.fields(optimizer_cfg):
        if f.name in shared and f.name not in builder and getattr(optimizer_cfg, f.name) != f.default:
            readers = [n for n, b in OPTIMIZERS.items() if f.name in hyper_parameters(b)]
            raise ConfigError(
                f"config: optimizer.{f.name}: {optimizer_cfg.name} does not read it ({', '.join(readers)} do); "
                f"leave it at {f.default}"
            )


def check_bounds(optimizer_cfg: OptimizerSection, at: str = "optimizer") -> None:
    """The builder gets every hyper-parameter it needs, each in its registered range (`at`: where the section is,
    `optimizer` or a group's place)."""
    values = hyper_parameter_values(optimizer_cfg)
    for key, rule in BOUNDS.get(optimizer_cfg.name, {}).items():
        test, want = RULES[rule]
        if key in values and isinstance(values[key], (int, float)) and not test(values[key]):
            raise ConfigError(f"config: {at}.{key}: {optimizer_cfg.name} needs it {want}; got {values[key]}")


def check_own_step_size(optimizer_cfg: OptimizerSection) -> None:
    """What would move a step outside a method that sets or estimates its own step size: decay scaled by the run's lr
    (which is not the method's step size), parameter groups (which give parts of the model another one), and, for a
    schedule-free method, anything that changes its step after it (its evaluation weights are rebuilt from its own
    steps, so they would no longer be an average of where it went)."""
    name = optimizer_cfg.name
    if LR_USE.get(name, "schedule") == "schedule":
        return
    own = "estimates its own step size" if LR_USE[name] == "estimate" else "sets its own step size"
    lr = optimizer_cfg.lr_config
    if LR_USE[name] == "own" and (lr.name != "constant" or lr.lr != 1.0 or lr.warmup != 0):
        key = f"optimizer.lr_config{'' if lr.name != 'constant' else '.lr' if lr.lr != 1.0 else '.warmup'}"
        raise ConfigError(
            f"config: {key}: {name} {own} (optimizer.{STEP_SIZE.get(name, '<its own key>')}); the run's "
            "schedule, its warm-up too, does not reach it: leave optimizer/lr_config=constant at lr 1, warmup 0"
        )
    if optimizer_cfg.weight_decay_mode == "decoupled" and optimizer_cfg.weight_decay > 0:
        raise ConfigError(
            f"config: optimizer.weight_decay_mode: decoupled decay is scaled by the run's lr, and {name} {own}; "
            "use native (its own decay, scaled by its step) or l2"
        )
    if optimizer_cfg.groups:
        raise ConfigError(
            f"config: optimizer.groups: {name} {own} for every parameter; groups need an optimizer.name that takes "
            "the run's lr (e.g. adamw), which a group may then replace"
        )
    if name in AVERAGED:
        for key in ("cautious", "mechanic"):
            if getattr(optimizer_cfg, key):
                raise ConfigError(
                    f"config: optimizer.{key}: it changes {name}'s steps after the method, which then evaluates "
                    "weights that are not the average of where it went; leave it false"
                )
