"""Kron: PSGD (preconditioned SGD) with a Kronecker-factored preconditioner fitted by gradient whitening.

Li (2015, 2018), "Preconditioned Stochastic Gradient Descent", arXiv:1512.04202, and "Stochastic Hessian Fitting on
Lie Group", arXiv:2402.11858; the form the 2025 optimizer benchmarks ran (Wen et al., levanter/Marin) is
psgd-jax's `kron` (github.com/evanatyourservice/psgd_jax), which does not install beside this project's optax.

The rule, for each weight matrix [m, n] (each layer's matrix of a stacked block weight, each value-embedding table;
vectors as [1, n]):
    M <- b1 M + (1 - b1) G;  M^ = M / (1 - b1^t)                                  momentum, debiased
    preconditioner P = (Q_l^T Q_l) (x) (Q_r^T Q_r), Q_l [m, m] and Q_r [n, n] upper triangular, or diagonal for a
    side longer than max_size_triangular (the vocabulary) or any side of a vector; a side of size 1 has none
    with probability p_t, refit the Q's to whiten H = M^ + sqrt(eps32) mean|M^| Z (Z ~ N(0, 1), damping):
        A = Q_l H Q_r^T,  B = Q_l^{-T} V Q_r^{-1}  (V ~ N(0, 1))
        Q_l <- Q_l - precond_lr / ||A A^T + B B^T||_lb * triu(A A^T - B B^T) Q_l     (triangular side)
        q_l <- q_l - precond_lr / max|a + b| * (a - b) * q_l,  a = rowsums(A^2), b = rowsums(B^2)   (diagonal side)
        and Q_r alike with A^T A, B^T B; ||.||_lb a lower bound of the spectral norm (one power step from the
        largest row); then the two sides rescaled to equal largest entries (P unchanged)
    D = Q_l^T Q_l M^ Q_r^T Q_r, scaled down to RMS 1.1 where larger (a trust region)
    W <- W - lr * (D + weight_decay * W)   (decoupled, on the decayed matrices; optimizers/decay.py's mask)

Choices, as psgd-jax's kron makes them: the preconditioner fits the debiased momentum
(`momentum_into_precond=false`: the gradient); A and B come from the old Q's, every side updated from them at once;
p_t = clip(exp(-0.001 (t - 500)), 0.03, 1) (a refit every step for 500 steps, then ever rarer, a floor of 3%), or a
fixed `precond_update_probability`; the draws come from a key in the optimizer's state, so a resumed run draws the
same. Choices of this file: Q starts at the identity times (mean G^4)^(-1/8) of the first gradient (`precond_init_
scale` 0; any other value: that scale), split over the sides, so that P starts at about 1/|G|, the scale whitening
reaches, instead of climbing there at precond_lr per step; the sides are rebalanced after every refit.
The pipeline's lr is the step size of D (psgd-jax's default 1e-3 for Adam-like RMS).
"""

from __future__ import annotations

import math
import zlib
from typing import NamedTuple

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError
from core.trees import path_names
from optimizers.matrices import HIGHEST, matrices_shape, per_matrix
from optimizers.param_roles import Role, map_roles, roles_of
from optimizers.registry import register
from optimizers.reporting import reads

DAMPING = math.sqrt(float(jnp.finfo(jnp.float32).eps))  # the noise added to the fitted H, relative to mean|H|
MAX_RMS = 1.1  # the trust region: D's RMS per matrix


def update_probability(count: jax.Array) -> jax.Array:
    """psgd-jax's schedule: 1 for the first 500 steps, then exp(-0.001 (t - 500)), never below 0.03."""
    return jnp.clip(jnp.exp(-0.001 * (count.astype(jnp.float32) - 500.0)), 0.03, 1.0)


