"""Parameters as batches of matrices, for the optimizers that precondition each side of a matrix (SOAP, Kron): the
[B, m, n] view of a tensor, and decompositions (eigh, QR, triangular solves) run over such a batch."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax

HIGHEST = jax.lax.Precision.HIGHEST  # the preconditioners' products in full float32 (TPUs and GPUs default lower)


def matrices_shape(shape: tuple[int, ...], stacked: bool) -> tuple[int, int, int]:
    """[L, in, *out] -> [L, in, out] (a stacked block weight), or [in, *out] -> [1, in, out]."""
    if stacked:
        return shape[0], shape[1], math.prod(shape[2:])
    return 1, shape[0], math.prod(shape[1:])


def batched_decompositions() -> bool:
    """Whether eigh, QR and triangular solves take a whole batch of matrices in one call: not on CPU, where jaxlib's
    batched kernels split a large batch over XLA's thread pool and wait for it from a thread of that pool, which
    deadlocks once as many of them wait at once as the pool has threads (seen on 2 cores: the eigh of two tensors at
    once). An unbatched call runs inline."""
    return jax.default_backend() != "cpu"


def per_matrix(f: Callable[..., jax.Array], *batches: jax.Array) -> jax.Array:
    """f(a[i], b[i], ...) for each matrix of the batches [B, ...]: in one call, or one matrix per call in a loop
    (on CPU)."""
    return f(*batches) if batched_decompositions() else jax.lax.map(lambda xs: f(*xs), batches)
