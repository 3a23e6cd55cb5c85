"""Weight decay as the optimizers apply it: to matrices only (`GPT.weight_decay_mask`), either decoupled (scaled by the
lr, beside the adaptive update: AdamW, Lion, Muon) or as L2, added to the gradient (adam, nadam, rmsprop, sgdm)."""

from __future__ import annotations

from collections.abc import Callable

import chex
import optax


def fixed(tree: chex.ArrayTree) -> Callable[[optax.Params], chex.ArrayTree]:
    """Masks and labels shaped like the model are Equinox modules, which are callable: optax would call them as
    mask functions. Hand optax a function that returns the tree instead."""
    return lambda params: tree


def l2(weight_decay: float, decay_mask: chex.ArrayTree) -> optax.GradientTransformation:
    """weight_decay x the masked parameters added to the gradient (nothing when it is 0)."""
    return optax.add_decayed_weights(weight_decay, fixed(decay_mask)) if weight_decay > 0 else optax.identity()


def with_decay_mode(
    mode: str,
    weight_decay: float,
    decay_mask: chex.ArrayTree,
    build: Callable[[float], optax.GradientTransformation],
    wrap: Callable[[optax.GradientTransformation], optax.GradientTransformation] = lambda t: t,
) -> optax.GradientTransformation:
    """`optimizer.weight_decay_mode`: `native` keeps the optimizer's own decay (`build(weight_decay)`); `l2` adds
    weight_decay x w to the gradient before the optimizer; `decoupled` subtracts it beside the optimizer's direction
    (then scaled by the lr, as AdamW's). The two set the optimizer's own decay to 0 (`build(0)`). `wrap` (cautious)
    modifies the optimizer's direction: with its own decay or L2 in it, and without the decoupled decay, which is
    added after it unchanged (Cautious's paper masks the update, not the decay)."""
    if mode == "native" or weight_decay == 0:
        return wrap(build(weight_decay))
    decay = optax.add_decayed_weights(weight_decay if mode == "l2" else -weight_decay, fixed(decay_mask))
    return wrap(optax.chain(decay, build(0.0))) if mode == "l2" else optax.chain(wrap(build(0.0)), decay)
