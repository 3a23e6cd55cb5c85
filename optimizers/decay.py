"""Weight decay as the optimizers apply it: to matrices only (`GPT.weight_decay_mask`), either decoupled (scaled by the
lr, beside the adaptive update: AdamW, Lion, Muon) or as L2, added to the gradient (adam, nadam, rmsprop, sgdm)."""

from __future__ import annotations

from typing import Any, Callable

import optax


def fixed(tree: Any) -> Callable[[Any], Any]:
    """Masks and labels shaped like the model are Equinox modules, which are callable: optax would call them as
    mask functions. Hand optax a function that returns the tree instead."""
    return lambda params: tree


def l2(weight_decay: float, decay_mask: Any) -> optax.GradientTransformation:
    """weight_decay x the masked parameters added to the gradient (nothing when it is 0)."""
    return optax.add_decayed_weights(weight_decay, fixed(decay_mask)) if weight_decay > 0 else optax.identity()
