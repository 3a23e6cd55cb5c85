"""AdamW: Adam with decoupled weight decay on the matrices, and the ablations optimizer research runs on it.

`debias=false` drops the bias correction of both moments; `precondition=false` drops the second moment (the step is
the first moment alone: momentum SGD with Adam's EMA); `beta1=0` drops momentum. With both switches on (the default)
it is optax.adamw itself.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from optimizers.decay import fixed
from optimizers.registry import register


class AdamAblationState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def scale_by_adam_ablation(
    beta1: float, beta2: float, eps: float, debias: bool, precondition: bool
) -> optax.GradientTransformation:
    """m / (sqrt(v) + eps), moments bias-corrected when `debias`; v dropped (the step is m) unless `precondition`."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return AdamAblationState(jnp.zeros([], jnp.int32), zeros, zeros)

    def update(updates, state, params=None):
        del params
        count = state.count + 1
        mu = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state.mu, updates)
        nu = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * g * g, state.nu, updates) if precondition else state.nu
        c1 = 1 - beta1 ** count.astype(jnp.float32) if debias else 1.0
        c2 = 1 - beta2 ** count.astype(jnp.float32) if debias else 1.0
        if precondition:
            step = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
        else:
            step = jax.tree.map(lambda m: m / c1, mu)
        return step, AdamAblationState(count, mu, nu)

    return optax.GradientTransformation(init, update)


@register("adamw")
def adamw(
    model,
    *,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    debias: bool = True,
    precondition: bool = True,
) -> optax.GradientTransformation:
    mask = fixed(model.weight_decay_mask())
    if debias and precondition:
        return optax.adamw(1.0, beta1, beta2, eps, weight_decay=weight_decay, mask=mask)
    return optax.chain(
        scale_by_adam_ablation(beta1, beta2, eps, debias, precondition),
        optax.add_decayed_weights(weight_decay, mask),
        optax.scale(-1.0),
    )
