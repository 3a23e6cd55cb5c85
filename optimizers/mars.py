"""MARS-AdamW: AdamW on a variance-reduced gradient.

Yuan, Liu, Wu, Zhou, Gu (2024), "MARS: Unleashing the Power of Variance Reduction for Training Large Models",
arXiv:2411.10438; the reference code is github.com/AGI-Arena/MARS (MARS/optimizers/mars.py).

The rule (the paper's "approximate" MARS, which keeps last step's gradient instead of a second backward pass):
    c_t = g_t + gamma * beta1 / (1 - beta1) * (g_t - g_{t-1});   c_t <- c_t / ||c_t||_2 when ||c_t||_2 > 1
    m_t, v_t = Adam's moments of c_t (beta1, beta2), bias-corrected
    x <- x - lr * (m^_t / (sqrt(v^_t) + eps) + wd * x)

Choices where the paper leaves room (each as in the reference code):
- g_0 = 0: the first step's correction is gamma * beta1 / (1 - beta1) * g_1.
- ||c_t|| is each tensor's own norm, and a stacked block tensor [L, ...] is L tensors (the reference's PyTorch GPT
  has one per layer): it is clipped layer by layer (the value embeddings' [k, V, D] table by table); qkv is one
  matrix per layer (nanoGPT's c_attn).
- The correction runs on every tensor the builder gets. The reference runs it on the 2-D ones only and AdamW on the
  rest (optimize_1d=False, betas (0.9, 0.95), lr_1d = lr / 2): the preset does that with a parameter group
  (optimizer.groups.adam: the vectors to AdamW at 0.5 x the lr), as Muon's preset does; ~optimizer.groups.adam
  gives MARS every tensor (the reference's optimize_1d=True).
- Weight decay is decoupled, on the decayed matrices only (wte and the blocks' weights, optimizers/decay.py; the
  reference also decays its 1-D tensors, by 0.1).
- gamma is constant (the paper's runs use 0.025 throughout).

The pipeline's lr is the paper's eta_t (its GPT-2 small runs: 6e-3 for MARS, 3e-3 for the vectors' AdamW).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import optax

from core.errors import ConfigError
from optimizers.decay import fixed
from optimizers.param_roles import Role, map_roles, roles_of
from optimizers.registry import register


class MarsCorrectionState(NamedTuple):
    previous_grad: optax.Updates  # g_{t-1}


def scale_by_mars_correction(gamma: float, beta1: float, roles: dict[str, Role]) -> optax.GradientTransformation:
    """g_t -> c_t, clipped to norm 1 (a stack of layers layer by layer)."""
    coefficient = gamma * beta1 / (1.0 - beta1)

    def init(params):
        return MarsCorrectionState(optax.tree.zeros_like(params, jnp.float32))

    def correct(role, g, g_prev):
        c = g + coefficient * (g - g_prev)
        norm = jnp.sqrt(jnp.sum(jnp.square(c), axis=tuple(range(1, c.ndim)) if role.stacked else None, keepdims=True))
        return (c / jnp.maximum(norm, 1.0)).astype(g.dtype)  # c / ||c|| when ||c|| > 1, else c

    def update(updates, state, params=None):
        del params
        corrected = map_roles(correct, roles, updates, state.previous_grad)
        return corrected, MarsCorrectionState(optax.tree.cast(updates, jnp.float32))

    return optax.GradientTransformation(init, update)


@register("mars")
def mars(
    model, *, gamma: float, beta1: float, beta2: float, eps: float, weight_decay: float
) -> optax.GradientTransformation:
    if gamma < 0:
        raise ConfigError(f"config: optimizer.gamma: must be >= 0; got {gamma}")
    return optax.chain(
        scale_by_mars_correction(gamma, beta1, roles_of(model)),
        optax.scale_by_adam(beta1, beta2, eps),
        optax.add_decayed_weights(weight_decay, fixed(model.weight_decay_mask())),
        optax.scale(-1.0),
    )
