"""The loss and the two compiled steps.

`train_step(state, batch) -> (state, metrics)` is pure: it reads nothing but its arguments, and the state's buffers
are donated. A batch holds [grad_accum, batch, time] arrays; the step scans over the micro-batches, feeding each
gradient to the optimizer (optax.MultiSteps sums them and updates on the last).

Every target token of a step counts once, whatever the accumulation, masking or process count: the step's loss is the
sum of its target tokens' losses divided by the step's target-token count, which is known before the scan (the
`loss_mask` of the whole global batch). Each micro-batch contributes its summed loss over that count, so a micro-batch
with 3 target tokens weighs 1/100 of one with 300, exactly as in one big batch.

With `z_loss` > 0 the objective adds PaLM's auxiliary term z_loss * log(Z)^2 per target token (Z the softmax's
normaliser), which keeps the logits from drifting; it is reported beside the cross-entropy, which stays the `loss`.

With float16 compute the loss is scaled (training/step/precision.py); with float16 or `train.skip_nonfinite`, a step
whose gradients are not finite keeps the old state whole and is counted as skipped. `eval_step(model, batch)` returns
the summed loss and the number of target tokens (and bytes), so splits of any size average exactly.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from optimizers import applied_lr_of, grad_norm_of
from optimizers.reporting import optimizer_metrics
from training.step.precision import all_finite, cast_floating
from training.step.state import TrainState
from training.step.stats import StatsKnobs, update_stats

Batch = dict[str, jax.Array]
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def compute_dtype(name: str) -> jnp.dtype:
    """`system.dtype` -> the dtype the step computes in: fp8 is bfloat16 with FP8 matmuls in the blocks."""
    return jnp.bfloat16 if name == "fp8" else COMPUTE_DTYPES[name]


class LossSums(NamedTuple):
    """Sums over a batch's target tokens (float32): cross-entropy, log(Z)^2 (z-loss), and how many there are."""

    nll: jax.Array
    log_z_squared: jax.Array
    tokens: jax.Array


def loss_sums(model: Any, batch: Batch, key: jax.Array | None, dtype: jnp.dtype,
              fp8_scales: jax.Array | None = None) -> LossSums:
    """Cross-entropy from log(Z) - the target's logit, in float32 whatever the compute dtype. `fp8_scales`: the
    blocks' matmuls in FP8 at these scales (models/fp8.py)."""
    log_z_BT, target_logit_BT = cast_floating(model, dtype).loss_terms(
        batch["inputs"], batch["targets"], key=key, segment_ids_BT=batch.get("segment_ids"), fp8_scales=fp8_scales)
    mask_BT = batch["loss_mask"]
    return LossSums(jnp.sum((log_z_BT - target_logit_BT) * mask_BT), jnp.sum(jnp.square(log_z_BT) * mask_BT),
                    jnp.sum(mask_BT))


