"""The compiled train step.

`train_step(state, batch) -> (state, metrics)` is pure: it reads nothing but its arguments, and the state's buffers
are donated. It is two programs: the schedule's lr for the optimizer's update count, then the step proper, which
takes that lr as an argument. The step's program is thus the same whatever the schedule: two runs whose schedules
agree on a step (a run and a longer one, a segment and the run it continues, a search's branch and the schedule it
finds) compute it with the very same program. With the schedule inside, a schedule that differs only in later steps
is a different program, which XLA:CPU compiles into different machine code (its fusions, vectorisation and fused
multiply-adds) whose float32 results can differ in the last bit, and by how much depends on the CPU.

A batch holds [grad_accum, batch, time] arrays; the step scans over the micro-batches, feeding each gradient to the
optimizer (optax.MultiSteps sums them and updates on the last).

Every target token of a step counts once, whatever the accumulation, masking or process count: the step's loss is the
sum of its target tokens' losses divided by the step's target-token count, which is known before the scan (the
`loss_mask` of the whole global batch). Each micro-batch contributes its summed loss over that count, so a micro-batch
with 3 target tokens weighs 1/100 of one with 300, exactly as in one big batch.

With `z_loss` > 0 the objective adds PaLM's auxiliary term z_loss * log(Z)^2 per target token (Z the softmax's
normaliser), which keeps the logits from drifting; it is reported beside the cross-entropy, which stays the `loss`.

With float16 compute the loss is scaled (training/step/precision.py); with float16 or `train.skip_nonfinite`, a step
whose gradients are not finite keeps the old state whole and is counted as skipped.

The pieces, in the order a step runs them:
  StepObjective      what is fixed at the step's start: its target tokens, dropout keys, loss scale, FP8 scales
  accumulate         the micro-batches: gradient, optimizer update (micro_step), the summed gradient if kept
  loss_on_last_params  the statistics' extra pass: f(x_{t-1}; b_t) and its gradient (training/step/stats.py)
  keep_if_finite     the non-finite guard (training/step/precision.py)
  step_metrics       what the step reports
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from models.config import GPTConfig
from models.fp8 import amax_over_range
from models.gpt import GPT, with_config
from optimizers import applied_lr_of, grad_norm_of, lr_step_of
from optimizers.reporting import optimizer_metrics
from training.step.losses import Batch, LossSums, loss_sums
from training.step.precision import LossScale, all_finite, cast_floating, keep_if_finite
from training.step.state import TrainState
from training.step.stats import StatsKnobs, update_stats

Metrics = dict[str, jax.Array]


@dataclass(frozen=True)
class StepSpec:
    """What the step is made with (static: a new spec is a new compilation)."""

    optimizer: optax.GradientTransformation
    shardings: TrainState  # the TrainState's shardings: NamedSharding leaves (training/distributed/sharding.py)
    dtype: jnp.dtype  # the compute dtype
    skip_nonfinite: bool = False
    knobs: StatsKnobs = field(default_factory=StatsKnobs)
    z_loss: float = 0.0
    lr_multipliers: dict[str, float] = field(default_factory=dict)

    @property
    def dynamic_scale(self) -> bool:
        return jnp.dtype(self.dtype) == jnp.float16

    @property
    def guard(self) -> bool:
        """Whether a non-finite step is skipped: float16 always, any dtype with train.skip_nonfinite."""
        return self.dynamic_scale or self.skip_nonfinite


@dataclass(frozen=True)
class StepObjective:
    """The step's objective, fixed at its start: every micro-batch's share of the mean over the step's tokens."""

    spec: StepSpec
    step_tokens: jax.Array  # target tokens of the whole step: every micro-batch, every process
    step_key: jax.Array
    use_dropout: bool
    fp8_scales: jax.Array | None  # FP8: every micro-batch quantises at the scales of the step's start
    model_cfg: GPTConfig | None = None  # the stage's view of the model (train.stages), None: the model's own

    @staticmethod
    def of(spec: StepSpec, state: TrainState, batch: Batch, model_cfg: GPTConfig | None = None) -> StepObjective:
        return StepObjective(
            spec,
            jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0),
            jax.random.fold_in(state.key, state.step),
            state.model.cfg.dropout > 0,
            None if state.fp8 is None else state.fp8.scales(),
            model_cfg,
        )

    def view(self, model: GPT) -> GPT:
        """`model` as this stage reads it (its attention window; the parameters and their gradients unchanged)."""
        return model if self.model_cfg is None else with_config(model, self.model_cfg)

    def micro_key(self, i: jax.Array | int) -> jax.Array | None:
        return jax.random.fold_in(self.step_key, i) if self.use_dropout else None

    def share(
        self,
        model: GPT,
        micro_batch: Batch,
        i: jax.Array | int,
        scales: jax.Array | None = None,
    ) -> tuple[jax.Array, LossSums]:
        """This micro-batch's part of the step's mean objective over the step's target tokens, and its sums."""
        sums = loss_sums(self.view(model), micro_batch, self.micro_key(i), self.spec.dtype, scales)
        return (sums.nll + self.spec.z_loss * sums.log_z_squared) / self.step_tokens, sums


