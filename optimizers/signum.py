"""Signum (Bernstein, Wang, Azizzadenesheli & Anandkumar, 2018, "signSGD"): the sign of an EMA of the gradients,
m = momentum x m + (1 - momentum) x g, step -lr x (sign(m) + weight_decay x w), as optax.signum plus decoupled weight
decay on the matrices (MXNet's Signum `wd_lh`, Lion's form). Every coordinate moves by the pipeline's lr: use a lr
like Lion's, 3-10x below AdamW's."""

from __future__ import annotations

import optax

from optimizers.decay import fixed
from optimizers.registry import register


@register("signum")
def signum(model, *, momentum: float, weight_decay: float) -> optax.GradientTransformation:
    return optax.chain(
        optax.ema(momentum, debias=False),
        optax.scale_by_sign(),
        optax.add_decayed_weights(weight_decay, fixed(model.weight_decay_mask())),
        optax.scale(-1.0),
    )