def token_losses(model: Any, batch: Batch, key: jax.Array | None, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """Summed cross-entropy over the target tokens (float32) and how many there are."""
    sums = loss_sums(model, batch, key, dtype)
    return sums.nll, sums.tokens


def mean_loss(model: Any, batch: Batch, key: jax.Array | None, dtype: jnp.dtype) -> jax.Array:
    """The masked mean token cross-entropy of one batch: pretraining masks only padding, fine-tuning also the prompt."""
    total, count = token_losses(model, batch, key, dtype)
    return total / jnp.maximum(count, 1.0)


def make_train_step(optimizer: Any, state_shardings: Any, dtype: jnp.dtype, skip_nonfinite: bool = False,
                    jit: bool = True, knobs: StatsKnobs = StatsKnobs(), z_loss: float = 0.0,
                    lr_multipliers: dict[str, float] | None = None
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """The compiled step (`jit=False`: the plain function, for ahead-of-time lowering from abstract shapes).
    `knobs`: which training statistics (training/step/stats.py) the step computes; none by default. `lr_multipliers`:
    the optimizer's parameter groups' (optimizers/groups.py), each reported as `lr/<group>`."""
    dynamic_scale = jnp.dtype(dtype) == jnp.float16
    guard = dynamic_scale or skip_nonfinite
    keep_grads = knobs.any  # the step's gradient g_t is only kept for the statistics

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        use_dropout = state.model.cfg.dropout > 0
        # FP8: every micro-batch quantises at the scales of the step's start (delayed scaling); each returns the
        # amaxes it saw as the scales' cotangent, and the step records the largest (models/fp8.py)
        fp8_scales = None if state.fp8 is None else state.fp8.scales()
        step_key = jax.random.fold_in(state.key, state.step)
        scale = state.loss_scale.scale
        step_tokens = jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)  # every micro-batch, every process

        def micro_key(i):
            return jax.random.fold_in(step_key, i) if use_dropout else None

        def share_of_objective(model, micro_batch, key, scales=fp8_scales):
            """This micro-batch's part of the step's mean objective over the step's target tokens."""
            sums = loss_sums(model, micro_batch, key, dtype, scales)
            return (sums.nll + z_loss * sums.log_z_squared) / step_tokens, sums

        # The compute-dtype copy of the parameters, made once per step: the parameters change only at the step's
        # last micro-batch (MultiSteps passes zero updates before it), so every micro-batch reads the same copy.
        # Differentiating the copy gives the gradient the cast's transpose would (a 16-bit cotangent widened to
        # float32), widened here instead.
        compute_model = cast_floating(state.model, dtype)

        def micro_step(carry, xs):
            model, opt_state, finite, grad_sum, fp8_amax = carry
            micro_batch, i = xs

            def objective(model_and_scales):
                m, scales = model_and_scales
                share, sums = share_of_objective(m, micro_batch, micro_key(i), scales)
                return (share * scale if dynamic_scale else share), sums

            (_, sums), (grads, amax) = eqx.filter_value_and_grad(objective, has_aux=True)((compute_model, fp8_scales))
            if fp8_amax is not None:
                fp8_amax = jnp.maximum(fp8_amax, amax)
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, eqx.filter(model, eqx.is_array))
            if dynamic_scale:
                grads = jax.tree.map(lambda g: g / scale, grads)
            if guard:
                finite = finite & all_finite(grads)
            grads = eqx.filter_shard(grads, state_shardings.model)  # fsdp: reduce-scatter into the params' layout
            if keep_grads:
                grad_sum = jax.tree.map(jnp.add, grad_sum, grads)
            def micro_objective(params):
                """This micro-batch's mean objective as a function of the parameters, for an optimizer that needs
                the loss itself (Sophia's Hessian-vector products); the others ignore it and it is never traced."""
                sums = loss_sums(eqx.combine(params, model), micro_batch, micro_key(i), dtype)
                return (sums.nll + z_loss * sums.log_z_squared) / jnp.maximum(sums.tokens, 1.0)

            with jax.named_scope("optimizer"):  # for scripts/profile_summary.py
                updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array),
                                                      obj_fn=micro_objective)
                model = eqx.apply_updates(model, updates)
            return (model, opt_state, finite, grad_sum, fp8_amax), sums

        num_micro = batch["inputs"].shape[0]
        params = eqx.filter(state.model, eqx.is_array)
        grad_sum = jax.tree.map(jnp.zeros_like, params) if keep_grads else None
        fp8_amax = None if fp8_scales is None else jnp.zeros_like(fp8_scales)
        carry = (state.model, state.opt_state, jnp.asarray(True), grad_sum, fp8_amax)
        if num_micro == 1:  # no loop: a length-1 scan makes the whole state a loop carry (measured ~2% slower)
            (model, opt_state, finite, grad_sum, fp8_amax), sums = micro_step(
                carry, (jax.tree.map(lambda x: x[0], batch), 0))
        else:
            (model, opt_state, finite, grad_sum, fp8_amax), sums = jax.lax.scan(micro_step, carry,
                                                                                (batch, jnp.arange(num_micro)))
        fp8 = None if state.fp8 is None else state.fp8.record(fp8_amax)
        loss = jnp.sum(sums.nll) / step_tokens
        z_term = z_loss * jnp.sum(sums.log_z_squared) / step_tokens
        stats, stat_metrics = state.stats, {}
        if keep_grads:
            def last_loss_and_grads(last_params):
                """f(x; b_t) (and its gradient) over the step's micro-batches, with the step's dropout keys."""
                last_model = eqx.combine(last_params, state.model)
                objective = lambda m, micro_batch, key: share_of_objective(m, micro_batch, key)[0]  # noqa: E731

                def one(total, xs):
                    micro_batch, i = xs
                    if knobs.compute_last_grads:
                        value, grads = eqx.filter_value_and_grad(objective)(last_model, micro_batch, micro_key(i))
                        return jax.tree.map(jnp.add, total, (value, eqx.filter(grads, eqx.is_array))), None
                    return (total[0] + objective(last_model, micro_batch, micro_key(i)), None), None

                zero_grads = jax.tree.map(jnp.zeros_like, params) if knobs.compute_last_grads else None
                (value, grads), _ = jax.lax.scan(one, (jnp.zeros([], jnp.float32), zero_grads),
                                                 (batch, jnp.arange(num_micro)))
                return value, grads

            stats, stat_metrics = update_stats(knobs, state.stats, params, eqx.filter(model, eqx.is_array),
                                               eqx.filter(grad_sum, eqx.is_array), loss + z_term,
                                               last_loss_and_grads, finite)
        if guard:  # a non-finite step changes nothing but the loss scale and the skip counter
            model, opt_state, fp8 = jax.tree.map(
                lambda new, old: jnp.where(finite, new, old), (model, opt_state, fp8),
                (state.model, state.opt_state, state.fp8))
        loss_scale = state.loss_scale.after_step(finite, dynamic_scale)
        new_state = TrainState(step=state.step + 1, model=model, opt_state=opt_state, key=state.key,
                               loss_scale=loss_scale, stats=stats, fp8=fp8)
        new_state = eqx.filter_shard(new_state, state_shardings)
        lr = applied_lr_of(opt_state)
        group_lrs = {f"lr/{name}": lr * multiplier for name, multiplier in (lr_multipliers or {}).items()}
        metrics = {"loss": loss, "target_tokens": step_tokens, "lr": lr, **group_lrs,
                   "grad_norm": grad_norm_of(opt_state), "loss_scale": loss_scale.scale,
                   "skipped_steps": loss_scale.skipped, **({"z_loss": z_term} if z_loss else {}), **stat_metrics,
                   **optimizer_metrics(opt_state)}
        return new_state, metrics

    return eqx.filter_jit(train_step, donate="all") if jit else train_step


def make_eval_step(dtype: jnp.dtype) -> Callable[[Any, Batch], tuple[jax.Array, jax.Array, jax.Array]]:
    """(summed loss, target tokens, target bytes) of one batch; the batch also carries `target_bytes`."""

    def eval_step(model: Any, batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
        total, count = token_losses(model, batch, None, dtype)
        return total, count, jnp.sum(batch["target_bytes"])

    return eqx.filter_jit(eval_step)