def as_matrices(x: jax.Array, role: Role) -> jax.Array:
    """[B, m, n]: each layer's matrix of a stacked block weight ([L, in, *out]), a matrix [in, *out] as one, a
    vector as [B, 1, n] (B = layers when stacked)."""
    if role.is_matrix:
        return x.reshape(matrices_shape(x.shape, role.stacked))
    batch = x.shape[0] if role.stacked and x.ndim > 1 else 1
    return x.reshape(batch, 1, x.size // batch)


def side_kind(size: int, max_size_triangular: int, is_matrix: bool) -> str | None:
    if size == 1:
        return None
    return "tri" if is_matrix and size <= max_size_triangular else "diag"


class Side(eqx.Module):
    """One side's factor Q: `tri` [B, s, s] upper triangular, `diag` [B, s], or none (q is None). The kind is static,
    so a list of sides passes through lax.cond as it is."""

    kind: str | None = eqx.field(static=True)
    q: jax.Array | None

    # Q X (left) / X Q^T (right), and Q^T X / X Q, for X [B, m, n]
    def apply(self, x: jax.Array, left: bool, transpose: bool = False) -> jax.Array:
        if self.kind is None:
            return x
        if self.kind == "diag":
            return x * (self.q[:, :, None] if left else self.q[:, None, :])
        if left:
            return jnp.einsum("bji,bjn->bin" if transpose else "bij,bjn->bin", self.q, x, precision=HIGHEST)
        return jnp.einsum("bmj,bjn->bmn" if transpose else "bmj,bnj->bmn", x, self.q, precision=HIGHEST)

    # Q^{-T} X (left) / X Q^{-1} (right)
    def solve(self, x: jax.Array, left: bool) -> jax.Array:
        if self.kind is None:
            return x
        if self.kind == "diag":
            return x / (self.q[:, :, None] if left else self.q[:, None, :])
        # one matrix per call on CPU, where jaxlib's batched kernels can deadlock XLA's thread pool
        return per_matrix(
            lambda q, y: jax.lax.linalg.triangular_solve(q, y, left_side=left, lower=False, transpose_a=left), self.q, x
        )

    def refit(self, a: jax.Array, b: jax.Array, left: bool, precond_lr: float) -> Side:
        """One whitening step of this side from A = Q_l H Q_r^T and B = Q_l^{-T} V Q_r^{-1}."""
        if self.kind is None:
            return self
        if self.kind == "diag":
            axis = 2 if left else 1
            ta, tb = jnp.sum(a * a, axis=axis), jnp.sum(b * b, axis=axis)
            scale = jnp.max(jnp.abs(ta + tb), axis=-1, keepdims=True)
            return Side("diag", self.q - precond_lr * safe_divide(ta - tb, scale) * self.q)
        gram = "bmn,bkn->bmk" if left else "bmn,bmk->bnk"
        ta = jnp.einsum(gram, a, a, precision=HIGHEST)
        tb = jnp.einsum(gram, b, b, precision=HIGHEST)
        scale = norm_lower_bound(ta + tb)[:, None, None]
        step = jnp.einsum("bij,bjk->bik", jnp.triu(ta - tb), self.q, precision=HIGHEST)
        return Side("tri", self.q - precond_lr * safe_divide(step, scale))

    def largest(self) -> jax.Array:
        """max|Q| per matrix, [B]."""
        return jnp.max(jnp.abs(self.q), axis=tuple(range(1, self.q.ndim)))

    def scaled(self, c: jax.Array) -> Side:
        return Side(self.kind, self.q * c.reshape((-1,) + (1,) * (self.q.ndim - 1)))


def safe_divide(x: jax.Array, d: jax.Array) -> jax.Array:
    """x / d, and 0 where d is 0 (a zero gradient: nothing to fit)."""
    return jnp.where(d > 0, x / jnp.where(d > 0, d, 1.0), 0.0)


def norm_lower_bound(a: jax.Array) -> jax.Array:
    """A lower bound of the spectral norm of each symmetric [s, s] matrix of a [B, s, s]: one power step from its
    largest row, ||a x|| with x = a r / ||a r||, computed on a / max|a| (psgd-jax's estimate)."""
    top = jnp.max(jnp.abs(a), axis=(1, 2))
    a = a / jnp.where(top > 0, top, 1.0)[:, None, None]
    row = jnp.take_along_axis(a, jnp.argmax(jnp.sum(a * a, axis=2), axis=1)[:, None, None], axis=1)[:, 0]
    x = jnp.einsum("bs,bst->bt", row, a, precision=HIGHEST)
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-30)
    return top * jnp.linalg.norm(jnp.einsum("bs,bst->bt", x, a, precision=HIGHEST), axis=1)


class KronState(NamedTuple):
    count: jax.Array  # steps taken
    key: jax.Array  # the draws: whether to refit, the probe V and the damping noise
    mu: optax.Updates  # momentum, in the parameters' own shapes (float32)
    q_left: chex.ArrayTree  # each leaf's left factor ([B, m, m], [B, m] or None)
    q_right: chex.ArrayTree  # each leaf's right factor
    probability: jax.Array  # the probability this step had of refitting the preconditioner


