"""NAdamW: Adam with Nesterov momentum (Dozat, 2016) and decoupled weight decay on the matrices (Loshchilov & Hutter,
2019), as optax.nadamw. The pipeline's lr is Adam's step size; the decay is lr x weight_decay x the matrix.
`nesterov=false` gives plain AdamW."""

from __future__ import annotations

import optax

from optimizers.decay import fixed
from optimizers.registry import register


@register("nadamw")
def nadamw(
    model, *, beta1: float, beta2: float, eps: float, weight_decay: float, nesterov: bool
) -> optax.GradientTransformation:
    return optax.nadamw(
        1.0, beta1, beta2, eps, weight_decay=weight_decay, mask=fixed(model.weight_decay_mask()), nesterov=nesterov
    )
