"""The MLP's nonlinearity (`model.mlp`) and hidden width (`model.mlp_hidden`).

  gelu    GPT-2: GELU (tanh approximation) of x W_in; hidden width 4 x n_embd.
  relu2   ReLU(x W_in)^2 (So et al. 2021, "Primer"; the modded-nanogpt speedrun); 4 x n_embd.
  swiglu  SiLU(x W_gate) * (x W_up) (Shazeer 2020, "GLU Variants Improve Transformer"; Llama); 8/3 x n_embd rounded up
          to a multiple of 64, which keeps the parameters of a 4x MLP (three matrices instead of two).

SwiGLU's gate and up matrices are one weight [D, F, 2] (`Block.fc`): one matmul, and each hidden unit's gate and up
columns sit side by side, so the Megatron split of F over the mesh's `model` axis (the same axis as GELU's [D, F])
keeps every pair on one device, and FP8 takes it as the one matmul it is.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

SWIGLU_MULTIPLE = 64  # SwiGLU's default width is rounded up to this (friendly matmul shapes, divisible splits)


def mlp_hidden_width(kind: str, n_embd: int, requested: int | None) -> int:
    """F: `requested` if set, else the MLP's default for this width."""
    if requested:
        return requested
    if kind == "swiglu":
        return math.ceil(8 * n_embd / 3 / SWIGLU_MULTIPLE) * SWIGLU_MULTIPLE
    return 4 * n_embd


def mlp_in_shape(kind: str, width: int) -> int | tuple[int, int]:
    """The output shape of the MLP's input matrix: F, or [F, 2] (gate, up) for SwiGLU."""
    return (width, 2) if kind == "swiglu" else width


def mlp_activation(kind: str, h: jax.Array) -> jax.Array:
    """[..., F] hidden activations from the input matrix's output ([..., F] or SwiGLU's [..., F, 2])."""
    if kind == "swiglu":
        return jax.nn.silu(h[..., 0]) * h[..., 1]
    if kind == "relu2":
        return jnp.square(jax.nn.relu(h))
    return jax.nn.gelu(h, approximate=True)  # GPT-2's tanh GELU
