"""AdEMAMix (Pagliardini, Ablin & Grangier, 2024): Adam whose numerator mixes a fast EMA of the gradients (beta1,
bias-corrected) with alpha x a slow one (beta3, not bias-corrected), as optax.contrib.ademamix, with decoupled weight
decay on the matrices. The pipeline's lr is Adam's step size.

The paper warms alpha up linearly from 0 and beta3 from beta1, linearly in the EMA's half-life, over alpha_warmup and
beta3_warmup steps (its T_alpha = T_beta3 = the run's length; the preset says so); 0 = no warmup. Their counter is
the method's own, so a resumed run continues it."""

from __future__ import annotations

import math

import jax.numpy as jnp
import optax

from optimizers.decay import fixed
from optimizers.registry import register


def alpha_schedule(alpha: float, warmup: float) -> optax.ScalarOrSchedule:
    """alpha x min(1, t / warmup) at the t-th update (t = count + 1, as the paper's reference code counts)."""
    if warmup == 0:
        return alpha
    return lambda count: alpha * jnp.minimum((count + 1) / warmup, 1.0)


def beta3_schedule(beta_start: float, beta3: float, warmup: float) -> optax.ScalarOrSchedule:
    """From beta_start to beta3 with the half-life ln(1/2) / ln(beta) linear in t (the paper's f_beta3)."""
    if warmup == 0:
        return beta3
    log_start, log_end = math.log(beta_start), math.log(beta3)

    def schedule(count):
        a = jnp.minimum((count + 1) / warmup, 1.0)
        return jnp.minimum(jnp.exp(log_start * log_end / ((1 - a) * log_end + a * log_start)), beta3)

    return schedule


@register(
    "ademamix",
    bounds={
        "beta3": "fraction",
        "alpha": "non_negative",
        "alpha_warmup": "non_negative",
        "beta3_warmup": "non_negative",
    },
)
def ademamix(
    model,
    *,
    beta1: float,
    beta2: float,
    beta3: float,
    alpha: float,
    alpha_warmup: float,
    beta3_warmup: float,
    eps: float,
    weight_decay: float,
) -> optax.GradientTransformation:
    return optax.contrib.ademamix(
        1.0,
        b1=beta1,
        b2=beta2,
        b3=beta3_schedule(beta1, beta3, beta3_warmup),
        alpha=alpha_schedule(alpha, alpha_warmup),
        eps=eps,
        weight_decay=weight_decay,
        mask=fixed(model.weight_decay_mask()),
    )
