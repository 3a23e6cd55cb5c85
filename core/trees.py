"""Small functions over pytrees that several layers use: a parameter's name from its tree path, and the inner product
of two trees."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def path_name(path: tuple) -> str:
    """`blocks.qkv.weight`: a leaf's tree path (jax.tree_util's key path) as a dotted name."""
    return jax.tree_util.keystr(path, simple=True, separator=".")


def path_names(tree: chex.ArrayTree) -> list[str]:
    """Every leaf's dotted name, in the tree's leaf order."""
    return [path_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def tree_dot(a: chex.ArrayTree, b: chex.ArrayTree) -> jax.Array:
    """<a, b> summed over the leaves of two trees of the same structure, accumulated in float32."""
    return sum(
        jnp.vdot(x.astype(jnp.float32), y.astype(jnp.float32)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )
