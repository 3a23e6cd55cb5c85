"""Optimizers: `optimizer.name` -> an optax transformation, wrapped with clipping, a grad-norm probe, the learning rate
and accumulation.

The full update for one optimizer step is
    MultiSteps(k = train.grad_accum_steps)(            # only when k > 1: sums the k micro-batch gradients
        chain(record_grad_norm, clip_by_global_norm, <optimizer with a unit lr>, scale_by_lr(schedule)))
The optimizers are built with learning rate 1, so their output is the step's direction (already negated), and the
learning rate is applied once, by `scale_by_lr`, whose state counts the updates applied and keeps the lr the last
one used: what the log reports is what was applied (a skipped, non-finite step advances neither). For every optimizer
but RMSprop with momentum this is optax's own update to the last bit of rounding; RMSprop's momentum then accumulates
unscaled steps and the lr multiplies its output, as in PyTorch (optax scales inside the momentum; the two agree while
the lr is constant).
Weight decay touches matrices only (see `GPT.weight_decay_mask`). "Decoupled" decay (AdamW, Lion, Muon) is scaled by
the lr and applied beside the adaptive update; "L2" decay (adam, nadam, rmsprop, sgdm) is added to the gradient.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optimizers.schedules import build_schedule

__all__ = ["build_optimizer", "build_schedule", "grad_norm_of", "applied_lr_of", "continue_schedule_at", "OPTIMIZERS"]


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


def grad_norm_of(opt_state: Any) -> jax.Array:
    return optax.tree.get(opt_state, "grad_norm")


class LrState(NamedTuple):
    lr_step: jax.Array  # updates applied so far: the schedule's step
    applied_lr: jax.Array  # the learning rate the last update applied (0 before the first)


def scale_by_lr(schedule: optax.Schedule) -> optax.GradientTransformation:
    """Multiplies the step direction by schedule(lr_step) and remembers that lr: the one place the lr is applied."""

    def init(params):
        del params
        return LrState(jnp.zeros([], jnp.int32), jnp.zeros([], jnp.float32))

    def update(updates, state, params=None):
        del params
        lr = jnp.asarray(schedule(state.lr_step), jnp.float32)
        updates = jax.tree.map(lambda u: lr.astype(u.dtype) * u, updates)
        return updates, LrState(state.lr_step + 1, lr)

    return optax.GradientTransformation(init, update)


def applied_lr_of(opt_state: Any) -> jax.Array:
    return optax.tree.get(opt_state, "applied_lr")


def continue_schedule_at(opt_state: Any, lr_step: jax.Array) -> Any:
    """A (fresh) optimizer state whose schedule continues at `lr_step` instead of starting over: its moments stay
    fresh, its learning rate is the one the run had reached."""
    where = optax.tree.get(opt_state, "lr_step").sharding
    return optax.tree.set(opt_state, lr_step=jax.device_put(jnp.asarray(lr_step, jnp.int32), where))


def _fixed(tree: Any) -> Callable[[Any], Any]:
    """Masks and labels shaped like the model are Equinox modules, which are callable: optax would call them as
    mask functions. Hand optax a function that returns the tree instead."""
    return lambda params: tree


def _l2(cfg: Any, decay_mask: Any) -> optax.GradientTransformation:
    return optax.add_decayed_weights(cfg.weight_decay, _fixed(decay_mask)) if cfg.weight_decay > 0 else optax.identity()


def _adamw(cfg, model):
    return optax.adamw(1.0, cfg.beta1, cfg.beta2, cfg.eps, weight_decay=cfg.weight_decay,
                       mask=_fixed(model.weight_decay_mask()))


def _adam(cfg, model):
    return optax.chain(_l2(cfg, model.weight_decay_mask()), optax.adam(1.0, cfg.beta1, cfg.beta2, cfg.eps))


def _nadam(cfg, model):
    return optax.chain(_l2(cfg, model.weight_decay_mask()), optax.nadam(1.0, cfg.beta1, cfg.beta2, cfg.eps))


def _sgdm(cfg, model):
    return optax.chain(_l2(cfg, model.weight_decay_mask()),
                       optax.sgd(1.0, momentum=cfg.momentum or None, nesterov=cfg.nesterov))


def _rmsprop(cfg, model):
    return optax.chain(_l2(cfg, model.weight_decay_mask()),
                       optax.rmsprop(1.0, decay=cfg.decay, eps=cfg.eps, momentum=cfg.momentum or None))


def _lion(cfg, model):
    return optax.lion(1.0, cfg.beta1, cfg.beta2, weight_decay=cfg.weight_decay, mask=_fixed(model.weight_decay_mask()))


def _muon(cfg, model):
    """Muon on the blocks' weight matrices (stacked [layer, in, *out]: axis 1 is reduced, the rest are the output, the
    layer axis is a batch axis); AdamW with the matrices-only decay mask on everything else."""
    is_matrix = model.block_matrices_mask()
    labels = jax.tree.map(lambda m: "muon" if m else "adamw", is_matrix)
    decay_mask = jax.tree.map(lambda d, m: d and not m, model.weight_decay_mask(), is_matrix)
    muon = optax.contrib.muon(
        1.0,
        beta=cfg.momentum,
        nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay,
        muon_weight_dimension_numbers=lambda params: jax.tree.map(
            lambda w: optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=tuple(range(2, w.ndim))),
            params),
    )
    adamw = optax.adamw(cfg.adam_lr_ratio, cfg.beta1, cfg.beta2, cfg.eps, weight_decay=cfg.weight_decay,
                        mask=_fixed(decay_mask))
    return optax.partition({"muon": muon, "adamw": adamw}, _fixed(labels))


OPTIMIZERS: dict[str, Callable[[Any, Any], optax.GradientTransformation]] = {  # (optimizer config, model)
    "adamw": _adamw,
    "adam": _adam,
    "sgdm": _sgdm,
    "nadam": _nadam,
    "rmsprop": _rmsprop,
    "lion": _lion,
    "muon": _muon,
}


def build_optimizer(cfg: Any, schedule: optax.Schedule, model: Any, grad_accum_steps: int) -> optax.GradientTransformation:
    """`cfg`: the `optimizer` config section; `model`: gives the weight-decay and Muon masks."""
    inner = optax.chain(
        record_grad_norm(),
        optax.clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity(),
        OPTIMIZERS[cfg.name](cfg, model),
        scale_by_lr(schedule),
    )
    # MultiSteps keeps a gradient accumulator as large as the parameters: only worth it when accumulating. It sums
    # (use_grad_mean=False): each micro-batch's gradient is already its share of the step's mean over target tokens
    # (training/step.py), so the sum is the step's gradient whatever the micro-batches' token counts.
    if grad_accum_steps == 1:
        return inner
    return optax.MultiSteps(inner, every_k_schedule=grad_accum_steps, use_grad_mean=False).gradient_transformation()
