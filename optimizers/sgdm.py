"""SGD with (optionally Nesterov) momentum; momentum 0 is plain SGD. L2 weight decay on the matrices."""

from __future__ import annotations

import optax

from optimizers.decay import l2
from optimizers.registry import register


@register("sgdm", width_rule="by the gradient itself, for which μP's rule is another (SGD's)")
def sgdm(model, *, momentum: float, nesterov: bool, weight_decay: float) -> optax.GradientTransformation:
    return optax.chain(
        l2(weight_decay, model.weight_decay_mask()), optax.sgd(1.0, momentum=momentum or None, nesterov=nesterov)
    )
