"""The loss: cross-entropy over a batch's target tokens, summed in float32 whatever the compute dtype.

A batch holds `inputs`, `targets` and `loss_mask` (and `segment_ids` for packed documents): the mask is 0 for
padding and, in fine-tuning, for the prompt before <GENAI>, so every target token counts once and nothing else does.
The sums (not means) are what the steps combine: a step divides by its target-token count, evaluation by a split's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

from training.step.precision import cast_floating

if TYPE_CHECKING:
    from models.gpt import GPT

Batch = dict[str, jax.Array]


class LossSums(NamedTuple):
    """Sums over a batch's target tokens (float32): cross-entropy, log(Z)^2 (z-loss), and how many there are."""

    nll: jax.Array
    log_z_squared: jax.Array
    tokens: jax.Array


def loss_sums(
    model: GPT, batch: Batch, key: jax.Array | None, dtype: jnp.dtype, fp8_scales: jax.Array | None = None
) -> LossSums:
    """Cross-entropy from log(Z) - the target's logit, in float32 whatever the compute dtype. `fp8_scales`: the
    blocks' matmuls in FP8 at these scales (models/fp8.py)."""
    log_z_BT, target_logit_BT = cast_floating(model, dtype).loss_terms(
        batch["inputs"], batch["targets"], key=key, segment_ids_BT=batch.get("segment_ids"), fp8_scales=fp8_scales
    )
    mask_BT = batch["loss_mask"]
    return LossSums(
        jnp.sum((log_z_BT - target_logit_BT) * mask_BT), jnp.sum(jnp.square(log_z_BT) * mask_BT), jnp.sum(mask_BT)
    )


def token_losses(model: GPT, batch: Batch, key: jax.Array | None, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """Summed cross-entropy over the target tokens (float32) and how many there are."""
    sums = loss_sums(model, batch, key, dtype)
    return sums.nll, sums.tokens


def mean_loss(model: GPT, batch: Batch, key: jax.Array | None, dtype: jnp.dtype) -> jax.Array:
    """The masked mean token cross-entropy of one batch (what curvature and the coordinate check differentiate)."""
    total, count = token_losses(model, batch, key, dtype)
    return total / jnp.maximum(count, 1.0)
