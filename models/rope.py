"""Rotary position embeddings (`model.position=rope`; Su et al. 2021, "RoFormer", arXiv:2104.09864), in the layout
Llama and GPT-NeoX use: dimension i of a head's first half and dimension i of its second half form a pair, rotated by
the angle position x theta^(-2i / H) (H the head size, theta `model.rope_theta`).

Queries and keys are rotated by their own positions, so a query at m and a key at n score by m - n alone: shifting
every position leaves attention unchanged, and with document masking each document's positions restart at 0
(models/gpt.py `segment_positions`). There are no parameters. Angles and the rotation are computed in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rotary_angles(
    positions: jax.Array, head_dim: int, theta: float, frequencies: str = "standard"
) -> tuple[jax.Array, jax.Array]:
    """cos and sin of every pair's angle, [T, 1, H/2] for positions [T] or [B, T, 1, H/2] for [B, T] (the 1
    broadcasts over heads). `frequencies` (`model.rope_frequencies`): `standard`, pair i at theta^(-2i / H), as
    transformers; `half_truncated`, the modded-nanogpt speedrun's: the first H/4 pairs at (1/theta)^linspace(0, 1,
    H/4) (its own end points: 1 and 1/theta), the other H/4 at 0 (not turned: they carry no position)."""
    if frequencies == "half_truncated":
        quarter = head_dim // 4
        turned = (1.0 / theta) ** jnp.linspace(0.0, 1.0, quarter, dtype=jnp.float32)
        inv_freq_h = jnp.concatenate([turned, jnp.zeros(head_dim // 2 - quarter, jnp.float32)])
    else:
        inv_freq_h = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))  # as transformers
    angles = positions.astype(jnp.float32)[..., None] * inv_freq_h
    return jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]


def apply_rotary(x_BTNH: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x's heads rotated pair by pair: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), x1 and x2 its halves."""
    x = x_BTNH.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BTNH.dtype)
