"""Curvature: the extreme eigenvalues of the loss's Hessian, by the Lanczos iteration on Hessian-vector products.

    hvp(loss_fn, params, batch, v)                 H v, forward-over-reverse: jax.jvp of jax.grad (never forms H)
    hessian_extremes(loss_fn, params, batch, ...)  the largest (top algebraic, "sharpness") and the smallest (most
                                                   negative, when any is) eigenvalue, from one Lanczos run
    sharpness_fn(...)                              the compiled measurement of a model on a batch, with the eval loss

The loss is the evaluation's masked mean token cross-entropy (training/step/losses.py `mean_loss`: every target token
counts once, padding and fine-tuning prompts not at all) on the model's float32 parameters in float32, whatever the
run's compute dtype: a 16-bit Hessian-vector product is too noisy for an iteration to settle. With gradient descent
at learning rate lr the loss can only decrease stably while the sharpness stays below 2/lr, the "edge of stability"
(Cohen et al. 2021); with momentum beta the bound is (2 + 2 beta)/lr, and for Adam it bounds the preconditioned
Hessian's sharpness instead (Cohen et al. 2022), so 2/lr is a reference line, not a law, for those.

Lanczos builds, from a random unit vector, an orthonormal basis of the Krylov space {v, Hv, H^2 v, ...} in which H is
a tridiagonal matrix T; T's extreme eigenvalues (its Ritz values) approach H's extreme ones from inside, both ends at
once and much faster than power iteration, which finds only the eigenvalue of largest magnitude, at the rate of the
ratio of the two largest. It keeps three vectors, not the basis: without reorthogonalisation the basis loses its
orthogonality once a Ritz value has converged, which makes copies of that value appear in T but leaves the extremes
right (Paige 1976), and the extremes are all this measures. A negative bottom is curvature on a small scale (measured
with the earlier power iteration: -437 at the end of a gpt2-tiny SGD run at lr 0.5, along an eigenvector in the token
and position embeddings, which a finite difference of the gradient sees at a step of 1e-4 and not at 1e-2).

The whole iteration is one `lax.fori_loop` under one jit: one compilation, one transfer of the result. Shardings are
left to jit: the vectors take the parameters' layouts, so it runs on the run's mesh as the train step does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from core.trees import tree_dot
from training.step.losses import Batch, mean_loss

if TYPE_CHECKING:
    from data import Data
    from models.gpt import GPT

ITERS = 20  # Lanczos steps (Hessian-vector products) per measurement, unless told (the loop: logging.hessian_iters)
CLOSED = 1e-6  # a residual this small against |H| closes the Krylov space (float32 rounding is ~1e-7 of it)
SEED = 0  # the starting vector's PRNG seed: the loop action and scripts/tools/hessian.py start from the same vector

LossFn = Callable[[chex.ArrayTree, Batch], jax.Array]  # (params, batch) -> scalar loss


class Extremes(NamedTuple):
    top: jax.Array  # the largest eigenvalue (top algebraic: the sharpness), float32
    bottom: jax.Array  # the smallest (most negative, when any is), float32
    iterations: jax.Array  # Hessian-vector products computed (int32)


def hvp(loss_fn: LossFn, params: chex.ArrayTree, batch: Batch, v: chex.ArrayTree) -> chex.ArrayTree:
    """H v at `params`, H the Hessian of `loss_fn(., batch)`: the directional derivative of the gradient along v."""
    return jax.jvp(lambda p: jax.grad(loss_fn)(p, batch), (params,), (v,))[1]


def hessian_extremes(
    loss_fn: LossFn, params: chex.ArrayTree, batch: Batch, iters: int = ITERS, key: jax.Array | None = None
) -> Extremes:
    """`iters` Lanczos steps from a random unit vector (`key`): the extreme eigenvalues of T. Traceable (call it under
    jit); `iters` is static. Should the Krylov space close early (a residual of zero: only when `iters` reaches the
    number of distinct eigenvalues, as in a tiny test model), the steps after it add 1 x 1 blocks holding the first
    Rayleigh quotient, which lies inside H's spectrum and so moves neither extreme."""
    key = jax.random.PRNGKey(SEED) if key is None else key
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    v0 = _unit(treedef.unflatten([jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)]))

    def step(i, carry):
        previous, v, beta_previous, scale, closed, alphas, betas = carry
        w = hvp(loss_fn, params, batch, v)
        alpha = tree_dot(w, v)
        w = jax.tree.map(lambda a, b, c: a - alpha * b - beta_previous * c, w, v, previous)
        beta = jnp.sqrt(tree_dot(w, w))
        scale = jnp.maximum(scale, jnp.abs(alpha) + beta + beta_previous)  # |H| seen so far
        alpha = jnp.where(closed, alphas[0], alpha)  # the space closed at an earlier step: a 1 x 1 block
        now_closed = closed | (beta <= CLOSED * scale)
        beta = jnp.where(now_closed, 0.0, beta)
        return v, _unit(w), beta, scale, now_closed, alphas.at[i].set(alpha), betas.at[i].set(beta)

    zero = jax.tree.map(jnp.zeros_like, v0)
    scalar = jnp.zeros([], jnp.float32)
    *_, alphas, betas = jax.lax.fori_loop(
        0,
        iters,
        step,
        (
            zero,
            v0,
            scalar,
            scalar,
            jnp.asarray(False),
            jnp.zeros([iters], jnp.float32),
            jnp.zeros([iters], jnp.float32),
        ),
    )
    off = betas[:-1]
    tridiagonal = jnp.diag(alphas) + jnp.diag(off, 1) + jnp.diag(off, -1)
    ritz = jnp.linalg.eigvalsh(tridiagonal)
    return Extremes(ritz[-1], ritz[0], jnp.asarray(iters, jnp.int32))


def model_loss(static: GPT) -> LossFn:
    """The evaluation's masked mean token loss of the model (static part `static`) with parameters `params`, float32
    and without dropout."""
    return lambda params, batch: mean_loss(eqx.combine(params, static), batch, None, jnp.float32)


@functools.cache
def sharpness_fn(iters: int = ITERS) -> Callable[[GPT, Batch, jax.Array], Extremes]:
    """`sharpness(model, batch, key) -> Extremes`: the extreme Hessian eigenvalues of the eval loss at the model's
    float32 parameters, compiled on its first call (once per model structure and batch shape). One function per
    `iters` in a process (it depends on nothing else), so a second run, script or caller reuses its programs."""

    @eqx.filter_jit
    def sharpness(model: GPT, batch: Batch, key: jax.Array) -> Extremes:
        params, static = eqx.partition(model, eqx.is_array)
        params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
        return hessian_extremes(model_loss(static), params, batch, iters, key)

    return sharpness


def fixed_batch(data: Data) -> dict[str, np.ndarray]:
    """The batch curvature is measured on, the same at every measurement and in every script: this process's rows of
    the first evaluation batch of the main validation split (`data`: data/__init__.py `Data`)."""
    return next(iter(data.evals[data.main_split]))


def _unit(v: chex.ArrayTree) -> chex.ArrayTree:
    """v / |v| (a zero vector stays zero: a Hessian that vanishes along v has eigenvalue 0 there)."""
    norm = jnp.sqrt(tree_dot(v, v))
    return jax.tree.map(lambda x: x / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny), v)
