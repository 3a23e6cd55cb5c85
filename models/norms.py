"""The normalisations behind `model.norm`: GPT-2's LayerNorm and Llama's RMSNorm, both over the last axis and
computed in float32 whatever the input dtype. Each has an optional learned per-channel weight (`model.norm_weight`;
the modded-nanogpt speedrun's RMSNorm has none); only LayerNorm has a bias (`model.bias`)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

EPS = 1e-5  # GPT-2's LayerNorm epsilon, and Llama 2's RMSNorm epsilon (config.json's rms_norm_eps)


class LayerNorm(eqx.Module):
    """(x - mean) / std, times a weight and plus a bias when they exist."""

    weight: jax.Array | None
    bias: jax.Array | None
    eps: float = eqx.field(static=True, default=EPS)

    @staticmethod
    def init(d: int, bias: bool, weight: bool = True) -> LayerNorm:
        return LayerNorm(
            jnp.ones((d,), jnp.float32) if weight else None, jnp.zeros((d,), jnp.float32) if bias else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight.astype(jnp.float32)
        if self.bias is not None:
            y = y + self.bias.astype(jnp.float32)
        return y.astype(x.dtype)


class RMSNorm(eqx.Module):
    """x / sqrt(mean(x^2) + eps), times a weight when it exists (Zhang & Sennrich 2019; Llama's LlamaRMSNorm)."""

    weight: jax.Array | None
    eps: float = eqx.field(static=True, default=EPS)

    @staticmethod
    def init(d: int, weight: bool = True) -> RMSNorm:
        return RMSNorm(jnp.ones((d,), jnp.float32) if weight else None)

    @property
    def bias(self) -> None:
        """RMSNorm has no bias (a uniform interface with LayerNorm for the model's parameter labels)."""
        return None

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.astype(jnp.float32)
        return y.astype(x.dtype)


def init_norm(kind: str, d: int, bias: bool, weight: bool) -> LayerNorm | RMSNorm:
    """A `kind` (layernorm | rmsnorm) norm over `d` channels."""
    if kind == "rmsnorm":
        return RMSNorm.init(d, weight)
    return LayerNorm.init(d, bias, weight)
