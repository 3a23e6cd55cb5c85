"""Adam, with L2 weight decay on the matrices added to the gradient."""

from __future__ import annotations

import optax

from optimizers.decay import l2
from optimizers.registry import register


@register("adam")
def adam(model, *, beta1: float, beta2: float, eps: float, weight_decay: float) -> optax.GradientTransformation:
    return optax.chain(l2(weight_decay, model.weight_decay_mask()), optax.adam(1.0, beta1, beta2, eps))
