"""Optimizers: `optimizer.name` -> an optax transformation, wrapped with clipping, a grad-norm probe and accumulation.

The full update for one optimizer step is
    MultiSteps(k = train.grad_accum_steps)(            # only when k > 1: averages k micro-batch gradients
        chain(record_grad_norm, clip_by_global_norm, <optimizer with its lr schedule>))
Weight decay touches matrices only (see `GPT.weight_decay_mask`). "Decoupled" decay (AdamW, Lion, Muon) is scaled by
the lr and applied beside the adaptive update; "L2" decay (adam, nadam, rmsprop, sgdm) is added to the gradient.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optimizers.schedules import build_schedule

__all__ = ["build_optimizer", "build_schedule", "grad_norm_of", "OPTIMIZERS"]


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


def _fixed(tree: Any) -> Callable[[Any], Any]:
    """Masks and labels shaped like the model are Equinox modules, which are callable: optax would call them as
    mask functions. Hand optax a function that returns the tree instead."""
    return lambda params: tree


def _l2(cfg: Any, decay_mask: Any) -> optax.GradientTransformation:
    return optax.add_decayed_weights(cfg.weight_decay, _fixed(decay_mask)) if cfg.weight_decay > 0 else optax.identity()


def _adamw(cfg, schedule, model):
    return optax.adamw(schedule, cfg.beta1, cfg.beta2, cfg.eps, weight_decay=cfg.weight_decay,
                       mask=_fixed(model.weight_decay_mask()))


def _adam(cfg, schedule, model):
    return optax.chain(_l2(cfg, model.weight_decay_mask()), optax.adam(schedule, cfg.beta1, cfg.beta2, cfg.eps))


def _nadam(cfg, schedule, model):
    return optax.chain(_l2(cfg, model.weight_decay_mask()), optax.nadam(schedule, cfg.beta1, cfg.beta2, cfg.eps))


def _sgdm(cfg, schedule, model):
    return optax.chain(_l2(cfg, model.weight_decay_mask()),
                       optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=cfg.nesterov))


def _rmsprop(cfg, schedule, model):
    return optax.chain(_l2(cfg, model.weight_decay_mask()),
                       optax.rmsprop(schedule, decay=cfg.decay, eps=cfg.eps, momentum=cfg.momentum or None))


def _lion(cfg, schedule, model):
    return optax.lion(schedule, cfg.beta1, cfg.beta2, weight_decay=cfg.weight_decay, mask=_fixed(model.weight_decay_mask()))


def _muon(cfg, schedule, model):
    """Muon on the blocks' weight matrices (stacked [layer, in, out]: axis 1 is reduced, axis 2 is the output, the
    layer axis is a batch axis); AdamW with the matrices-only decay mask on everything else."""
    is_matrix = model.block_matrices_mask()
    labels = jax.tree.map(lambda m: "muon" if m else "adamw", is_matrix)
    decay_mask = jax.tree.map(lambda d, m: d and not m, model.weight_decay_mask(), is_matrix)
    muon = optax.contrib.muon(
        schedule,
        beta=cfg.momentum,
        nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay,
        muon_weight_dimension_numbers=optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=2),
    )
    adamw = optax.adamw(lambda count: cfg.adam_lr_ratio * schedule(count), cfg.beta1, cfg.beta2, cfg.eps,
                        weight_decay=cfg.weight_decay, mask=_fixed(decay_mask))
    return optax.partition({"muon": muon, "adamw": adamw}, _fixed(labels))


OPTIMIZERS: dict[str, Callable[[Any, optax.Schedule, Any], optax.GradientTransformation]] = {
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
        OPTIMIZERS[cfg.name](cfg, schedule, model),
    )
    # MultiSteps keeps a gradient accumulator as large as the parameters: only worth it when accumulating.
    return optax.MultiSteps(inner, every_k_schedule=grad_accum_steps) if grad_accum_steps > 1 else inner
