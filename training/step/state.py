"""The one state pytree: everything a run needs to continue lives here (or in the checkpoint's JSON metadata)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from models.fp8 import Fp8Recipe, Fp8State
from models.gpt import GPT
from optimizers import eval_params
from training.distributed.sharding import state_shardings
from training.step.precision import LossScale
from training.step.stats import StatsKnobs, init_stats


class TrainState(eqx.Module):
    step: jax.Array  # optimizer steps completed (int32 scalar)
    model: GPT  # the Equinox model; its array leaves are the parameters (float32)
    opt_state: optax.OptState  # incl. MultiSteps' accumulator when accumulating
    key: jax.Array  # base PRNG key (uint32[2]); step keys are folded in from it, so it never changes
    loss_scale: LossScale  # float16's dynamic loss scale and the count of skipped (non-finite) steps
    stats: dict | None = None  # training-statistics buffers (training/step/stats.py); None when no knob is on
    fp8: Fp8State | None = None  # system.dtype=fp8: the FP8 matmuls' amax histories (models/fp8.py); else None

    @staticmethod
    def create(
        model: GPT,
        optimizer: optax.GradientTransformation,
        key: jax.Array,
        dtype: jnp.dtype = jnp.float32,
        knobs: StatsKnobs = StatsKnobs(),
        fp8: Fp8Recipe | None = None,
    ) -> TrainState:
        """`fp8`: FP8 matmuls, their scales set by this recipe (training/step/precision.py `fp8_recipe`)."""
        params = eqx.filter(model, eqx.is_array)
        return TrainState(
            step=jnp.zeros([], jnp.int32),
            model=model,
            opt_state=optimizer.init(params),
            key=key,
            loss_scale=LossScale.create(dtype),
            stats=init_stats(knobs, params),
            fp8=Fp8State.create(model.cfg.n_layer, fp8) if fp8 is not None else None,
        )


def place_state(
    model: GPT,
    optimizer: optax.GradientTransformation,
    key: jax.Array,
    mesh: Mesh,
    layout: str,
    dtype: jnp.dtype = jnp.float32,
    knobs: StatsKnobs = StatsKnobs(),
    fp8: Fp8Recipe | None = None,
) -> tuple[TrainState, TrainState]:
    """A fresh TrainState laid out on the mesh, and the shardings of its arrays (a TrainState of NamedShardings).

    The optimizer state is created under jit straight into its sharding, never first as one full copy per device; a
    model already made in that layout is taken as it is.
    """
    abstract = eqx.filter_eval_shape(TrainState.create, model, optimizer, key, dtype, knobs, fp8)
    shardings = state_shardings(abstract, mesh, layout)
    create = eqx.filter_jit(
        lambda m, k: eqx.filter_shard(TrainState.create(m, optimizer, k, dtype, knobs, fp8), shardings)
    )
    return create(model, key), shardings


def eval_model(state: TrainState) -> GPT:
    """The model to evaluate, sample and export: the train state's, or schedule-free's averaged weights
    (optimizers.eval_params)."""
    params = eqx.filter(state.model, eqx.is_array)
    evaluated = eval_params(state.opt_state, params)
    return state.model if evaluated is params else eqx.combine(evaluated, state.model)
