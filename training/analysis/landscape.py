"""Loss landscapes: the loss on a line or a plane of parameter space through a checkpoint, and where the run's other
checkpoints lie on it (scripts/tools/landscape.py draws them).

Directions are parameter pytrees shaped like the model's arrays:

  filter_normalised     random, then each filter scaled to the norm of the weights' filter (Li et al. 2018,
                        "Visualizing the loss landscape of neural nets"), so a step of 1 moves every filter by its own
                        size whatever the layer's scale. A filter is what one output unit owns: for a linear layer
                        ([in, *out], stacked per layer in `blocks`) the weights into one output, for an embedding
                        ([rows, D]: tokens, which are also the tied LM head's outputs, positions, each value-embedding
                        table) one row. Vectors (what the model labels a bias, a norm or a scalar gate, whatever their
                        rank) get 0, Li et al.'s default, or (`include_vectors`) their own norm, per layer.
  difference            one parameter pytree minus another: toward a checkpoint, or the last update.
  principal             the top singular directions of the checkpoints' offsets from the centre (Li et al. §7: random
                        directions in millions of dimensions are nearly orthogonal to any trajectory).

Checkpoints are placed on the plane by least squares: c = argmin |(theta_i - theta_centre) - D c| with D the
directions as columns; the residual says how much of the offset lies off the plane.
"""

from __future__ import annotations

import functools

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from models.block import Linear
from models.gpt import GPT
from training.step.losses import token_losses

Params = chex.ArrayTree  # a pytree of the model's arrays (eqx.filter(model, eqx.is_array))


def params_of(model: GPT) -> Params:
    return eqx.filter(model, eqx.is_array)


def dot(a: Params, b: Params) -> float:
    """<a, b> over every array, accumulated in float64 on the host."""
    return float(
        sum(
            np.vdot(np.asarray(x, np.float64), np.asarray(y, np.float64))
            for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
        )
    )


@jax.jit
def combine(coefficients: list[float], trees: list[Params]) -> Params:
    """sum_i c_i * tree_i."""
    return jax.tree.map(lambda *xs: sum(c * x for c, x in zip(coefficients, xs)), *trees)


@jax.jit
def difference(a: Params, b: Params) -> Params:
    return jax.tree.map(jnp.subtract, a, b)


def filter_norm_axes(model: GPT) -> Params:
    """For every array of `model`, the axes a filter's norm runs over (a tuple), or None for a vector: what the model
    labels a bias, a norm or a scalar (`GPT.parameter_labels`; QKV's bias is [layer, 3, D], the gates [2k, K, G],
    whatever their rank). A leading stack axis is never reduced: the blocks' layer axis, the value embeddings' table
    axis (each of the k tables is [V, D], its filters rows)."""
    labels = labels_by_path(model)

    def axes(path: tuple, x: jax.Array) -> tuple[int, ...] | None:
        names = [key.name for key in path if isinstance(key, jax.tree_util.GetAttrKey)]
        if labels[tuple(names)] in ("bias", "norm", "scalar"):
            return None
        stacked = 1 if names[:1] == ["blocks"] or names == ["value_embeds"] else 0
        owner = functools.reduce(getattr, names[:-1], model)
        if isinstance(owner, Linear) and names[-1] == "weight":
            return (stacked,)  # [in, *out]: one filter per output unit
        return tuple(range(stacked + 1, x.ndim))  # [rows, ...]: one filter per row

    return jax.tree_util.tree_map_with_path(axes, params_of(model))


def labels_by_path(model: GPT) -> dict[tuple[str, ...], str]:
    """Each array's attribute path -> its label for the optimizer's groups (models/gpt.py `parameter_labels`)."""
    labels = eqx.filter(model.parameter_labels(), jax.tree.map(eqx.is_array, model))
    return {
        tuple(key.name for key in path if isinstance(key, jax.tree_util.GetAttrKey)): label
        for path, label in jax.tree_util.tree_leaves_with_path(labels)
    }


