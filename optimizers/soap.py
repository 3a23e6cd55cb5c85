"""SOAP: Adam run in the eigenbasis of Shampoo's preconditioners.

Vyas, Morwani, Zhao, Shapira, Brandfonbrener, Janson, Kakade (2024), "SOAP: Improving and Stabilizing Shampoo
using Adam", arXiv:2409.11321; the reference code is github.com/nikhilvyas/SOAP (soap.py).

The rule, for each weight matrix G [m, n] (the paper's algorithm):
    G' = Q_L^T G Q_R;  M <- b1 M + (1 - b1) G;  M' = Q_L^T M Q_R;  V <- b2 V + (1 - b2) G'^2
    W <- W - lr * sqrt(1 - b2^t) / (1 - b1^t) * Q_L (M' / (sqrt(V) + eps)) Q_R^T - lr * wd * W
    then L <- s L + (1 - s) G G^T, R <- s R + (1 - s) G^T G (s = shampoo_beta, -1 = b2), and every
    precondition_frequency steps Q_L, Q_R <- QR(L Q_L), QR(R Q_R) (one power iteration), V re-ordered with them.

Choices, each as the reference code makes them:
- The first call only builds L, R from its gradient and takes their eigenvectors (eigh); it moves nothing, so the
  projection never uses the gradient it rotates (t counts the steps after it).
- Before each QR refresh the columns of Q (and V's coordinates) are sorted by the estimated eigenvalues
  diag(Q^T L Q), largest first.
- eps is added to sqrt(V) before the bias corrections (they are folded into the step size).
- M lives in the parameters' space and is rotated each step (as the paper writes it; the reference rotates it back
  and forth around each refresh, the same up to rounding).
- Matrices: each layer of a stacked [L, in, *out] block weight as one [in, out] matrix (qkv [D, 3D], nanoGPT's
  c_attn), wte and wpe whole, each value-embedding table [V, D] as one. A side longer than max_precond_dim gets no
  preconditioner (identity; wte's vocabulary side with the paper's 10000), vectors (LayerNorm, biases) get Adam with
  the same conventions.
- Weight decay is decoupled, on the decayed matrices only (optimizers/decay.py), from the step's starting weights
  (the reference decays the weights after the step: a difference of lr^2 * wd * the update).
- The rotations run at the highest matmul precision (no TF32), as the reference's float32 does.
On CPU, jaxlib's eigh and QR call OpenBLAS, whose own threads can fight XLA's for the cores: on a busy 2-core
machine a 320 x 320 QR took 1.3 s with OpenBLAS's default threads and 3 ms with OPENBLAS_NUM_THREADS=1 (set before
Python starts); a GPU does them with cuSOLVER.

The pipeline's lr is the paper's learning rate (the reference recommends 3e-3 with betas 0.95, 0.95).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError
from optimizers.matrices import HIGHEST, matrices_shape, per_matrix
from optimizers.param_roles import Role, map_roles, roles_of
from optimizers.registry import register
from optimizers.reporting import reads


class Layout:
    """How a tensor is preconditioned: as a batch of matrices [B, m, n], with a left and/or right preconditioner,
    or not at all (a vector: Adam)."""

    def __init__(self, role: Role, shape: tuple[int, ...], max_precond_dim: int):
        self.matrix = role.is_matrix
        self.stacked = role.stacked
        if self.matrix:
            _, m, n = matrices_shape(shape, self.stacked)
            self.left, self.right = m <= max_precond_dim, n <= max_precond_dim
        else:
            self.left = self.right = False

    def view(self, x: jax.Array) -> jax.Array:
        return x.reshape(matrices_shape(x.shape, self.stacked))

    def rotate(self, x: jax.Array, q_left: jax.Array | None, q_right: jax.Array | None) -> jax.Array:
        """Q_L^T X Q_R."""
        if self.left:
            x = jnp.einsum("bmi,bmn->bin", q_left, x, precision=HIGHEST)
        if self.right:
            x = jnp.einsum("bmn,bnj->bmj", x, q_right, precision=HIGHEST)
        return x

    def rotate_back(self, x: jax.Array, q_left: jax.Array | None, q_right: jax.Array | None) -> jax.Array:
        """Q_L X Q_R^T."""
        if self.left:
            x = jnp.einsum("bmi,bin->bmn", q_left, x, precision=HIGHEST)
        if self.right:
            x = jnp.einsum("bmj,bnj->bmn", x, q_right, precision=HIGHEST)
        return x

    def grams(self, g: jax.Array) -> tuple[jax.Array | None, jax.Array | None]:
        """G G^T and G^T G of each matrix (None for a side without a preconditioner)."""
        left = jnp.einsum("bmn,bkn->bmk", g, g, precision=HIGHEST) if self.left else None
        right = jnp.einsum("bmn,bmk->bnk", g, g, precision=HIGHEST) if self.right else None
        return left, right


def wide(dtype: jnp.dtype) -> jnp.dtype:
    """The precision SOAP computes in for parameters of `dtype`: float32, or the parameters' own if wider (float64
    runs the whole rule in float64, as tests/test_optimizers_research.py checks it against the paper's)."""
    return jnp.promote_types(dtype, jnp.float32)


