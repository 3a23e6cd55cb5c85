"""Training statistics, with trainit's knobs (`logging.*`). Each knob adds only the buffers its statistics need;
with every knob off the train state carries no statistics at all and the step computes none.

At step t, with x_t the parameters before the update, g_t = ∇f(x_t; b_t) the step's gradient (averaged over the
micro-batches, before clipping), Δ_t = x_{t+1} − x_t the update that was applied:

  log_callback_data    norms of g_t, x_t and Δ_t (global, and per transformer layer), and ⟨g_t, Δ_t⟩. No buffer.
  store_last_grads     keeps g_{t−1}: cos(g_t, g_{t−1}).                                   Buffer: one gradient.
  store_past_grads     keeps Σ_{s<t} g_s: cos(g_t, mean of all past gradients).            Buffer: one gradient.
  store_last_params    keeps x_{t−1}: ‖x_t − x_{t−1}‖ (the last step's length).           Buffer: one copy of x.
  compute_last_loss    f(x_t; b_t) − f(x_{t−1}; b_t): did the last update help on this batch? Needs
                       store_last_params; costs one forward pass per micro-batch.
  compute_last_grads   ‖g_t − ∇f(x_{t−1}; b_t)‖ and its ratio to ‖x_t − x_{t−1}‖ (a local smoothness estimate).
                       Needs store_last_params; costs one forward+backward pass per micro-batch.
  running_stats_window W > 0: the mean of each scalar statistic over the last W steps. Buffer: W x statistics.
  update_geometry      per parameter group, inner products, cosines and norms of g, x and Δ with running sums
                       (training/step/geometry.py). Buffer: x_{t−1} (the same one copy as store_last_params).

A statistic that needs a previous step is NaN at a run's first step. Skipped (non-finite) steps leave the buffers
as they were. The buffers live in `TrainState.stats`, so they checkpoint and resume with the rest of the state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from core.trees import tree_dot
from training.step.geometry import cosine, init_geometry, step_geometry
from training.step.precision import keep_if_finite

if TYPE_CHECKING:
    from models.gpt import GPT
    from training.config import LoggingConfig


@dataclass(frozen=True)
class StatsKnobs:
    log_callback_data: bool = False
    store_last_grads: bool = False
    store_past_grads: bool = False
    store_last_params: bool = False
    compute_last_loss: bool = False
    compute_last_grads: bool = False
    window: int = 0
    # update geometry (training/step/geometry.py): each parameter's path and its group; empty = off
    geometry_groups: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def from_cfg(logging_cfg: LoggingConfig, geometry_groups: tuple[tuple[str, str], ...] = ()) -> StatsKnobs:
        """`geometry_groups`: the parameter groups (optimizers.geometry_groups), used with logging.update_geometry."""
        c = logging_cfg
        return StatsKnobs(
            c.log_callback_data,
            c.store_last_grads,
            c.store_past_grads,
            c.store_last_params,
            c.compute_last_loss,
            c.compute_last_grads,
            c.running_stats_window,
            geometry_groups if c.update_geometry else (),
        )

    @property
    def any(self) -> bool:
        return any(
            (
                self.log_callback_data,
                self.store_last_grads,
                self.store_past_grads,
                self.store_last_params,
                self.compute_last_loss,
                self.compute_last_grads,
                bool(self.geometry_groups),
            )
        )

    def scalar_names(self) -> list[str]:
        """The scalar statistics these knobs produce, in a fixed order (the running window's columns)."""
        names = []
        if self.log_callback_data:
            names += ["param_norm", "update_norm", "grad_dot_update"]
        if self.store_last_grads:
            names.append("cos_last_grad")
        if self.store_past_grads:
            names.append("cos_past_grads")
        if self.store_last_params:
            names.append("last_step_norm")
        if self.compute_last_loss:
            names.append("loss_diff")
        if self.compute_last_grads:
            names += ["grad_diff_norm", "smoothness"]
        return names


def init_stats(knobs: StatsKnobs, params: optax.Params) -> dict | None:
    if not knobs.any:
        return None
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)  # noqa: E731
    stats: dict[str, chex.ArrayTree] = {"count": jnp.zeros([], jnp.int32)}  # steps that updated the buffers
    if knobs.store_last_grads:
        stats["last_grads"] = zeros()
    if knobs.store_past_grads:
        stats["past_grads_sum"] = zeros()
    if knobs.store_last_params or knobs.geometry_groups:
        stats["last_params"] = jax.tree.map(jnp.copy, params)  # x_{t−1}: x_0 itself before the first step
    if knobs.geometry_groups:
        stats["geometry"] = init_geometry(knobs.geometry_groups)
    if knobs.window > 0:
        stats["window"] = jnp.full((knobs.window, len(knobs.scalar_names())), jnp.nan, jnp.float32)
    return stats


def _norm(a: chex.ArrayTree) -> jax.Array:
    return jnp.sqrt(tree_dot(a, a))


def _cos(a: chex.ArrayTree, b: chex.ArrayTree) -> jax.Array:
    return cosine(tree_dot(a, b), tree_dot(a, a), tree_dot(b, b))


def _sub(a: chex.ArrayTree, b: chex.ArrayTree) -> chex.ArrayTree:
    return jax.tree.map(jnp.subtract, a, b)


def layer_norms(model_like: GPT) -> jax.Array:
    """[n_layer] norms of each transformer block's arrays (the stacked leading axis is the layer). `model_like`: a
    tree shaped like the model (its parameters, gradients or an update)."""
    squares = [
        jnp.sum(jnp.square(x.astype(jnp.float32)), axis=tuple(range(1, x.ndim)))
        for x in jax.tree.leaves(model_like.blocks)
    ]
    return jnp.sqrt(sum(squares))


