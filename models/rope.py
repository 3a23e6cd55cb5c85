"""Rotary position embeddings (`model.position=rope`; Su et al. 2021, "RoFormer", arXiv:2104.09864), in the layout
Llama and GPT-NeoX use: dimension i of a head's first half and dimension i of its second half form a pair, rotated by
the angle position x theta^(-2i / H) (H the head size, theta `model.rope_theta`).

Queries and keys are rotated by their own positions, so a query at m and a key at n score by m - n alone: shifting
every position leaves attention unchanged, and with document masking each document's positions restart at 0
(models/gpt.py `segment_positions`). There are no parameters. Angles and the rotation are computed in float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# YaRN's ramp (the speedrun's alpha and beta): a pair that turns at most YARN_SLOW times over the old window is
# interpolated (its speed scaled by old / new), one that turns YARN_FAST times or more keeps its speed
YARN_SLOW, YARN_FAST = 1.0, 32.0


def rotary_angles(
    positions: jax.Array,
    head_dim: int,
    theta: float,
    frequencies: str = "standard",
    windows: tuple[int, ...] = (),
) -> tuple[jax.Array, jax.Array]:
    """cos and sin of every pair's angle, [T, 1, H/2] for positions [T] or [B, T, 1, H/2] for [B, T] (the 1
    broadcasts over heads). `frequencies` (`model.rope_frequencies`): `standard`, pair i at theta^(-2i / H), as
    transformers; `half_truncated`, the modded-nanogpt speedrun's: the first H/4 pairs at (1/theta)^linspace(0, 1,
    H/4) (its own end points: 1 and 1/theta), the other H/4 at 0 (not turned: they carry no position). `windows`:
    the attention windows the frequencies were stretched through by YaRN, oldest first, the current one last
    (`yarn_frequencies`); () = none."""
    if frequencies == "half_truncated":
        quarter = head_dim // 4
        turned = (1.0 / theta) ** jnp.linspace(0.0, 1.0, quarter, dtype=jnp.float32)
        inv_freq_h = jnp.concatenate([turned, jnp.zeros(head_dim // 2 - quarter, jnp.float32)])
    else:
        inv_freq_h = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))  # as transformers
    inv_freq_h = yarn_frequencies(inv_freq_h, windows)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq_h
    return jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]


def apply_rotary(x_BTNH: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x's heads rotated pair by pair: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), x1 and x2 its halves."""
    x = x_BTNH.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BTNH.dtype)


def yarn_frequencies(inv_freq_h: jax.Array, windows: tuple[int, ...]) -> jax.Array:
    """The pairs' speeds (radians per position) after YaRN's rescaling at each growth of the attention window
    (Peng et al. 2023, arXiv:2309.00071, "NTK-by-parts", in the modded-nanogpt speedrun's form), `windows` oldest
    first: at a growth from `old` to `new` a pair that turns r = old x speed / 2 pi times over the old window is
    scaled by s + w (1 - s), s = old / new, w = clip((r - 1) / (32 - 1), 0, 1). Each growth starts from the speeds
    the last one left. An unchanged window changes nothing."""
    for old, new in zip(windows, windows[1:]):
        rotations = old * inv_freq_h / (2 * math.pi)
        kept = jnp.clip((rotations - YARN_SLOW) / (YARN_FAST - YARN_SLOW), 0.0, 1.0)
        inv_freq_h = inv_freq_h * (old / new + kept * (1 - old / new))
    return inv_freq_h


def yarn_score_factor(windows: tuple[int, ...]) -> float:
    """What YaRN multiplies the attention scores by after the growths of `windows` (oldest first): 1 + 0.2 ln(new /
    old) per growth, the speedrun's (a longer window spreads attention thinner; the scores sharpen to match)."""
    return math.prod(1.0 + 0.2 * math.log(new / old) for old, new in zip(windows, windows[1:]))
