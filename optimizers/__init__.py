"""Optimizers: `optimizer.name` -> an optax transformation, wrapped with clipping, a grad-norm probe, the learning rate
and accumulation.

Each optimizer is one module of this package that registers its builder (optimizers/registry.py); the package
imports every module it holds, so adding an optimizer is a file here and a YAML in conf/optimizer/, nothing else.

The full update for one optimizer step is
    MultiSteps(k = train.grad_accum_steps)(            # only when k > 1: sums the k micro-batch gradients
        only_at_last_micro_batch(                      # ... and runs the optimizer once a step, not k times
            chain(record_grad_norm, clip_by_global_norm, <optimizer with a unit lr>, scale_by_lr(schedule))))
where <optimizer> is `optimizer.name`'s, or one per parameter group (optimizers/groups.py, optax.partition);
`optimizer.cautious` masks each optimizer's direction (optimizers/wrappers.py; the decoupled decay of
weight_decay_mode=decoupled stays outside the mask), `optimizer.mechanic` wraps the direction and the
lr in Mechanic (optax.contrib.mechanize), which learns their scale.
The optimizers are built with learning rate 1, so their output is the step's direction (already negated), and the
learning rate is applied once, by `scale_by_lr`, whose state counts the updates applied and keeps the lr the last
one used: what the log reports is what was applied (a skipped, non-finite step advances neither). For every optimizer
but RMSprop with momentum this is optax's own update to the last bit of rounding (optimizers/rmsprop.py says why
that one differs). Weight decay touches matrices only (optimizers/decay.py).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from core.param_labels import BLOCK_MATRICES
from optimizers.decay import fixed
from optimizers.groups import build_grouped_direction, geometry_groups, lr_multipliers
from optimizers.protocols import OptimizedModel, OptimizerSection
from optimizers.registry import LR_USE, OPTIMIZERS, register
from optimizers.schedules import build_schedule, own_warmups_in_steps

__all__ = [
    "build_optimizer",
    "build_schedule",
    "own_warmups_in_steps",
    "geometry_groups",
    "grad_norm_of",
    "applied_lr_of",
    "continue_schedule_at",
    "lr_schedule_of",
    "lr_step_of",
    "OPTIMIZERS",
    "lr_multipliers",
    "eval_params",
    "register",
]


class GradNormState(NamedTuple):
    grad_norm: jax.Array


def record_grad_norm() -> optax.GradientTransformation:
    """Keeps the global norm of the (accumulated, unclipped) gradient in the optimizer state, for logging.

    Under MultiSteps it runs only on real updates, so after a step it holds the norm of the averaged gradient.
    """

    def init(params):
        del params
        return GradNormState(jnp.zeros([], jnp.float32))

    def update(updates, state, params=None):
        del state, params
        return updates, GradNormState(optax.global_norm(updates).astype(jnp.float32))

    return optax.GradientTransformation(init, update)


def grad_norm_of(opt_state: optax.OptState) -> jax.Array:
    return optax.tree.get(opt_state, "grad_norm")


class LrState(NamedTuple):
    lr_step: jax.Array  # updates applied so far: the schedule's step
    applied_lr: jax.Array  # the learning rate the last update applied (0 before the first)


def scale_by_lr(schedule: optax.Schedule) -> optax.GradientTransformation:
    """Multiplies the step direction by schedule(lr_step) and remembers that lr: the one place the lr is applied.

    The caller may hand that value in (`update(..., lr=...)`): the train step does, from a program of its own
    (training/step/train_step.py says why), so that its program is the same whatever the schedule."""

    def init(params):
        del params
        return LrState(jnp.zeros([], jnp.int32), jnp.zeros([], jnp.float32))

    def update(updates, state, params=None, lr=None, **extra):
        del params, extra
        lr = jnp.asarray(schedule(state.lr_step) if lr is None else lr, jnp.float32)
        updates = jax.tree.map(lambda u: lr.astype(u.dtype) * u, updates)
        return updates, LrState(state.lr_step + 1, lr)

    return optax.GradientTransformationExtraArgs(init, update)


def lr_step_of(opt_state: optax.OptState) -> jax.Array:
    return optax.tree.get(opt_state, "lr_step")


def applied_lr_of(opt_state: optax.OptState) -> jax.Array:
    return optax.tree.get(opt_state, "applied_lr")


def continue_schedule_at(opt_state: optax.OptState, lr_step: jax.Array) -> optax.OptState:
    """A (fresh) optimizer state whose schedule continues at `lr_step` instead of starting over: its moments stay
    fresh, its learning rate is the one the run had reached."""
    where = lr_step_of(opt_state).sharding
    return optax.tree.set(opt_state, lr_step=jax.device_put(jnp.asarray(lr_step, jnp.int32), where))


def eval_params(opt_state: optax.OptState, params: optax.Params) -> optax.Params:
    """The weights to evaluate, sample and export: where the optimizer is schedule-free, its average x (the gradient
    is taken at y, which is what the train state's parameters hold); else the parameters themselves."""
    is_sf = lambda x: isinstance(x, optax.contrib.ScheduleFreeState)  # noqa: E731
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=is_sf) if is_sf(s)]
    return optax.contrib.schedule_free_eval_params(found[0], params) if found else params


