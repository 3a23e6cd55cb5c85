"""Update geometry, every step (`logging.update_geometry`): how the optimizer moves, in the quantities of the
online-to-nonconvex analysis (Cutkosky, Mehta, Orabona 2023) that trainit logs.

At step n, with x_n the parameters before the update, g_n = ∇f(x_n; b_n) the step's gradient (averaged over the
micro-batches, before clipping), Δ_{n+1} = x_{n+1} − x_n the update this step applies and Δ_n = x_n − x_{n−1} the one
before it, for each parameter group (the optimizer's groups, `rest` for the parameters of none, and `model`, all of
them), logged as `geometry/<group>/<name>`:

  grad_dot_last_update   ⟨g_n, Δ_n⟩           and grad_dot_last_update_sum, its sum over every step so far
  grad_dot_update        ⟨g_n, Δ_{n+1}⟩       and grad_dot_update_sum
  cos_grad_last_update   cos(g_n, Δ_n)
  cos_update_last_update cos(Δ_{n+1}, Δ_n)
  cos_params_last_params cos(x_n, x_{n−1})
  {params,grads,update}_{l2,l1,linf}   the norms of x_n, g_n and Δ_{n+1}
and for the whole model `geometry/loss_change` = f(x_n; b_n) − f(x_{n−1}; b_{n−1}) (each on its own step's batch: not
`loss_diff`, which compares both points on this step's batch) and its sum.

The sums live in the train state (`TrainState.stats["geometry"]`), so what is logged at any step is exact whatever
the log interval, and they checkpoint and resume with the rest. Δ_n is x_n − x_{n−1}, from the statistics' one copy
of the last parameters (`TrainState.stats["last_params"]`, shared with `store_last_params`); the geometry's own
buffers are the last loss and the sums. At a run's first step the quantities that need a previous step are NaN and
add 0 to the sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from core.trees import path_names

MODEL = "model"  # the group of every parameter
REST = "rest"  # the parameters of no optimizer group
SUMMED = ("grad_dot_last_update", "grad_dot_update")


def group_names(assignment: tuple[tuple[str, str], ...]) -> list[str]:
    """The groups reported: each group a parameter is in (in order), then `model` (once, also when every parameter is
    in it: no optimizer groups)."""
    return list(dict.fromkeys([*(group for _, group in assignment), MODEL]))


def init_geometry(assignment: tuple[tuple[str, str], ...]) -> dict:
    zero = jnp.zeros([], jnp.float32)
    return {
        "last_loss": zero,
        "sums": {group: {name: zero for name in SUMMED} for group in group_names(assignment)},
        "loss_change_sum": zero,
    }


def _leaf_terms(x: jax.Array, g: jax.Array, u: jax.Array, last_u: jax.Array) -> dict[str, jax.Array]:
    """One parameter's contributions: inner products and squared norms (summed over a group), l1 (summed), linf
    (maximum)."""
    x, g, u = x.astype(jnp.float32), g.astype(jnp.float32), u.astype(jnp.float32)
    x_last = x - last_u
    dot = lambda a, b: jnp.vdot(a, b)  # noqa: E731
    return {
        "g.lu": dot(g, last_u),
        "g.u": dot(g, u),
        "u.lu": dot(u, last_u),
        "x.xl": dot(x, x_last),
        "g.g": dot(g, g),
        "u.u": dot(u, u),
        "lu.lu": dot(last_u, last_u),
        "x.x": dot(x, x),
        "xl.xl": dot(x_last, x_last),
        "x1": jnp.sum(jnp.abs(x)),
        "g1": jnp.sum(jnp.abs(g)),
        "u1": jnp.sum(jnp.abs(u)),
        "xinf": jnp.max(jnp.abs(x), initial=0.0),
        "ginf": jnp.max(jnp.abs(g), initial=0.0),
        "uinf": jnp.max(jnp.abs(u), initial=0.0),
    }


def cosine(dot: jax.Array, a_squared: jax.Array, b_squared: jax.Array) -> jax.Array:
    """cos(a, b) from ⟨a, b⟩, ‖a‖² and ‖b‖² (0 where either is 0)."""
    return dot / jnp.maximum(jnp.sqrt(a_squared) * jnp.sqrt(b_squared), 1e-30)


def step_geometry(
    buffers: dict,
    last_params: optax.Params,
    params: optax.Params,
    new_params: optax.Params,
    grads: optax.Updates,
    loss: jax.Array,
    first: jax.Array,
    assignment: tuple[tuple[str, str], ...],
) -> tuple[dict, dict[str, jax.Array]]:
    """(the new buffers, this step's `geometry/...` metrics). `last_params`: x_{n−1} (x_n itself at the first step);
    `params`: x_n; `new_params`: x_{n+1}; `grads`: g_n; `loss`: f(x_n; b_n); `first`: no step before this one."""
    with jax.named_scope("update_geometry"):
        difference = lambda new, old: new.astype(jnp.float32) - old.astype(jnp.float32)  # noqa: E731
        update = jax.tree.map(difference, new_params, params)
        last_update = jax.tree.map(difference, params, last_params)
        group_of = dict(assignment)
        terms = {
            name: _leaf_terms(x, g, u, lu)
            for name, x, g, u, lu in zip(
                path_names(params),
                jax.tree.leaves(params),
                jax.tree.leaves(grads),
                jax.tree.leaves(update),
                jax.tree.leaves(last_update),
                strict=True,
            )
        }
        nan_if_first = lambda v: jnp.where(first, jnp.nan, v)  # noqa: E731
        metrics: dict[str, jax.Array] = {}
        sums = {}
        for group in group_names(assignment):
            members = [t for name, t in terms.items() if group == MODEL or group_of[name] == group]
            total = {k: sum(t[k] for t in members) for k in members[0] if not k.endswith("inf")}
            total |= {k: jnp.max(jnp.stack([t[k] for t in members])) for k in members[0] if k.endswith("inf")}
            values = {
                "grad_dot_last_update": nan_if_first(total["g.lu"]),
                "grad_dot_update": total["g.u"],
                "cos_grad_last_update": nan_if_first(cosine(total["g.lu"], total["g.g"], total["lu.lu"])),
                "cos_update_last_update": nan_if_first(cosine(total["u.lu"], total["u.u"], total["lu.lu"])),
                "cos_params_last_params": nan_if_first(cosine(total["x.xl"], total["x.x"], total["xl.xl"])),
                "params_l2": jnp.sqrt(total["x.x"]),
                "params_l1": total["x1"],
                "params_linf": total["xinf"],
                "grads_l2": jnp.sqrt(total["g.g"]),
                "grads_l1": total["g1"],
                "grads_linf": total["ginf"],
                "update_l2": jnp.sqrt(total["u.u"]),
                "update_l1": total["u1"],
                "update_linf": total["uinf"],
            }
            # Δ_n is 0 at the first step, so its inner products add exactly 0 there
            sums[group] = {
                "grad_dot_last_update": buffers["sums"][group]["grad_dot_last_update"] + total["g.lu"],
                "grad_dot_update": buffers["sums"][group]["grad_dot_update"] + total["g.u"],
            }
            metrics |= {f"geometry/{group}/{k}": v for k, v in values.items()}
            metrics |= {f"geometry/{group}/{k}_sum": v for k, v in sums[group].items()}
        loss = loss.astype(jnp.float32)
        loss_change = loss - buffers["last_loss"]
        loss_change_sum = buffers["loss_change_sum"] + jnp.where(first, 0.0, loss_change)
        metrics |= {"geometry/loss_change": nan_if_first(loss_change), "geometry/loss_change_sum": loss_change_sum}
        new = {"last_loss": loss, "sums": sums, "loss_change_sum": loss_change_sum}
    return new, metrics