class Carry(NamedTuple):
    """What the micro-batches carry from one to the next."""

    model: GPT
    opt_state: optax.OptState
    finite: jax.Array  # every gradient so far finite
    # the step's gradient g_t, summed over the micro-batches (only when the statistics need it)
    grad_sum: optax.Updates | None
    fp8_amax: jax.Array | None  # the largest |x| each FP8 matmul saw (models/fp8.py)


def micro_step(
    spec: StepSpec,
    objective: StepObjective,
    compute_model: GPT,
    scale: jax.Array,
    lr: jax.Array,
    carry: Carry,
    xs: tuple[Batch, jax.Array, jax.Array],
) -> tuple[Carry, LossSums]:
    """One micro-batch (`xs`: its rows, its index, whether it is the step's last): its gradient (on the step's
    compute-dtype copy of the parameters), then the optimizer, which runs at the last only."""
    micro_batch, i, last = xs
    model = carry.model

    def scaled_share(model_and_scales):
        m, scales = model_and_scales
        share, sums = objective.share(m, micro_batch, i, scales)
        return (share * scale if spec.dynamic_scale else share), sums

    (_, sums), (grads, amax) = eqx.filter_value_and_grad(scaled_share, has_aux=True)(
        (compute_model, objective.fp8_scales)
    )
    fp8_amax = None if carry.fp8_amax is None else jnp.maximum(carry.fp8_amax, amax)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, eqx.filter(model, eqx.is_array))
    if spec.dynamic_scale:
        grads = jax.tree.map(lambda g: g / scale, grads)
    finite = carry.finite & all_finite(grads) if spec.guard else carry.finite
    grads = eqx.filter_shard(grads, spec.shardings.model)  # fsdp: reduce-scatter into the params' layout
    grad_sum = jax.tree.map(jnp.add, carry.grad_sum, grads) if spec.knobs.any else carry.grad_sum

    def micro_objective(params):
        """This micro-batch's mean objective as a function of the parameters, for an optimizer that needs the loss
        itself (Sophia's Hessian-vector products); the others ignore it and it is never traced."""
        sums = loss_sums(objective.view(eqx.combine(params, model)), micro_batch, objective.micro_key(i), spec.dtype)
        return (sums.nll + spec.z_loss * sums.log_z_squared) / jnp.maximum(sums.tokens, 1.0)

    with jax.named_scope("optimizer"):  # for scripts/tools/profile_summary.py
        updates, opt_state = spec.optimizer.update(
            grads,
            carry.opt_state,
            eqx.filter(model, eqx.is_array),
            obj_fn=micro_objective,
            lr=lr,
            last_micro_batch=last,
        )
        model = eqx.apply_updates(model, updates)
    return Carry(model, opt_state, finite, grad_sum, fp8_amax), sums


