"""The compiled evaluation step: `eval_step(model, batch)` returns the batch's summed loss, its target tokens and
their bytes of text, so that splits of any size average exactly (training/evaluation/splits.py) and report nats per
byte beside perplexity."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp

from training.step.losses import Batch, token_losses

if TYPE_CHECKING:
    from models.gpt import GPT


@functools.cache
def make_eval_step(dtype: jnp.dtype) -> Callable[[GPT, Batch], tuple[jax.Array, jax.Array, jax.Array]]:
    """(summed loss, target tokens, target bytes) of one batch; the batch also carries `target_bytes`. One function
    per dtype in a process: a pipeline built again (an in-process sweep's jobs, the tests) evaluates a model of the
    same structure and shapes with the program traced before."""

    def eval_step(model: GPT, batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
        total, count = token_losses(model, batch, None, dtype)
        return total, count, jnp.sum(batch["target_bytes"])

    return eqx.filter_jit(eval_step)