def eigenbasis(gg: jax.Array | None) -> jax.Array | None:
    """The eigenvectors of each symmetric matrix, as columns, largest eigenvalue first."""
    return None if gg is None else per_matrix(lambda m: jnp.linalg.eigh(m)[1][..., ::-1], gg)


def refreshed(
    gg: jax.Array | None, q: jax.Array | None, nu: jax.Array, axis: int
) -> tuple[jax.Array | None, jax.Array]:
    """One power iteration and a QR from the current basis, its columns (and nu's coordinates along `axis`, 1 = rows,
    2 = columns of [B, m, n]) first sorted by the estimated eigenvalues diag(Q^T GG Q), largest first."""
    if gg is None:
        return q, nu
    estimated = jnp.einsum("bji,bjk,bki->bi", q, gg, q, precision=HIGHEST)
    order = jnp.argsort(estimated, axis=-1, descending=True, stable=True)
    q = jnp.take_along_axis(q, order[:, None, :], axis=2)
    nu = jnp.take_along_axis(nu, order[:, :, None] if axis == 1 else order[:, None, :], axis=axis)
    q = per_matrix(lambda m: jnp.linalg.qr(m)[0], jnp.einsum("bij,bjk->bik", gg, q, precision=HIGHEST))
    return q, nu


class SoapState(NamedTuple):
    count: jax.Array  # calls so far; the first only builds the preconditioners, so Adam's step t = count
    mu: optax.Updates  # first moment, in the parameters' own space
    nu: optax.Updates  # second moment, in the eigenbasis (per entry for vectors)
    gg_left: chex.ArrayTree  # [B, m, m] moving average of G G^T (None: a vector, or a side over max_precond_dim)
    gg_right: chex.ArrayTree  # [B, n, n] moving average of G^T G
    q_left: chex.ArrayTree  # [B, m, m] eigenbasis of gg_left
    q_right: chex.ArrayTree  # [B, n, n] eigenbasis of gg_right