def accumulate(
    spec: StepSpec, objective: StepObjective, state: TrainState, batch: Batch, lr: jax.Array
) -> tuple[Carry, LossSums]:
    """Every micro-batch of the step through `micro_step`; their loss sums stacked [grad_accum]."""
    # The compute-dtype copy of the parameters, made once per step: the parameters change only at the step's last
    # micro-batch (MultiSteps passes zero updates before it), so every micro-batch reads the same copy.
    # Differentiating the copy gives the gradient the cast's transpose would (a 16-bit cotangent widened to float32),
    # widened in micro_step instead.
    body = partial(micro_step, spec, objective, cast_floating(state.model, spec.dtype), state.loss_scale.scale, lr)
    params = eqx.filter(state.model, eqx.is_array)
    carry = Carry(
        state.model,
        state.opt_state,
        jnp.asarray(True),
        jax.tree.map(jnp.zeros_like, params) if spec.knobs.any else None,
        None if objective.fp8_scales is None else jnp.zeros_like(objective.fp8_scales),
    )
    num_micro = batch["inputs"].shape[0]
    if num_micro == 1:  # no loop: a length-1 scan makes the whole state a loop carry (measured ~2% slower)
        return body(carry, (jax.tree.map(lambda x: x[0], batch), 0, True))
    index = jnp.arange(num_micro)
    return jax.lax.scan(body, carry, (batch, index, index == num_micro - 1))


def loss_on_last_params(
    knobs: StatsKnobs,
    objective: StepObjective,
    state: TrainState,
    batch: Batch,
    scale: jax.Array | None,
    last_params: optax.Params,
) -> tuple[jax.Array, optax.Updates | None]:
    """f(x; b_t) at other parameters `last_params` (and its gradient, with knobs.compute_last_grads) over the step's
    micro-batches, with the step's dropout keys: the statistics' extra pass (training/step/stats.py). `scale`: the
    float16 loss scale, under which the gradient is taken as the step's own is (unscaled, float16's small per-token
    gradients underflowed: grad_diff_norm 2e-3 where the parameters had not moved)."""
    last_model = eqx.combine(last_params, state.model)

    def one(total, xs):
        micro_batch, i = xs
        share = lambda m: objective.share(m, micro_batch, i, objective.fp8_scales)[0]  # noqa: E731
        if knobs.compute_last_grads:
            scaled = share if scale is None else lambda m: share(m) * scale
            value, grads = eqx.filter_value_and_grad(scaled)(last_model)
            grads = eqx.filter(grads, eqx.is_array)
            if scale is not None:
                value, grads = value / scale, jax.tree.map(lambda g: g / scale, grads)
            return jax.tree.map(jnp.add, total, (value, grads)), None
        return (total[0] + share(last_model), None), None

    params = eqx.filter(state.model, eqx.is_array)
    zero_grads = jax.tree.map(jnp.zeros_like, params) if knobs.compute_last_grads else None
    (value, grads), _ = jax.lax.scan(
        one, (jnp.zeros([], jnp.float32), zero_grads), (batch, jnp.arange(batch["inputs"].shape[0]))
    )
    return value, grads


def step_metrics(
    spec: StepSpec,
    opt_state: optax.OptState,
    loss: jax.Array,
    z_term: jax.Array,
    step_tokens: jax.Array,
    loss_scale: LossScale,
    stat_metrics: Metrics,
    applied: jax.Array,
) -> Metrics:
    """What a step reports. Where non-finite steps are skipped (spec.guard), whether this one was `applied`, and
    its gradient norm only if so (NaN: the state's norm is the last applied step's)."""
    lr = applied_lr_of(opt_state)
    group_lrs = {f"lr/{name}": lr * multiplier for name, multiplier in spec.lr_multipliers.items()}
    grad_norm = grad_norm_of(opt_state)
    guarded = {"applied": applied, "grad_norm": jnp.where(applied, grad_norm, jnp.nan)} if spec.guard else {}
    return {
        "loss": loss,
        "target_tokens": step_tokens,
        "lr": lr,
        **group_lrs,
        "grad_norm": grad_norm,
        **guarded,
        "loss_scale": loss_scale.scale,
        "skipped_steps": loss_scale.skipped,
        **({"z_loss": z_term} if spec.z_loss else {}),
        **stat_metrics,
        **optimizer_metrics(opt_state),
    }


