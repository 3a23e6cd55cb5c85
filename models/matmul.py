"""Matmuls whose backward pass is written for XLA:CPU's fast dot path.

XLA:CPU runs a dot through YNNPACK when its operands are laid out as a plain matrix product wants them (the left
operand contracted over its last axis); a dot that contracts an operand over its leading axis goes to XLA:CPU's
generic dot, several times slower. JAX's own differentiation of y = x W produces such dots: the weight gradient x^T dy
contracts both operands over their token axis. `dense` writes its backward pass out: x^T dy from a transposed copy of x
or, where dy is the smaller, (dy^T x)^T. The copies are of activations, small beside the matmul (a [4096, 384] x
copy for a 4.8 GFLOP [4096, 384] x [4096, 1536] gradient). models/attention.py's blocked attention does the same
for its own dots. Other backends' libraries take any layout: there `dense` is the plain dot.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def dense(x_ND: jax.Array, w: jax.Array) -> jax.Array:
    """x [N, D] times W [D, *out] -> [N, *out]; on the CPU with the backward pass below."""
    if jax.default_backend() == "cpu":
        return _cpu_dense(x_ND, w)
    return _dot(x_ND, w)


def transposed(x: jax.Array, source: int, destination: int) -> jax.Array:
    """`x` with axis `source` moved to `destination`, as a copy in that layout: the barrier keeps XLA from folding
    the transpose back into the dot that reads it."""
    return jax.lax.optimization_barrier(jnp.moveaxis(x, source, destination))


def _dot(x_ND: jax.Array, w: jax.Array) -> jax.Array:
    return jax.lax.dot_general(x_ND, w, (((1,), (0,)), ((), ())))


@jax.custom_vjp
def _cpu_dense(x_ND: jax.Array, w: jax.Array) -> jax.Array:
    return _dot(x_ND, w)


def _cpu_dense_backward(residuals, dy):
    x_ND, w = residuals
    out_axes = tuple(range(1, w.ndim))
    dx_ND = jax.lax.dot_general(dy, w, ((out_axes, out_axes), ((), ())))  # dy W^T: already a plain product
    if x_ND.shape[1] <= math.prod(w.shape[1:]):  # x^T [D, N] (the smaller copy) times dy [N, *out]
        dw = jax.lax.dot_general(transposed(x_ND, 0, -1), dy, (((1,), (0,)), ((), ())))
    else:  # dy^T [*out, N] times x [N, D], then [D, *out] (its own copy, not folded back into the dot)
        dwT = jax.lax.dot_general(transposed(dy, 0, -1), x_ND, (((dy.ndim - 1,), (0,)), ((), ())))
        dw = jnp.moveaxis(jax.lax.optimization_barrier(dwT), -1, 0)
    return dx_ND.astype(x_ND.dtype), dw.astype(w.dtype)


_cpu_dense.defvjp(lambda x_ND, w: (_dot(x_ND, w), (x_ND, w)), _cpu_dense_backward)
