"""Prodigy (Mishchenko & Defazio, 2023, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner"): Adam whose step
size d is estimated on the fly, as the authors' reference implementation (prodigyopt) runs it by default:

    dlr = d * lr * c_k             c_k = sqrt(1 - b2^(k+1)) / (1 - b1^(k+1)) with bias_correction, else 1 (its default)
    r  <- b3 r + (d / d0) dlr <g, x0 - x>          (summed over every tensor)
    m  <- b1 m + d (1 - b1) g,    v <- b2 v + d^2 (1 - b2) g^2,    s <- b3 s + (d / d0) dlr g
    d_max <- max(d_max, d_coef r / |s|_1);  d <- max(d, that) on the first growth, then min(d_max, d * growth_rate)
    x  <- x - dlr (m / (sqrt(v) + d eps)) - dlr * weight_decay * x          (decay on matrices only)

`lr` is the run's schedule, the reference's lr (1 at its peak in the paper; registered with lr="estimate"): the train
step hands it to the update (training/step/train_step.py), and it enters the estimate's sums as the reference's
scheduled lr does; the step's direction here leaves it out, since the pipeline multiplies every direction by it once
(optimizers/__init__.py). Called without it (outside the train step), the method runs at lr 1.

Written here rather than taken from optax.contrib.prodigy, which always applies Adam's bias correction: the reference
defaults it off, and with it on the estimate grows far more slowly (on a toy quadratic, d after 12 steps ~250x
smaller), so that a short run barely moves. tests/test_optimizers_research.py checks this against the reference's
rule written out in numpy."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from optimizers.dadapt_adamw import adapted_step
from optimizers.param_roles import Role, map_roles, roles_of
from optimizers.registry import register
from optimizers.reporting import reads


class ProdigyState(NamedTuple):
    count: jax.Array  # k: updates so far
    d: jax.Array  # the step size estimate
    d_max: jax.Array
    numerator: jax.Array  # r: the weighted sum of <g, x0 - x>
    mu: optax.Updates  # m
    nu: optax.Updates  # v
    s: optax.Updates  # the weighted gradient sum
    x0: optax.Params  # the parameters at the start


def prodigy_direction(
    beta1: float,
    beta2: float,
    beta3: float,
    eps: float,
    d0: float,
    d_coef: float,
    growth_rate: float,
    weight_decay: float,
    roles: dict[str, Role],
    bias_correction: bool,
    safeguard_warmup: bool,
) -> optax.GradientTransformationExtraArgs:
    """The direction for a unit lr (already negated), weight decay on the tensors whose role is decayed."""
    b3 = beta3 if beta3 > 0 else math.sqrt(beta2)

    def init(params):
        def zeros():
            return optax.tree.zeros_like(params, jnp.float32)

        d = jnp.asarray(d0, jnp.float32)
        return ProdigyState(
            jnp.zeros([], jnp.int32),
            d,
            d,
            jnp.zeros([], jnp.float32),
            zeros(),
            zeros(),
            zeros(),
            jax.tree.map(lambda p: p.astype(jnp.float32), params),
        )

    def update(updates, state, params=None, lr=None, **extra):
        del extra
        if params is None:
            raise ValueError("prodigy needs the parameters (its estimate reads x0 - x)")
        g, lr, d, c, dlr = adapted_step(updates, state.d, state.count, lr, beta1, beta2, bias_correction)
        x = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        weight = (d / d0) * dlr
        travelled = optax.tree.sum(jax.tree.map(lambda gi, a, b: gi * (a - b), g, state.x0, x))  # <g, x0 - x>
        numerator = b3 * state.numerator + weight * travelled
        mu = jax.tree.map(lambda m, gi: beta1 * m + d * (1 - beta1) * gi, state.mu, g)
        nu = jax.tree.map(lambda v, gi: beta2 * v + d * d * (1 - beta2) * gi * gi, state.nu, g)
        s_weight = (d / d0) * d if safeguard_warmup else weight
        s = jax.tree.map(lambda si, gi: b3 * si + s_weight * gi, state.s, g)
        denominator = optax.tree.sum(jax.tree.map(jnp.abs, s))
        # no gradient at all (|s| = 0): the reference takes no step and keeps its estimate
        moved = (denominator > 0) & (lr > 0)
        numerator = jnp.where(moved, numerator, state.numerator)
        d_hat = d_coef * numerator / jnp.where(denominator > 0, denominator, 1.0)
        grown = jnp.where(d == d0, jnp.maximum(d, d_hat), d)
        d_max = jnp.where(moved, jnp.maximum(state.d_max, d_hat), state.d_max)
        new_d = jnp.where(moved, jnp.minimum(d_max, grown * growth_rate), d)
        step = d * c  # dlr without the lr, which the pipeline applies
        direction = map_roles(
            lambda role, m, v, xi: (
                -step * (m / (jnp.sqrt(v) + new_d * eps) + (weight_decay * xi if role.decayed else 0.0))
            ),
            roles,
            mu,
            nu,
            x,
        )
        direction = jax.tree.map(lambda u, o: jnp.where(moved, u, 0.0).astype(o.dtype), direction, updates)
        return direction, ProdigyState(
            state.count + moved.astype(jnp.int32), new_d, d_max, numerator, mu, nu, s, state.x0
        )

    return optax.GradientTransformationExtraArgs(init, update)


@register(
    "prodigy",
    lr="estimate",
    bounds={"d0": "positive", "d_coef": "positive", "beta3": "fraction", "growth_rate": "count"},
)
def prodigy(
    model,
    *,
    beta1: float,
    beta2: float,
    beta3: float = 0.0,
    eps: float,
    d0: float,
    d_coef: float,
    safeguard_warmup: bool,
    weight_decay: float,
    growth_rate: float = math.inf,
    bias_correction: bool = False,
) -> optax.GradientTransformation:
    """beta3: the decay of the estimate's sums; 0 (the default) = sqrt(beta2), the paper's. safeguard_warmup: leave
    the lr out of the gradient sum s (the reference's remedy for estimates that overshoot during a warmup).
    growth_rate: the most d may grow in a step (inf: unbounded). bias_correction: Adam's (off, as the reference)."""
    return prodigy_direction(
        beta1,
        beta2,
        beta3,
        eps,
        d0,
        d_coef,
        growth_rate,
        weight_decay,
        roles_of(model),
        bias_correction,
        safeguard_warmup,
    )


@reads(ProdigyState)
def _estimate(state: ProdigyState) -> dict[str, jax.Array]:
    return {"prodigy_d": state.d}  # the distance estimate d: the step size it found