def filter_normalised(model: GPT, key: jax.Array, include_vectors: bool = False) -> Params:
    """A random direction, each filter scaled to the norm of the same filter of the model's weights."""
    leaves, treedef = jax.tree.flatten(params_of(model))
    axes = tuple(treedef.flatten_up_to(filter_norm_axes(model)))
    return treedef.unflatten(_filter_normalised(leaves, key, axes, include_vectors))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _filter_normalised(leaves: list[jax.Array], key: jax.Array, axes: tuple, include_vectors: bool) -> list[jax.Array]:
    out = []
    for k, w, ax in zip(jax.random.split(key, len(leaves)), leaves, axes):
        d = jax.random.normal(k, w.shape, jnp.float32)
        if ax is None:
            if not include_vectors:
                out.append(jnp.zeros_like(d))
                continue
            ax = tuple(range(1 if w.ndim > 1 else 0, w.ndim))  # a stacked vector: one per layer
        w_norm = jnp.sqrt(jnp.sum(jnp.square(w.astype(jnp.float32)), axis=ax, keepdims=True))
        d_norm = jnp.sqrt(jnp.sum(jnp.square(d), axis=ax, keepdims=True))
        out.append(d * w_norm / jnp.maximum(d_norm, 1e-12))
    return out


def orthogonal_to(direction: Params, against: Params, norm: float) -> Params:
    """`direction` minus its component along `against`, scaled to `norm` (axes in the same units as `against`)."""
    d = combine([1.0, -dot(direction, against) / dot(against, against)], [direction, against])
    return combine([norm / np.sqrt(dot(d, d))], [d])


def principal_directions(offsets: list[Params], k: int) -> list[Params]:
    """The top `k` right singular vectors (unit norm) of the matrix whose rows are `offsets` (uncentred), from the
    offsets' Gram matrix: never a parameters x checkpoints array on the host."""
    if len(offsets) < k:
        raise ValueError(
            f"{k} principal directions need at least {k} checkpoints besides the centre; there are {len(offsets)}"
        )
    gram = np.array([[dot(a, b) for b in offsets] for a in offsets])
    values, vectors = np.linalg.eigh(gram)
    top = np.argsort(values)[::-1][:k]
    return [combine(list(vectors[:, j] / np.sqrt(max(values[j], 1e-30))), offsets) for j in top]


def project(offset: Params, directions: list[Params]) -> tuple[np.ndarray, float]:
    """Least-squares coordinates of `offset` on the span of `directions`, and the residual's share of |offset|."""
    gram = np.array([[dot(a, b) for b in directions] for a in directions])
    rhs = np.array([dot(d, offset) for d in directions])
    coords = np.linalg.solve(gram, rhs)
    residual = dot(offset, offset) - rhs @ coords  # |offset|^2 - |its projection|^2
    return coords, float(np.sqrt(max(residual, 0.0) / max(dot(offset, offset), 1e-30)))


def loss_surface(model: GPT, directions: list[Params], points: np.ndarray, batches: list[dict]) -> np.ndarray:
    """The evaluation loss (masked mean over the target tokens of all `batches`, float32, no dropout) at
    `model + sum_j points[i, j] * directions[j]` for every row i of `points`. One compilation; every point is
    dispatched before any result is fetched."""
    params, static = eqx.partition(model, eqx.is_array)

    @eqx.filter_jit
    def sums(params, directions, coefficients, batch):
        moved = jax.tree.map(lambda p, *ds: p + sum(c * d for c, d in zip(coefficients, ds)), params, *directions)
        return token_losses(eqx.combine(moved, static), batch, None, jnp.float32)

    batches = [jax.tree.map(jnp.asarray, b) for b in batches]
    points = np.asarray(points, np.float32)
    pending = [[sums(params, directions, row, b) for b in batches] for row in points]
    fetched = jax.device_get(pending)
    return np.array([sum(float(s[0]) for s in row) / max(sum(float(s[1]) for s in row), 1.0) for row in fetched])