def soap_direction(
    roles: dict[str, Role],
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    precondition_frequency: int,
    max_precond_dim: int,
    shampoo_beta: float,
) -> optax.GradientTransformation:
    """The whole step for a unit lr, weight decay included, already negated. The first call moves nothing (weight
    decay included), as in the reference."""
    s = beta2 if shampoo_beta < 0 else shampoo_beta

    def each(f: Callable, tree: chex.ArrayTree, *rest: chex.ArrayTree) -> chex.ArrayTree:
        """f(layout, role, leaf, *the other trees' leaves or subtrees there) over the leaves of `tree`."""
        return map_roles(lambda role, x, *r: f(Layout(role, x.shape, max_precond_dim), role, x, *r), roles, tree, *rest)

    def pick(tree: chex.ArrayTree, pairs: chex.ArrayTree, i: int) -> chex.ArrayTree:
        """The i-th of the tuples `pairs` holds at each leaf of `tree`."""
        return jax.tree.map(lambda _, pair: pair[i], tree, pairs)

    def init(params):
        def zeros(lay, role, p, side):
            b, m, n = matrices_shape(p.shape, lay.stacked)
            present, size = (lay.left, m) if side == "left" else (lay.right, n)
            return jnp.zeros((b, size, size), wide(p.dtype)) if lay.matrix and present else None

        gl = each(lambda lay, role, p: zeros(lay, role, p, "left"), params)
        gr = each(lambda lay, role, p: zeros(lay, role, p, "right"), params)

        def moment():
            return jax.tree.map(lambda p: jnp.zeros(p.shape, wide(p.dtype)), params)

        return SoapState(jnp.zeros([], jnp.int32), moment(), moment(), gl, gr, gl, gr)

    def grams(lay, role, g):
        return lay.grams(lay.view(g.astype(wide(g.dtype)))) if lay.matrix else (None, None)

    def first_call(updates, state, params):
        """L, R from the first gradient and their eigenbases; no step."""
        pairs = each(grams, updates)
        gl = jax.tree.map(lambda _, x: None if x is None else (1 - s) * x, updates, pick(updates, pairs, 0))
        gr = jax.tree.map(lambda _, x: None if x is None else (1 - s) * x, updates, pick(updates, pairs, 1))
        ql = jax.tree.map(lambda _, x: eigenbasis(x), updates, gl)
        qr = jax.tree.map(lambda _, x: eigenbasis(x), updates, gr)
        return jax.tree.map(jnp.zeros_like, updates), SoapState(state.count + 1, state.mu, state.nu, gl, gr, ql, qr)

    def step(updates, state, params):
        t = state.count  # Adam's step: the first call took none
        mu = optax.tree.update_moment(updates, state.mu, beta1, 1)
        step_size = jnp.sqrt(1 - beta2**t) / (1 - beta1**t)

        def adam(lay, role, g, m, v, ql, qr, p):
            g = g.astype(wide(g.dtype))
            if lay.matrix:
                g_rot, m_rot = lay.rotate(lay.view(g), ql, qr), lay.rotate(lay.view(m), ql, qr)
                v = beta2 * v + (1 - beta2) * jnp.square(g_rot).reshape(v.shape)
                n = lay.rotate_back(m_rot / (jnp.sqrt(lay.view(v)) + eps), ql, qr).reshape(g.shape)
            else:
                v = beta2 * v + (1 - beta2) * jnp.square(g)
                n = m / (jnp.sqrt(v) + eps)
            decay = weight_decay * p.astype(wide(p.dtype)) if role.decayed and weight_decay > 0 else 0.0
            return -(step_size * n + decay), v

        out = each(adam, updates, mu, state.nu, state.q_left, state.q_right, params)
        directions = jax.tree.map(lambda g, o: o[0].astype(g.dtype), updates, out)
        nu = pick(updates, out, 1)

        def moving_average(lay, role, g, old_left, old_right):
            left, right = grams(lay, role, g)
            return (
                None if left is None else s * old_left + (1 - s) * left,
                None if right is None else s * old_right + (1 - s) * right,
            )

        pairs = each(moving_average, updates, state.gg_left, state.gg_right)
        gl, gr = pick(updates, pairs, 0), pick(updates, pairs, 1)

        def refresh(bases):
            def one(lay, role, g, gl, gr, ql, qr, v):
                if not lay.matrix:
                    return ql, qr, v
                v3 = lay.view(v)
                ql, v3 = refreshed(gl, ql, v3, 1)
                qr, v3 = refreshed(gr, qr, v3, 2)
                return ql, qr, v3.reshape(v.shape)

            out = each(one, updates, gl, gr, *bases)
            return tuple(pick(updates, out, i) for i in range(3))

        ql, qr, nu = jax.lax.cond(
            t % precondition_frequency == 0, refresh, lambda bases: bases, (state.q_left, state.q_right, nu)
        )
        return directions, SoapState(state.count + 1, mu, nu, gl, gr, ql, qr)

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("soap needs the parameters (for its weight decay)")
        return jax.lax.cond(state.count == 0, first_call, step, updates, state, params)

    return optax.GradientTransformation(init, update)


@register("soap")
def soap(
    model,
    *,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    precondition_frequency: int,
    max_precond_dim: int,
    shampoo_beta: float,
) -> optax.GradientTransformation:
    if precondition_frequency < 1:
        raise ConfigError(f"config: optimizer.precondition_frequency: must be >= 1; got {precondition_frequency}")
    if max_precond_dim < 1:
        raise ConfigError(f"config: optimizer.max_precond_dim: must be >= 1; got {max_precond_dim}")
    if not (shampoo_beta < 0 or 0 <= shampoo_beta < 1):
        raise ConfigError(
            f"config: optimizer.shampoo_beta: must be in [0, 1), or negative for beta2; got {shampoo_beta}"
        )
    return soap_direction(
        roles_of(model), beta1, beta2, eps, weight_decay, precondition_frequency, max_precond_dim, shampoo_beta
    )


@reads(SoapState)
def _condition(state: SoapState) -> dict[str, jax.Array]:
    """The preconditioners' condition estimate: over every matrix and side, the largest ratio of the moving average
    G G^T's (G^T G's) Rayleigh quotients along its eigenbasis (its eigenvalues at the last refresh), largest over
    smallest, on its range (quotients under 1e-6 of the largest are its null space: a matrix wider than the steps
    seen so far is rank-deficient, and SOAP's eps handles those directions)."""
    ratios = []
    for gg, q in ((state.gg_left, state.q_left), (state.gg_right, state.q_right)):
        for g_, q_ in zip(jax.tree.leaves(gg), jax.tree.leaves(q)):
            eigen = jnp.einsum("bmi,bmk,bki->bi", q_, g_, q_)
            largest = jnp.max(eigen, -1, keepdims=True)
            smallest = jnp.min(jnp.where(eigen > 1e-6 * largest, eigen, jnp.inf), -1, keepdims=True)
            ratios.append(jnp.max(largest / jnp.maximum(smallest, 1e-30)))
    return {"soap_condition": jnp.max(jnp.stack(ratios)) if ratios else jnp.zeros([], jnp.float32)}