def refit_draw(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """From the step's key: the refit's uniform draw, and the key the parameters' draws come from."""
    refit_key, leaf_key = jax.random.split(key)
    return jax.random.uniform(refit_key), leaf_key


def leaf_keys(leaf_key: jax.Array, name: str) -> jax.Array:
    """A parameter's two keys [2, key], by its path: its probe V's and its damping noise Z's."""
    return jax.random.split(jax.random.fold_in(leaf_key, zlib.crc32(name.encode()) & 0x7FFFFFFF))


def leaf_draws(leaf_key: jax.Array, name: str, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """A parameter's (by its path, [B, m, n]) probe V and damping noise Z, each N(0, 1). They depend on its path
    only, not on which others are present, so Kron given a parameter group's part of the model steps it exactly as
    Kron given the whole model."""
    k_probe, k_noise = leaf_keys(leaf_key, name)
    return jax.random.normal(k_probe, shape, jnp.float32), jax.random.normal(k_noise, shape, jnp.float32)


def leaf_draws_by_shape(
    leaf_key: jax.Array, shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Every parameter's `leaf_draws` (probes and noise by path), the same numbers, drawn together for the parameters
    of one shape: one normal draw vmapped over their keys, so the step holds one random-bits program per shape
    instead of two per parameter (gpt2-tiny's 32 draws were 5.8 of its 9.1 s compile on XLA:CPU, BENCHMARKS.md)."""
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for name, shape in shapes.items():
        by_shape.setdefault(tuple(shape), []).append(name)
    probes, noise = {}, {}
    for shape, names in by_shape.items():
        keys = jnp.concatenate([leaf_keys(leaf_key, name) for name in names])  # [2 * len(names), key]
        drawn = jax.vmap(lambda k, shape=shape: jax.random.normal(k, shape, jnp.float32))(keys)
        for i, name in enumerate(names):
            probes[name], noise[name] = drawn[2 * i], drawn[2 * i + 1]
    return probes, noise


def draws(
    key: jax.Array, shapes: dict[str, tuple[int, ...]]
) -> tuple[jax.Array, dict[str, jax.Array], dict[str, jax.Array]]:
    """Every draw of a step at once: the refit draw, and the probes and noise by parameter path."""
    u, leaf_key = refit_draw(key)
    return u, *leaf_draws_by_shape(leaf_key, shapes)


def kron_direction(
    roles: dict[str, Role],
    beta1: float,
    weight_decay: float,
    precond_lr: float,
    precond_update_probability: float,
    max_size_triangular: int,
    precond_init_scale: float,
    momentum_into_precond: bool,
    seed: int = 0,
) -> optax.GradientTransformation:
    """The whole step for a unit lr, weight decay included, already negated."""

    def kinds(role: Role, x: jax.Array) -> tuple[str | None, str | None]:
        _, m, n = as_matrices(x, role).shape
        return side_kind(m, max_size_triangular, role.is_matrix), side_kind(n, max_size_triangular, role.is_matrix)

    def init(params):
        def factor(role, p, left):
            b, m, n = as_matrices(p, role).shape
            kind, size = kinds(role, p)[0 if left else 1], (m if left else n)
            if kind is None:
                return None
            return (
                jnp.broadcast_to(jnp.eye(size, dtype=jnp.float32), (b, size, size))
                if kind == "tri"
                else jnp.ones((b, size), jnp.float32)
            )

        return KronState(
            jnp.zeros([], jnp.int32),
            jax.random.PRNGKey(seed),
            optax.tree.zeros_like(params, jnp.float32),
            map_roles(lambda r, p: factor(r, p, True), roles, params),
            map_roles(lambda r, p: factor(r, p, False), roles, params),
            jnp.ones([], jnp.float32),
        )

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("kron needs the parameters (for its weight decay)")
        count = state.count + 1
        mu = optax.tree.update_moment(updates, state.mu, beta1, 1)
        mu_hat = optax.tree.bias_correction(mu, beta1, count)
        fitted = mu_hat if momentum_into_precond else jax.tree.map(lambda g: g.astype(jnp.float32), updates)

        names = path_names(updates)
        leaves_g = jax.tree.leaves(fitted)
        key, step_key = jax.random.split(state.key)
        u, leaf_key = refit_draw(step_key)
        treedef = jax.tree.structure(updates)
        lefts = treedef.flatten_up_to(state.q_left)
        rights = treedef.flatten_up_to(state.q_right)
        sides = [
            (Side(kl, ql), Side(kr, qr))
            for (kl, kr), ql, qr in zip((kinds(roles[n], g) for n, g in zip(names, leaves_g)), lefts, rights)
        ]

        def start_scale(h: jax.Array) -> jax.Array:
            """[B]: the start scale of P's factors for matrices h [B, m, n]."""
            if precond_init_scale > 0:
                return jnp.full(h.shape[:1], precond_init_scale, jnp.float32)
            s = jnp.mean(h**4, axis=(1, 2)) ** (-1 / 8)
            return jnp.where(jnp.isfinite(s) & (s > 0), s, 1.0)

        def first(sides_now):
            """Q = identity x the start scale, split evenly over the sides a matrix has."""
            out = []
            for (left, right), g, n in zip(sides_now, leaves_g, names):
                present = sum(side.kind is not None for side in (left, right))
                c = start_scale(as_matrices(g, roles[n])) ** (1 / max(present, 1))
                out.append((left.scaled(c) if left.kind else left, right.scaled(c) if right.kind else right))
            return out

        def refit(sides_now):
            """Drawn inside the refit: the steps that do not refit draw nothing."""
            matrices = {n: as_matrices(g, roles[n]) for g, n in zip(leaves_g, names)}
            probes, noise = leaf_draws_by_shape(leaf_key, {n: h.shape for n, h in matrices.items()})
            out = []
            for (left, right), n in zip(sides_now, names):
                h, v, z = matrices[n], probes[n], noise[n]
                h = h + DAMPING * jnp.mean(jnp.abs(h), axis=(1, 2), keepdims=True) * z
                a = right.apply(left.apply(h, left=True), left=False)
                b = right.solve(left.solve(v, left=True), left=False)
                new_left, new_right = left.refit(a, b, True, precond_lr), right.refit(a, b, False, precond_lr)
                if new_left.kind is not None and new_right.kind is not None:  # equal largest entries, P unchanged
                    nl, nr = new_left.largest(), new_right.largest()
                    mean = jnp.sqrt(nl * nr)
                    new_left = new_left.scaled(safe_divide(mean, nl) + (nl == 0))
                    new_right = new_right.scaled(safe_divide(mean, nr) + (nr == 0))
                out.append((new_left, new_right))
            return out

        keep = lambda sides_now: sides_now  # noqa: E731
        sides = jax.lax.cond(state.count == 0, first, keep, sides)
        probability = (
            update_probability(count)
            if precond_update_probability < 0
            else jnp.asarray(precond_update_probability, jnp.float32)
        )
        sides = jax.lax.cond(u < probability, refit, keep, sides)

        directions = []
        decayed = [roles[n].decayed for n in names]
        for (left, right), m, g, p, n, d in zip(
            sides, jax.tree.leaves(mu_hat), jax.tree.leaves(updates), jax.tree.leaves(params), names, decayed
        ):
            x = as_matrices(m, roles[n])
            x = right.apply(left.apply(x, left=True), left=False)  # Q_l M Q_r^T
            x = right.apply(left.apply(x, left=True, transpose=True), left=False, transpose=True)  # Q_l^T . Q_r
            rms = jnp.sqrt(jnp.mean(x * x, axis=(1, 2), keepdims=True))
            x = x * jnp.minimum(1.0, MAX_RMS / (rms + 1e-12))
            x = x.reshape(g.shape)
            if d and weight_decay > 0:
                x = x + weight_decay * p.astype(jnp.float32)
            directions.append((-x).astype(g.dtype))

        q_left = treedef.unflatten([left.q for left, _ in sides])
        q_right = treedef.unflatten([right.q for _, right in sides])
        return treedef.unflatten(directions), KronState(count, key, mu, q_left, q_right, probability)

    return optax.GradientTransformation(init, update)


@register("kron")
def kron(
    model,
    *,
    beta1: float,
    weight_decay: float,
    precond_lr: float = 0.1,
    precond_update_probability: float = -1.0,
    max_size_triangular: int = 8192,
    precond_init_scale: float = 0.0,
    momentum_into_precond: bool = True,
) -> optax.GradientTransformation:
    if not 0 < precond_lr < 1:
        raise ConfigError(f"config: optimizer.precond_lr: must be in (0, 1); got {precond_lr}")
    if not (precond_update_probability < 0 or 0 < precond_update_probability <= 1):
        raise ConfigError(
            "config: optimizer.precond_update_probability: must be in (0, 1], or negative for the "
            f"decaying schedule; got {precond_update_probability}"
        )
    if max_size_triangular < 1:
        raise ConfigError(f"config: optimizer.max_size_triangular: must be >= 1; got {max_size_triangular}")
    if precond_init_scale < 0:
        raise ConfigError(
            f"config: optimizer.precond_init_scale: must be >= 0 (0: from the first gradient); got {precond_init_scale}"
        )
    return kron_direction(
        roles_of(model),
        beta1,
        weight_decay,
        precond_lr,
        precond_update_probability,
        max_size_triangular,
        precond_init_scale,
        momentum_into_precond,
    )


@reads(KronState)
def _refit_probability(state: KronState) -> dict[str, jax.Array]:
    """The probability the last step had of refitting the preconditioner (optimizer/kron_refit_probability)."""
    return {"kron_refit_probability": state.probability}