def train_step(
    spec: StepSpec, state: TrainState, batch: Batch, lr: jax.Array, model_cfg: GPTConfig | None = None
) -> tuple[TrainState, Metrics]:
    """`lr`: the schedule's value at the optimizer's update count (`TrainStep` computes it). `model_cfg`: the model
    as the step's stage reads it (train.stages), None: as it is."""
    objective = StepObjective.of(spec, state, batch, model_cfg)
    carry, sums = accumulate(spec, objective, state, batch, lr)
    model, opt_state = carry.model, carry.opt_state
    fp8 = None if state.fp8 is None else state.fp8.record(carry.fp8_amax)
    loss = jnp.sum(sums.nll) / objective.step_tokens
    z_term = spec.z_loss * jnp.sum(sums.log_z_squared) / objective.step_tokens
    stats, stat_metrics = state.stats, {}
    if spec.knobs.any:
        stats, stat_metrics = update_stats(
            spec.knobs,
            state.stats,
            eqx.filter(state.model, eqx.is_array),
            eqx.filter(model, eqx.is_array),
            eqx.filter(carry.grad_sum, eqx.is_array),
            loss + z_term,
            partial(
                loss_on_last_params,
                spec.knobs,
                objective,
                state,
                batch,
                state.loss_scale.scale if spec.dynamic_scale else None,
            ),
            carry.finite,
        )
    if spec.guard:  # a non-finite step changes nothing but the loss scale and the skip counter
        model, opt_state, fp8 = keep_if_finite(
            carry.finite, (model, opt_state, fp8), (state.model, state.opt_state, state.fp8)
        )
    loss_scale = state.loss_scale.after_step(carry.finite, spec.dynamic_scale)
    new_state = TrainState(
        step=state.step + 1,
        model=model,
        opt_state=opt_state,
        key=state.key,
        loss_scale=loss_scale,
        stats=stats,
        fp8=fp8,
    )
    if state.fp8 is not None:  # per kind (input, weight, gradient): the tensors that outgrew their scale's range
        over = amax_over_range(objective.fp8_scales, carry.fp8_amax).reshape(-1, 3)
        clipped, largest = jnp.sum(over > 1.0, axis=0), jnp.max(over, axis=0)
        stat_metrics = {**stat_metrics, "fp8_clipped": clipped, "fp8_amax_over_range": largest}
    new_state = eqx.filter_shard(new_state, spec.shardings)
    metrics = step_metrics(spec, opt_state, loss, z_term, objective.step_tokens, loss_scale, stat_metrics, carry.finite)
    return new_state, metrics


