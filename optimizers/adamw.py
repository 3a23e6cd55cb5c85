"""AdamW: Adam with decoupled weight decay on the matrices."""

from __future__ import annotations

import optax

from optimizers.decay import fixed
from optimizers.registry import register


@register("adamw")
def adamw(model, *, beta1: float, beta2: float, eps: float, weight_decay: float) -> optax.GradientTransformation:
    return optax.adamw(1.0, beta1, beta2, eps, weight_decay=weight_decay, mask=fixed(model.weight_decay_mask()))
