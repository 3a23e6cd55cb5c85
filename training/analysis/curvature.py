"""Curvature: the top eigenvalue of the loss's Hessian (the "sharpness"), by power iteration on Hessian-vector products.

    hvp(loss_fn, params, batch, v)               H v, forward-over-reverse: jax.jvp of jax.grad (never forms H)
    top_eigenvalue(loss_fn, params, batch, ...)  power iteration: the eigenvalue of largest magnitude, its unit
                                                 eigenvector, and how many Hessian-vector products it took
    sharpness_fn(...)                            the compiled measurement of a model on a batch, with the eval loss

The loss is the evaluation's masked mean token cross-entropy (training/step/losses.py `mean_loss`: every target token
counts once, padding and fine-tuning prompts not at all) on the model's float32 parameters in float32, whatever the
run's compute dtype: a 16-bit Hessian-vector product is too noisy for power iteration to settle. With gradient descent
at learning rate lr the loss can only decrease stably while the sharpness stays below 2/lr, the "edge of stability"
(Cohen et al. 2021); with momentum beta the bound is (2 + 2 beta)/lr, and for Adam it bounds the preconditioned
Hessian's sharpness instead (Cohen et al. 2022), so 2/lr is a reference line, not a law, for those.

Power iteration finds the eigenvalue of largest magnitude, which is the sharpness (the largest eigenvalue) whenever it
is positive, as it is through most of a run. It can be negative, from curvature on a very small scale (measured: -437
at the end of a gpt2-tiny SGD run at lr 0.5, along an eigenvector in the token and position embeddings; a finite
difference of the gradient along it sees -485 at a step of 1e-4 and nothing at 1e-2); it is reported as it is, signed.

It converges at the rate |lambda_2 / lambda_1| per product: it stops when the Rayleigh quotient changes by less than
`tol` of itself between two products, or after `iters` products. The whole iteration is one `lax.while_loop` under one
jit: one compilation, one transfer of the result (`jax.linearize`, which computes the primal once, was measured no
faster on CPU). Shardings are left to jit: the vectors take the parameters' layouts, so it runs on the run's mesh as
the train step does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from training.step.losses import mean_loss

if TYPE_CHECKING:
    from data import Data
    from models.gpt import GPT

ITERS = 20  # most Hessian-vector products per measurement, unless told (the loop: logging.hessian_iters)
TOL = 1e-3  # convergence tolerance: the estimate's relative change between two products
SEED = 0  # the starting vector's PRNG seed: the loop action and scripts/hessian.py start from the same vector

LossFn = Callable[[Any, Any], jax.Array]  # (params, batch) -> scalar loss


class Eigen(NamedTuple):
    value: jax.Array  # the eigenvalue of largest magnitude (signed), float32
    vector: Any  # its unit eigenvector, shaped like the parameters
    iterations: jax.Array  # Hessian-vector products computed (int32)
    converged: jax.Array  # the last two estimates agreed to `tol` (bool); else it stopped at `iters`


def hvp(loss_fn: LossFn, params: Any, batch: Any, v: Any) -> Any:
    """H v at `params`, H the Hessian of `loss_fn(., batch)`: the directional derivative of the gradient along v."""
    return jax.jvp(lambda p: jax.grad(loss_fn)(p, batch), (params,), (v,))[1]


def top_eigenvalue(loss_fn: LossFn, params: Any, batch: Any, iters: int = ITERS, key: jax.Array | None = None,
                   tol: float = TOL) -> Eigen:
    """Power iteration v <- Hv / |Hv| from a random unit vector (`key`), the estimate the Rayleigh quotient v.Hv.
    Traceable (call it under jit); `iters` is static."""
    key = jax.random.PRNGKey(SEED) if key is None else key
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    v0 = _unit(treedef.unflatten([jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)]))

    def settled(value, previous):
        return jnp.abs(value - previous) <= tol * jnp.abs(value)  # False while either is NaN (the first two)

    def unconverged(carry):
        i, _, value, previous = carry
        return (i < iters) & ~settled(value, previous)

    def power_step(carry):
        i, v, value, _ = carry
        hv = hvp(loss_fn, params, batch, v)
        return i + 1, _unit(hv), _dot(v, hv), value

    nan = jnp.full([], jnp.nan, jnp.float32)
    iterations, vector, value, previous = jax.lax.while_loop(unconverged, power_step,
                                                              (jnp.zeros([], jnp.int32), v0, nan, nan))
    return Eigen(value, vector, iterations, settled(value, previous))


def model_loss(static: Any) -> LossFn:
    """The evaluation's masked mean token loss of the model (static part `static`) with parameters `params`, float32
    and without dropout."""
    return lambda params, batch: mean_loss(eqx.combine(params, static), batch, None, jnp.float32)


def sharpness_fn(iters: int = ITERS, tol: float = TOL) -> Callable[[GPT, Any, jax.Array], Eigen]:
    """`sharpness(model, batch, key) -> Eigen`: the top Hessian eigenvalue of the eval loss at the model's float32
    parameters, compiled on its first call (once per model structure and batch shape)."""

    @eqx.filter_jit
    def sharpness(model: GPT, batch: Any, key: jax.Array) -> Eigen:
        params, static = eqx.partition(model, eqx.is_array)
        params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
        return top_eigenvalue(model_loss(static), params, batch, iters, key, tol)

    return sharpness


def fixed_batch(data: Data) -> dict[str, np.ndarray]:
    """The batch curvature is measured on, the same at every measurement and in every script: this process's rows of
    the first evaluation batch of the main validation split (`data`: data/__init__.py `Data`)."""
    return next(iter(data.evals[data.main_split]))


def _dot(a: Any, b: Any) -> jax.Array:
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _unit(v: Any) -> Any:
    """v / |v| (a zero vector stays zero: a Hessian that vanishes along v has eigenvalue 0 there)."""
    norm = jnp.sqrt(_dot(v, v))
    return jax.tree.map(lambda x: x / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny), v)
