"""The loss and the two compiled steps.

`train_step(state, batch) -> (state, metrics)` is pure: it reads nothing but its arguments, and the state's buffers
are donated. A batch holds [grad_accum, batch, time] arrays; the step scans over the micro-batches, feeding each
gradient to the optimizer (optax.MultiSteps averages them and updates on the last). With float16 compute the loss is
scaled (training/precision.py); with float16 or `train.skip_nonfinite`, a step whose gradients are not finite keeps
the old state whole and is counted as skipped. `eval_step(model, batch)` returns the summed loss and the number of
target tokens (and bytes), so splits of any size average exactly.
"""

from __future__ import annotations

from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from optimizers import grad_norm_of
from training.precision import all_finite, cast_floating
from training.state import TrainState

Batch = dict[str, jax.Array]
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def token_losses(model: Any, batch: Batch, key: jax.Array | None, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """Summed cross-entropy over the target tokens (float32) and how many there are."""
    logits_BTV = cast_floating(model, dtype)(batch["inputs"], key=key)
    nll_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), batch["targets"])
    mask_BT = batch["loss_mask"]
    return jnp.sum(nll_BT * mask_BT), jnp.sum(mask_BT)


def mean_loss(model: Any, batch: Batch, key: jax.Array | None, dtype: jnp.dtype) -> jax.Array:
    """The masked mean token cross-entropy: pretraining masks only padding, fine-tuning also the prompt."""
    total, count = token_losses(model, batch, key, dtype)
    return total / jnp.maximum(count, 1.0)


def make_train_step(optimizer: optax.GradientTransformation, state_shardings: Any, dtype: jnp.dtype,
                    skip_nonfinite: bool = False, jit: bool = True
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """The compiled step (`jit=False`: the plain function, for ahead-of-time lowering from abstract shapes)."""
    dynamic_scale = jnp.dtype(dtype) == jnp.float16
    guard = dynamic_scale or skip_nonfinite

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        use_dropout = state.model.cfg.dropout > 0
        step_key = jax.random.fold_in(state.key, state.step)
        scale = state.loss_scale.scale

        def scaled_loss(model, micro_batch, key):
            loss = mean_loss(model, micro_batch, key, dtype)
            return loss * scale if dynamic_scale else loss

        def micro_step(carry, xs):
            model, opt_state, finite = carry
            micro_batch, i = xs
            key = jax.random.fold_in(step_key, i) if use_dropout else None
            loss, grads = eqx.filter_value_and_grad(scaled_loss)(model, micro_batch, key)
            if dynamic_scale:
                loss, grads = loss / scale, jax.tree.map(lambda g: g / scale, grads)
            if guard:
                finite = finite & all_finite(grads)
            grads = eqx.filter_shard(grads, state_shardings.model)  # fsdp: reduce-scatter into the params' layout
            updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            return (eqx.apply_updates(model, updates), opt_state, finite), loss

        num_micro = batch["inputs"].shape[0]
        carry = (state.model, state.opt_state, jnp.asarray(True))
        if num_micro == 1:  # no loop: a length-1 scan makes the whole state a loop carry (measured ~2% slower)
            (model, opt_state, finite), loss = micro_step(carry, (jax.tree.map(lambda x: x[0], batch), 0))
            losses = loss[None]
        else:
            (model, opt_state, finite), losses = jax.lax.scan(micro_step, carry, (batch, jnp.arange(num_micro)))
        if guard:  # a non-finite step changes nothing but the loss scale and the skip counter
            model, opt_state = jax.tree.map(
                lambda new, old: jnp.where(finite, new, old), (model, opt_state), (state.model, state.opt_state)
            )
        loss_scale = state.loss_scale.after_step(finite, dynamic_scale)
        new_state = TrainState(step=state.step + 1, model=model, opt_state=opt_state, key=state.key,
                               loss_scale=loss_scale)
        new_state = eqx.filter_shard(new_state, state_shardings)
        metrics = {"loss": jnp.mean(losses), "grad_norm": grad_norm_of(opt_state), "loss_scale": loss_scale.scale,
                   "skipped_steps": loss_scale.skipped}
        return new_state, metrics

    return eqx.filter_jit(train_step, donate="all") if jit else train_step


def make_eval_step(dtype: jnp.dtype) -> Callable[[Any, Batch], tuple[jax.Array, jax.Array, jax.Array]]:
    """(summed loss, target tokens, target bytes) of one batch; the batch also carries `target_bytes`."""

    def eval_step(model: Any, batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
        total, count = token_losses(model, batch, None, dtype)
        return total, count, jnp.sum(batch["target_bytes"])

    return eqx.filter_jit(eval_step)
