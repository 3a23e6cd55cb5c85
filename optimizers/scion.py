"""Scion: momentum, then each layer's linear minimisation oracle (LMO) over a norm ball of its own radius.

Pethick, Xie, Antonakopoulos, Zhu, Silveti-Falls, Cevher (2025), "Training Deep Learning Models with
Norm-Constrained LMOs", arXiv:2502.07529; the reference code is github.com/LIONS-EPFL/scion (scion.py and its
nanoGPT examples).

The rule, per tensor W with radius rho and norm ball D:
    d <- momentum * d + (1 - momentum) * g                         (d_0 = 0, no bias correction)
    W <- (1 - lr) W - lr * rho * lmo_D(d)     (Scion; unconstrained=True drops the (1 - lr) W term: uScion)
`momentum` is the usual momentum (0.9); the reference code's `momentum` is one minus it (its default 0.1).

The LMOs, as the paper's code picks them for a GPT:
- the blocks' weights (hidden layers): spectral norm, lmo = U V^T (Newton-Schulz, 5 steps, optax's scale_by_muon)
  x sqrt(d_out / d_in), per layer; q, k and v are three matrices (the reference's nanoGPTs have c_q, c_k, c_v), so
  each is orthogonalised on its own. Radius scale_hidden.
- wte, the embedding tied to the LM head: the paper's choice for a shared embedding is the output layer's norm
  (its nanoGPT "with weight sharing" puts the tied lm_head in the Sign group): lmo = sign(d) / d_in, d_in = n_embd.
  Radius scale_embed.
- wpe (an input layer fed one-hot positions; the reference's nanoGPTs have none): the paper's one-hot input norm,
  lmo = each position's row divided by its RMS (ColNorm). Radius scale_input. The value embeddings' tables (the
  speedrun's; the reference has none) are input layers too: each table's rows likewise. (A model with an untied
  head would give the head the sign LMO and its token embedding this one.)
- LayerNorm weights and all biases (vectors): the RMS-norm ball, lmo = d / RMS(d), per layer and per q/k/v slice
  (the reference's `Auto` -> BiasRMS, as in its DeiT example, which gives them the hidden radius). Radius
  scale_vector.
Constrained Scion's (1 - lr) W shrinks every tensor, as the paper's does: it is the method's norm bound (Section 3),
not the pipeline's matrices-only weight decay, so the builder takes no weight_decay. No gradient clipping is needed
(every LMO is invariant to the gradient's scale); the preset leaves it off, as the reference does.

The pipeline's lr is the paper's gamma: the step is lr x radius in each layer's norm, and lr is also the constrained
variant's shrink rate. The reference's nanoGPT run: lr 3.6e-4 with scale_hidden 50 and scale_embed 3000.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError
from core.param_labels import BLOCK_MATRICES
from optimizers.param_roles import Role, map_roles, roles_of
from optimizers.registry import register

NS_STEPS = 5  # the reference's Newton-Schulz steps, with the coefficients optax uses too (3.4445, -4.7750, 2.0315)
RMS_EPS = 1e-8  # the reference's eps in d / (RMS(d) + eps)


def orthogonalise(d: jax.Array, dims: optax.contrib.MuonDimensionNumbers) -> jax.Array:
    """U V^T of each matrix of `d` (Newton-Schulz). optax's scale_by_muon with no momentum is exactly its
    orthogonalisation: its state (a zero momentum) is made and dropped here, never kept."""
    ns = optax.contrib.scale_by_muon(ns_steps=NS_STEPS, beta=0.0, nesterov=False, weight_dimension_numbers=dims)
    out, _ = ns.update(d, ns.init(d))
    return out


def rms_normalise(d: jax.Array) -> jax.Array:
    """d / (RMS(d) + eps) along the last axis: per vector (per layer, per q/k/v slice; per row of wpe)."""
    return d / (jnp.sqrt(jnp.mean(jnp.square(d), axis=-1, keepdims=True)) + RMS_EPS)


def lmo_of(
    role: Role,
    tied: bool,
    d_model: int,
    scale_hidden: float,
    scale_embed: float,
    scale_input: float,
    scale_vector: float,
) -> Callable[[jax.Array], jax.Array]:
    """radius x lmo(d) for a tensor of this role (the step subtracts it, as the reference's does)."""
    if role.label in BLOCK_MATRICES:
        # [L, in, *out]: the input axis is reduced; qkv's [3, D] output is three matrices (its 3 is a batch axis).
        out_axis = role.in_axis + 2 if role.label == "attn_qkv" else None

        def hidden(d):
            out = (out_axis,) if out_axis is not None else tuple(range(role.in_axis + 1, d.ndim))
            dims = optax.contrib.MuonDimensionNumbers(reduction_axis=role.in_axis, output_axis=out)
            fan_out = math.prod(d.shape[a] for a in out)
            return scale_hidden * math.sqrt(fan_out / d.shape[role.in_axis]) * orthogonalise(d, dims)

        return hidden
    if role.label == "head" or (role.label == "token_embedding" and tied):
        # The output layer's norm (RMS -> l_inf): sign / d_in, the head's input being the model's width.
        return lambda d: scale_embed * jnp.sign(d) / d_model
    if role.label in ("token_embedding", "position", "value_embedding"):  # input layers fed one-hot: rows by RMS
        return lambda d: scale_input * rms_normalise(d)
    return lambda d: scale_vector * rms_normalise(d)  # norm, bias


def scale_by_scion_lmo(
    roles: dict[str, Role],
    d_model: int,
    scale_hidden: float,
    scale_embed: float,
    scale_input: float,
    scale_vector: float,
) -> optax.GradientTransformation:
    """Stateless: each tensor's radius x lmo of its (momentum-averaged) gradient."""
    tied = not any(role.label == "head" for role in roles.values())  # no head of its own: the embedding is the head

    def update(updates, state, params=None):
        del params
        return map_roles(
            lambda role, d: lmo_of(role, tied, d_model, scale_hidden, scale_embed, scale_input, scale_vector)(d).astype(
                d.dtype
            ),
            roles,
            updates,
        ), state

    return optax.GradientTransformation(optax.init_empty_state, update)


@register("scion", width_rule="by a spectral-norm LMO scaled by sqrt(d_out / d_in)")
def scion(
    model,
    *,
    momentum: float,
    scale_hidden: float,
    scale_embed: float,
    scale_input: float,
    scale_vector: float,
    unconstrained: bool,
) -> optax.GradientTransformation:
    radii = dict(scale_hidden=scale_hidden, scale_embed=scale_embed, scale_input=scale_input, scale_vector=scale_vector)
    for key, radius in radii.items():
        if radius < 0:
            raise ConfigError(f"config: optimizer.{key}: a radius, must be >= 0; got {radius}")
    return optax.chain(
        optax.ema(momentum, debias=False),
        scale_by_scion_lmo(roles_of(model), model.cfg.n_embd, scale_hidden, scale_embed, scale_input, scale_vector),
        optax.identity() if unconstrained else optax.add_decayed_weights(1.0),
        optax.scale(-1.0),
    )