class TrainStep:
    """`train_step(state, batch) -> (state, metrics)`: the schedule's lr at the state's update count from a small
    program of its own, then the compiled step fed that lr (the module's docstring says why they are two)."""

    def __init__(
        self,
        step: Callable,
        lr_schedule: optax.Schedule,
        state_shardings: TrainState,
        model_config_at: Callable[[int], GPTConfig | None] = lambda step: None,
        stage_lr_multiplier: Callable[[jax.Array], jax.Array] | None = None,
    ) -> None:
        self.step = step
        self.model_config_at = model_config_at  # the model's view at a step (train.stages); None: its own

        # its name is the program's in profiles: jit_lr_schedule_at. The schedule follows the update count; a
        # stage's multiplier (train.stages) the step, as the stage's batch and window do: after a skipped step the
        # count is one behind the step
        def lr_schedule_at(opt_state: optax.OptState, step: jax.Array) -> jax.Array:
            lr = lr_schedule(lr_step_of(opt_state))
            return jnp.asarray(lr if stage_lr_multiplier is None else lr * stage_lr_multiplier(step), jnp.float32)

        # placed as the update count is (replicated over the mesh) whatever the schedule: a constant one does not
        # read the count, and its lr would otherwise land on one device, a different input layout for the step
        self.lr_at = jax.jit(lr_schedule_at, out_shardings=lr_step_of(state_shardings.opt_state))
        # On a GPU or TPU the call returns once the step is dispatched, and the host prepares the next while the
        # device computes. On the CPU host and "device" share the cores: the host's work between steps would take
        # them from XLA's threads (gpt2-mini, 2 cores: 1,850-2,020 tokens/s dispatching ahead against 2,100-2,180
        # waiting, BENCHMARKS.md), so there each call waits for its step.
        self.wait = jax.default_backend() == "cpu"

    def __call__(self, state: TrainState, batch: Batch, step: int | None = None) -> tuple[TrainState, Metrics]:
        """`step`: the steps completed before this one, which pick the stage's program (train.stages; each is
        compiled at its first call); None: the model as it is (the last stage's)."""
        model_cfg = None if step is None else self.model_config_at(step)
        out = self.step(state, batch, self.lr_at(state.opt_state, state.step), model_cfg)
        return jax.block_until_ready(out) if self.wait else out

    def lower(self, state: TrainState, batch: Batch) -> jax.stages.Lowered:
        """The step proper, lowered for these arguments (what tests and profiles read)."""
        return self.step.lower(state, batch, self.lr_at(state.opt_state, state.step), None)


def make_train_step(
    optimizer: optax.GradientTransformation,
    lr_schedule: optax.Schedule,
    state_shardings: TrainState,
    dtype: jnp.dtype,
    skip_nonfinite: bool = False,
    jit: bool = True,
    knobs: StatsKnobs = StatsKnobs(),
    z_loss: float = 0.0,
    lr_multipliers: dict[str, float] | None = None,
    model_config_at: Callable[[int], GPTConfig | None] = lambda step: None,
    stage_lr_multiplier: Callable[[jax.Array], jax.Array] | None = None,
) -> TrainStep | Callable:
    """The step. `lr_schedule`: the lr the optimizer applies at each update count (optimizers.lr_schedule_of).
    `jit=False`: the plain function `(state, batch, lr)`, for ahead-of-time lowering from abstract shapes.
    `knobs`: which training statistics (training/step/stats.py) the step computes; none by default. `lr_multipliers`:
    the optimizer's parameter groups' (optimizers/groups.py), each reported as `lr/<group>`. `stage_lr_multiplier`:
    train.stages' multiplier at a step (training/config/stages.py `lr_multiplier_at`), times the schedule's lr."""
    spec = StepSpec(optimizer, state_shardings, dtype, skip_nonfinite, knobs, z_loss, dict(lr_multipliers or {}))

    def step(
        state: TrainState, batch: Batch, lr: jax.Array, model_cfg: GPTConfig | None = None
    ) -> tuple[TrainState, Metrics]:
        return train_step(spec, state, batch, lr, model_cfg)

    step.__name__ = step.__qualname__ = "train_step"  # the name profiles and scripts/tools/profile_summary.py look for
    # jax.jit, not eqx.filter_jit: Equinox's waits for every call to finish (to raise its runtime errors), which would
    # make the host wait for the device at every step; the state and batch are all arrays (static parts are in the
    # state's tree structure), so jax.jit takes them as they are, and the call returns once the step is dispatched.
    # The state is donated (the new one takes its buffers); the batch and lr match no output, so donating them gains
    # nothing.
    if not jit:
        return step
    return TrainStep(
        jax.jit(step, donate_argnums=0, static_argnums=3),
        lr_schedule,
        state_shardings,
        model_config_at,
        stage_lr_multiplier,
    )
