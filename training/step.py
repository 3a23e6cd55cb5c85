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
from training.stats import StatsKnobs, update_stats

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
                    skip_nonfinite: bool = False, jit: bool = True, knobs: StatsKnobs = StatsKnobs()
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """The compiled step (`jit=False`: the plain function, for ahead-of-time lowering from abstract shapes).
    `knobs`: which training statistics (training/stats.py) the step computes; none by default."""
    dynamic_scale = jnp.dtype(dtype) == jnp.float16
    guard = dynamic_scale or skip_nonfinite
    keep_grads = knobs.any  # the step's averaged gradient g_t is only kept for the statistics

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        use_dropout = state.model.cfg.dropout > 0
        step_key = jax.random.fold_in(state.key, state.step)
        scale = state.loss_scale.scale

        def scaled_loss(model, micro_batch, key):
            loss = mean_loss(model, micro_batch, key, dtype)
            return loss * scale if dynamic_scale else loss

        def micro_step(carry, xs):
            model, opt_state, finite, grad_sum = carry
            micro_batch, i = xs
            key = jax.random.fold_in(step_key, i) if use_dropout else None
            loss, grads = eqx.filter_value_and_grad(scaled_loss)(model, micro_batch, key)
            if dynamic_scale:
                loss, grads = loss / scale, jax.tree.map(lambda g: g / scale, grads)
            if guard:
                finite = finite & all_finite(grads)
            grads = eqx.filter_shard(grads, state_shardings.model)  # fsdp: reduce-scatter into the params' layout
            if keep_grads:
                grad_sum = jax.tree.map(jnp.add, grad_sum, grads)
            updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            return (eqx.apply_updates(model, updates), opt_state, finite, grad_sum), loss

        num_micro = batch["inputs"].shape[0]
        params = eqx.filter(state.model, eqx.is_array)
        grad_sum = jax.tree.map(jnp.zeros_like, params) if keep_grads else None
        carry = (state.model, state.opt_state, jnp.asarray(True), grad_sum)
        if num_micro == 1:  # no loop: a length-1 scan makes the whole state a loop carry (measured ~2% slower)
            (model, opt_state, finite, grad_sum), loss = micro_step(carry, (jax.tree.map(lambda x: x[0], batch), 0))
            losses = loss[None]
        else:
            (model, opt_state, finite, grad_sum), losses = jax.lax.scan(micro_step, carry,
                                                                        (batch, jnp.arange(num_micro)))
        stats, stat_metrics = state.stats, {}
        if keep_grads:
            def last_loss_and_grads(last_params):
                """f(x; b_t) (and its gradient) over the step's micro-batches, with the step's dropout keys."""
                last_model = eqx.combine(last_params, state.model)

                def one(total, xs):
                    micro_batch, i = xs
                    key = jax.random.fold_in(step_key, i) if use_dropout else None
                    if knobs.compute_last_grads:
                        loss, grads = eqx.filter_value_and_grad(mean_loss)(last_model, micro_batch, key, dtype)
                        return jax.tree.map(jnp.add, total, (loss, eqx.filter(grads, eqx.is_array))), None
                    return (total[0] + mean_loss(last_model, micro_batch, key, dtype), None), None

                zero_grads = jax.tree.map(jnp.zeros_like, params) if knobs.compute_last_grads else None
                (loss, grads), _ = jax.lax.scan(one, (jnp.zeros([], jnp.float32), zero_grads),
                                                (batch, jnp.arange(num_micro)))
                return loss / num_micro, None if grads is None else jax.tree.map(lambda g: g / num_micro, grads)

            step_grads = jax.tree.map(lambda g: g / num_micro, eqx.filter(grad_sum, eqx.is_array))
            stats, stat_metrics = update_stats(knobs, state.stats, params, eqx.filter(model, eqx.is_array),
                                               step_grads, jnp.mean(losses), last_loss_and_grads, finite)
        if guard:  # a non-finite step changes nothing but the loss scale and the skip counter
            model, opt_state = jax.tree.map(
                lambda new, old: jnp.where(finite, new, old), (model, opt_state), (state.model, state.opt_state)
            )
        loss_scale = state.loss_scale.after_step(finite, dynamic_scale)
        new_state = TrainState(step=state.step + 1, model=model, opt_state=opt_state, key=state.key,
                               loss_scale=loss_scale, stats=stats)
        new_state = eqx.filter_shard(new_state, state_shardings)
        metrics = {"loss": jnp.mean(losses), "grad_norm": grad_norm_of(opt_state), "loss_scale": loss_scale.scale,
                   "skipped_steps": loss_scale.skipped, **stat_metrics}
        return new_state, metrics

    return eqx.filter_jit(train_step, donate="all") if jit else train_step


def make_eval_step(dtype: jnp.dtype) -> Callable[[Any, Batch], tuple[jax.Array, jax.Array, jax.Array]]:
    """(summed loss, target tokens, target bytes) of one batch; the batch also carries `target_bytes`."""

    def eval_step(model: Any, batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
        total, count = token_losses(model, batch, None, dtype)
        return total, count, jnp.sum(batch["target_bytes"])

    return eqx.filter_jit(eval_step)
