"""Mixed precision: the compute-dtype policy and float16's dynamic loss scaling.

Parameters and optimizer state stay float32. The loss function casts a copy of the parameters to `system.dtype`
(float32 | bfloat16 | float16) for the forward and backward pass; LayerNorm, the logits' log-sum-exp and the loss are
computed in float32 whatever the dtype.

float16's range is narrow: small gradients underflow to 0. Dynamic loss scaling multiplies the loss by `scale` before
differentiating and divides the gradients by it after; a step whose gradients overflow (Inf/NaN) is skipped whole and
the scale halved, and after `period` finite steps in a row the scale doubles. The same skip (without scale changes)
serves `train.skip_nonfinite` in any dtype. Written out here rather than taken from a library because it is a few
lines and it must live in TrainState to be checkpointed and resumed (optax has no loss scaling).
"""

from __future__ import annotations

from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp

from models.fp8 import Fp8Recipe
from training.config.system import SystemConfig

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
FLOAT16_INITIAL_SCALE = 2.0**15
SCALE_PERIOD = 2000  # finite steps in a row before the scale doubles
SCALE_FACTOR = 2.0
MIN_SCALE = 1.0


def compute_dtype(name: str) -> jnp.dtype:
    """`system.dtype` -> the dtype the step computes in: fp8 is bfloat16 with FP8 matmuls in the blocks."""
    return jnp.bfloat16 if name == "fp8" else COMPUTE_DTYPES[name]


def fp8_recipe(system: SystemConfig) -> Fp8Recipe | None:
    """The FP8 matmuls' delayed scaling as `system` sets it (system.dtype=fp8), else None: no FP8 state."""
    return Fp8Recipe(system.fp8_amax_history, system.fp8_margin) if system.dtype == "fp8" else None


class LossScale(eqx.Module):
    scale: jax.Array  # float32 scalar: 1 unless the compute dtype is float16
    good_steps: jax.Array  # int32: finite steps since the scale last changed
    skipped: jax.Array  # int32: steps skipped for a non-finite gradient, all run long

    @staticmethod
    def create(dtype: jnp.dtype) -> LossScale:
        scale = FLOAT16_INITIAL_SCALE if jnp.dtype(dtype) == jnp.float16 else 1.0
        return LossScale(jnp.asarray(scale, jnp.float32), jnp.zeros([], jnp.int32), jnp.zeros([], jnp.int32))

    def after_step(self, finite: jax.Array, dynamic: bool) -> LossScale:
        """The scale and counters after a step whose gradients were `finite` (or not)."""
        skipped = self.skipped + jnp.where(finite, 0, 1).astype(jnp.int32)
        if not dynamic:
            return LossScale(self.scale, self.good_steps, skipped)
        grow = finite & (self.good_steps + 1 >= SCALE_PERIOD)
        scale = jnp.where(
            finite,
            jnp.where(grow, self.scale * SCALE_FACTOR, self.scale),
            jnp.maximum(self.scale / SCALE_FACTOR, MIN_SCALE),
        )
        good_steps = jnp.where(finite & ~grow, self.good_steps + 1, 0).astype(jnp.int32)
        return LossScale(scale, good_steps, skipped)


def all_finite(tree) -> jax.Array:
    leaves = jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


Tree = TypeVar("Tree")  # a pytree of arrays (the new and old states are the same structure)


def keep_if_finite(finite: jax.Array, new: Tree, old: Tree) -> Tree:
    """The non-finite guard: after a step whose gradients were not finite, the old arrays (the whole tree)."""
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def cast_floating(tree, dtype: jnp.dtype):
    """The compute-dtype copy of the parameters (the float32 master copy stays in the state)."""
    return jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree)