def lr_schedule_of(cfg: OptimizerSection, schedule: optax.Schedule) -> optax.Schedule:
    """The schedule as `optimizer.name`'s method takes it (registry.register's `lr`): the lr `scale_by_lr` applies at
    each update count."""
    if LR_USE.get(cfg.name, "schedule") == "own":
        return lambda count: jnp.ones([], jnp.float32)
    return schedule


def mup_lr_scale(model: OptimizedModel) -> list[optax.GradientTransformation]:
    """μP (models/mup.py): the hidden matrices' steps (the blocks' four) times 1/m, m the model's width multiplier;
    nothing (not even a state) under standard parametrization, or at the base width."""
    m = getattr(getattr(model, "cfg", None), "width_multiplier", 1.0)
    if m == 1.0:
        return []
    hidden = jax.tree.map(lambda label: label in BLOCK_MATRICES, model.parameter_labels())
    return [optax.masked(optax.scale(1.0 / m), fixed(hidden))]


def build_optimizer(
    cfg: OptimizerSection,
    schedule: optax.Schedule,
    model: OptimizedModel,
    grad_accum_steps: int,
    run_steps: int | None = None,
) -> optax.GradientTransformation:
    """`cfg`: the `optimizer` config section; `model`: gives the weight-decay masks and the parameters' labels;
    `run_steps`: the optimizer steps the run's schedule spans (None: unknown; a method that needs them says so)."""
    direction = build_grouped_direction(cfg, model, run_steps)
    schedule = lr_schedule_of(cfg, schedule)
    step = optax.chain(direction, *mup_lr_scale(model), scale_by_lr(schedule))
    if cfg.mechanic:  # Mechanic learns a scale s for the whole step and moves from x0 by s x its steps: it goes last
        step = optax.contrib.mechanize(step)
    inner = optax.chain(
        record_grad_norm(),
        optax.clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity(),
        step,
    )
    # MultiSteps keeps a gradient accumulator as large as the parameters: only worth it when accumulating. It sums
    # (use_grad_mean=False): each micro-batch's gradient is already its share of the step's mean over target tokens
    # (training/step/train_step.py), so the sum is the step's gradient whatever the micro-batches' token counts.
    if grad_accum_steps == 1:
        return inner
    return optax.MultiSteps(
        only_at_last_micro_batch(inner), every_k_schedule=grad_accum_steps, use_grad_mean=False
    ).gradient_transformation()


def only_at_last_micro_batch(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """`inner`, run only where its result is kept: optax.MultiSteps runs its inner optimizer at every micro-batch and
    keeps the last one's update and state, so a step did the optimizer's work k times (SOAP's rotations, Muon's
    orthogonalisation, Sophia's Hessian-vector products, every optimizer's reads and writes of its state). The caller
    says which micro-batch is the step's last (`last_micro_batch`, training/step/train_step.py); at the others the
    update is zeros and the state as it was, which MultiSteps discards. Without the argument, it runs at every one."""

    def update(updates, state, params=None, *, last_micro_batch=None, **extra):
        def run(updates, state, params):
            return inner.update(updates, state, params, **extra)

        if last_micro_batch is None:
            return run(updates, state, params)

        def skip(updates, state, params):
            shapes, _ = jax.eval_shape(run, updates, state, params)
            return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes), state

        return jax.lax.cond(last_micro_batch, run, skip, updates, state, params)

    return optax.GradientTransformationExtraArgs(inner.init, update)


# Registration by file: every module of the package (adamw.py, sgdm.py, ..., and any added one) registers its builder
# when imported.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
