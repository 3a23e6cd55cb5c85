"""Lion (sign momentum) with decoupled weight decay on the matrices."""

from __future__ import annotations

import optax

from optimizers.decay import fixed
from optimizers.registry import register


@register("lion")
def lion(model, *, beta1: float, beta2: float, weight_decay: float) -> optax.GradientTransformation:
    return optax.lion(1.0, beta1, beta2, weight_decay=weight_decay, mask=fixed(model.weight_decay_mask()))
