"""D-Adaptation Adam (Defazio & Mishchenko, 2023, "Learning-Rate-Free Learning by D-Adaptation", Algorithm 4): Adam
whose step size d is a growing lower bound on the distance to the solution, as the authors' reference implementation
(dadaptation's DAdaptAdam) runs it by default, with decoupled weight decay on the matrices (AdamW's, the reference's
`decouple=True`); b = sqrt(b2), c_k = sqrt(1 - b2^(k+1)) / (1 - b1^(k+1)) with bias_correction, else 1 (its default):

    dlr = d * lr * c_k,   a = sqrt(v) + eps (before this step's v)
    r <- b r + (1 - b) dlr <g, s / a>                      (summed over every tensor, with the s before this step)
    m <- b1 m + dlr (1 - b1) g,    v <- b2 v + (1 - b2) g^2,    s <- b s + dlr (1 - b) g
    d <- max(d, min(r / ((1 - b) |s|_1), d * growth_rate))
    x <- x - m / (sqrt(v) + eps) - dlr * weight_decay * x

`lr` is the run's schedule, the reference's lr (1 at its peak in the paper; registered with lr="estimate"): the
train step hands it to the update (training/step/train_step.py). The reference keeps it inside its momentum (m sums
dlr-weighted gradients, and the step is m / a), while the pipeline multiplies every direction by it once
(optimizers/__init__.py): the direction here is m / (lr a), so that the step is the reference's. Called without it
(outside the train step), the method runs at lr 1.

Written here rather than taken from optax.contrib.dadapt_adamw, which always applies Adam's bias correction (the
reference defaults it off): with it the estimate grew so slowly that the preset did not lower gpt2-tiny's loss in 12
steps (tests/test_presets.py). tests/test_optimizers_research.py checks this against the reference's rule written out
in numpy, tests/test_optimizers_optax.py the bias-corrected form against optax's."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from optimizers.param_roles import Role, map_roles, roles_of
from optimizers.registry import register
from optimizers.reporting import reads


def adapted_step(
    updates: optax.Updates,
    d: jax.Array,
    count: jax.Array,
    lr: jax.Array | float | None,
    beta1: float,
    beta2: float,
    bias_correction: bool,
) -> tuple[optax.Updates, jax.Array, jax.Array, jax.Array | float, jax.Array]:
    """What D-Adaptation's and Prodigy's updates start from: the gradient in float32, the schedule's lr (1 outside the
    train step), the estimate d, Adam's bias correction c at this count (1 without), and the step size d·lr·c."""
    lr = jnp.asarray(1.0 if lr is None else lr, jnp.float32)
    g = jax.tree.map(lambda u: u.astype(jnp.float32), updates)
    k = count.astype(jnp.float32)
    c = jnp.sqrt(1 - beta2 ** (k + 1)) / (1 - beta1 ** (k + 1)) if bias_correction else 1.0
    return g, lr, d, c, d * lr * c


class DAdaptState(NamedTuple):
    count: jax.Array  # k: updates so far
    d: jax.Array  # the step size estimate
    numerator: jax.Array  # r
    mu: optax.Updates  # m, dlr-weighted
    nu: optax.Updates  # v
    s: optax.Updates  # the dlr-weighted gradient sum


def dadapt_direction(
    beta1: float,
    beta2: float,
    eps: float,
    d0: float,
    growth_rate: float,
    weight_decay: float,
    roles: dict[str, Role],
    bias_correction: bool,
) -> optax.GradientTransformationExtraArgs:
    """The direction for a unit lr (already negated), weight decay on the tensors whose role is decayed."""
    b = math.sqrt(beta2)

    def init(params):
        def zeros():
            return optax.tree.zeros_like(params, jnp.float32)

        return DAdaptState(
            jnp.zeros([], jnp.int32),
            jnp.asarray(d0, jnp.float32),
            jnp.zeros([], jnp.float32),
            zeros(),
            zeros(),
            zeros(),
        )

    def update(updates, state, params=None, lr=None, **extra):
        del extra
        if params is None:
            raise ValueError("dadapt_adamw needs the parameters (for its weight decay)")
        g, lr, d, c, dlr = adapted_step(updates, state.d, state.count, lr, beta1, beta2, bias_correction)
        along = optax.tree.sum(jax.tree.map(lambda gi, si, v: gi * si / (jnp.sqrt(v) + eps), g, state.s, state.nu))
        numerator = b * state.numerator + (1 - b) * dlr * along
        mu = jax.tree.map(lambda m, gi: beta1 * m + dlr * (1 - beta1) * gi, state.mu, g)
        nu = jax.tree.map(lambda v, gi: beta2 * v + (1 - beta2) * gi * gi, state.nu, g)
        s = jax.tree.map(lambda si, gi: b * si + dlr * (1 - b) * gi, state.s, g)
        s_l1 = optax.tree.sum(jax.tree.map(jnp.abs, s))
        # no gradient at all (|s| = 0) or lr 0: the reference keeps its estimate
        grows = (s_l1 > 0) & (lr > 0)
        d_hat = numerator / ((1 - b) * jnp.where(s_l1 > 0, s_l1, 1.0))
        new_d = jnp.where(grows, jnp.maximum(d, jnp.minimum(d_hat, d * growth_rate)), d)
        # the reference's step is m / a + dlr * decay * x; the pipeline multiplies by lr afterwards
        safe_lr = jnp.where(lr > 0, lr, 1.0)
        direction = map_roles(
            lambda role, m, v, xi: (
                -(
                    m / (safe_lr * (jnp.sqrt(v) + eps))
                    + (weight_decay * d * c * xi.astype(jnp.float32) if role.decayed else 0.0)
                )
            ),
            roles,
            mu,
            nu,
            params,
        )
        direction = jax.tree.map(lambda u, o: u.astype(o.dtype), direction, updates)
        return direction, DAdaptState(state.count + 1, new_d, numerator, mu, nu, s)

    return optax.GradientTransformationExtraArgs(init, update)


@register("dadapt_adamw", lr="estimate", bounds={"d0": "positive", "growth_rate": "count"})
def dadapt_adamw(
    model,
    *,
    beta1: float,
    beta2: float,
    eps: float,
    d0: float,
    weight_decay: float,
    growth_rate: float = math.inf,
    bias_correction: bool = False,
) -> optax.GradientTransformation:
    """growth_rate: the most d may grow in a step (inf: unbounded; ~1.02 acts as a warmup). bias_correction: Adam's
    (off, as the reference)."""
    return dadapt_direction(beta1, beta2, eps, d0, growth_rate, weight_decay, roles_of(model), bias_correction)


@reads(DAdaptState)
def _estimate(state: DAdaptState) -> dict[str, jax.Array]:
    return {"dadapt_d": state.d}  # the lower bound d on the distance to the solution: the step size it found