def update_stats(
    knobs: StatsKnobs,
    stats: dict,
    params: optax.Params,
    new_params: optax.Params,
    grads: optax.Updates,
    loss: jax.Array,
    last_loss_and_grads: Callable[[optax.Params], tuple[jax.Array, optax.Updates | None]],
    finite: jax.Array,
) -> tuple[dict, dict[str, jax.Array]]:
    """(the new buffers, the step's statistics). `params`: x_t; `new_params`: x_{t+1}; `grads`: g_t; `loss`:
    f(x_t; b_t); `last_loss_and_grads(x)`: f(x; b_t) and (with compute_last_grads, else None) ∇f(x; b_t) on the
    step's batch."""
    first = stats["count"] == 0
    nan_if_first = lambda x: jnp.where(first, jnp.nan, x)  # noqa: E731
    out: dict[str, jax.Array] = {}
    new = dict(stats)
    if knobs.log_callback_data:
        out.update(_norms(params, new_params, grads))
    if knobs.store_last_grads:
        out["cos_last_grad"] = nan_if_first(_cos(grads, stats["last_grads"]))
        new["last_grads"] = grads
    if knobs.store_past_grads:
        out["cos_past_grads"] = nan_if_first(_cos(grads, stats["past_grads_sum"]))
        new["past_grads_sum"] = jax.tree.map(jnp.add, stats["past_grads_sum"], grads)
    if knobs.store_last_params:
        out.update(
            {
                name: nan_if_first(value)
                for name, value in _since_last_params(
                    knobs, stats["last_params"], params, grads, loss, last_loss_and_grads
                ).items()
            }
        )
    if knobs.geometry_groups:
        new["geometry"], geometry = step_geometry(
            stats["geometry"], stats["last_params"], params, new_params, grads, loss, first, knobs.geometry_groups
        )
        out.update(geometry)
    if "last_params" in stats:
        new["last_params"] = params
    if knobs.window > 0:
        new["window"], averages = _window(knobs, stats["window"], out)
        out.update(averages)
    new["count"] = stats["count"] + 1
    return keep_if_finite(finite, new, stats), out  # a skipped step leaves every buffer as it was


def _norms(params: optax.Params, new_params: optax.Params, grads: optax.Updates) -> dict[str, jax.Array]:
    """log_callback_data: global and per-layer norms of x_t, g_t and Δ_t, and ⟨g_t, Δ_t⟩."""
    update = _sub(new_params, params)
    return dict(
        param_norm=_norm(params),
        update_norm=_norm(update),
        grad_dot_update=tree_dot(grads, update),
        grad_norm_layers=layer_norms(grads),
        param_norm_layers=layer_norms(params),
        update_norm_layers=layer_norms(update),
    )


def _since_last_params(
    knobs: StatsKnobs,
    last: optax.Params,
    params: optax.Params,
    grads: optax.Updates,
    loss: jax.Array,
    last_loss_and_grads: Callable[[optax.Params], tuple[jax.Array, optax.Updates | None]],
) -> dict[str, jax.Array]:
    """store_last_params and what needs it: the last step's length, and (compute_last_loss / compute_last_grads)
    the loss and gradient differences on this step's batch, from the extra pass at x_{t−1}."""
    step_norm = _norm(_sub(params, last))
    out = {"last_step_norm": step_norm}
    if knobs.compute_last_loss or knobs.compute_last_grads:
        last_loss, last_grads = last_loss_and_grads(last)  # gradients only when compute_last_grads
        if knobs.compute_last_loss:
            out["loss_diff"] = loss - last_loss
        if knobs.compute_last_grads:
            diff = _norm(_sub(grads, last_grads))
            out["grad_diff_norm"] = diff
            out["smoothness"] = diff / jnp.maximum(step_norm, 1e-30)
    return out


def _window(knobs: StatsKnobs, window: jax.Array, out: dict[str, jax.Array]) -> tuple[jax.Array, dict]:
    """running_stats_window: this step's scalars pushed into the [W, statistics] window, and each one's mean over
    it (NaN entries, from before a full window or a first step, left out)."""
    row = jnp.stack([out[name].astype(jnp.float32) for name in knobs.scalar_names()])
    window = jnp.roll(window, 1, axis=0).at[0].set(row)
    averages = jnp.nanmean(window, axis=0)
    return window, {f"{name}_avg": averages[i] for i, name in enumerate(knobs.scalar_names())}


STEP_METRICS = (  # not statistics
    *("loss", "target_tokens", "lr", "z_loss", "grad_norm", "loss_scale", "skipped_steps", "applied"),
    *("fp8_clipped", "fp8_amax_over_range"),  # per kind of FP8 tensor, logged per interval (training/loop/session.py)
)


def statistics_of(metrics: dict) -> dict[str, float | None]:
    """The statistics among one step's fetched metrics, as log values: per-layer arrays become `name/<layer>`,
    NaN (no previous step yet) becomes None."""
    out: dict[str, float | None] = {}
    for name, value in metrics.items():
        if name in STEP_METRICS:
            continue
        values = [float(v) for v in np.ravel(np.asarray(value))]
        entries = {name: values[0]} if np.ndim(value) == 0 else {f"{name}/{i}": v for i, v in enumerate(values)}
        out.update({k: (v if v == v else None) for k, v in entries.items()})
    return out
