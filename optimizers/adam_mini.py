"""Adam-mini: AdamW with one second moment per block of parameters instead of one per entry.

Zhang, Chen, Li, Ding, Wu, Kingma, Ye, Luo, Sun (2024), "Adam-mini: Use Fewer Learning Rates To Gain More",
arXiv:2406.16793; the reference code is github.com/zyushun/Adam-mini (adam_mini/adam_mini.py, v1.1.1).

The rule, for each block B of a tensor (m per entry, v per block):
    m <- beta1 m + (1 - beta1) g;   v_B <- beta2 v_B + (1 - beta2) mean_{i in B} g_i^2
    x <- x - lr * (m / (1 - beta1^t)) / (sqrt(v_B / (1 - beta2^t)) + eps) - lr * wd * x

The blocks, as the reference code partitions a GPT (its v1.1 rules; axes are ours, weights stored [in, out]):
- wte (the embedding, tied to the LM head): one block per token row; the value embeddings' tables alike, each
  table its own rows (the reference takes every tensor whose name holds "embed" for an embedding).
- qkv.weight [L, D, 3, D]: per layer, the queries and the keys one block per head (the head's D/n_head output
  columns x all inputs), the values one block per output neuron.
- attn_proj, fc, mlp_proj weights: per layer, one block per output neuron (a column: all its inputs).
- LayerNorm weights and wpe: one block per tensor (per layer for the stacked ones). The reference sends every
  tensor it does not name (wpe included) to one block.
- Biases (the linear layers' and LayerNorm's): plain Adam, one v per entry, as the reference does ("bias" blocks).
Weight decay is decoupled, on the decayed matrices only (wte and the blocks' weights, optimizers/decay.py); the
reference decays wpe too. The pipeline's lr is the paper's lr (the same value as AdamW's, the paper recommends).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from optimizers.decay import fixed
from optimizers.param_roles import Role, map_roles, roles_of
from optimizers.registry import register


class Entries:
    """One block per entry: Adam."""

    def mean_square(self, g: jax.Array) -> jax.Array:
        return jnp.square(g)

    def per_entry(self, v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        return v


class Reduce:
    """Blocks that span `axes` of the tensor: one v per index of the other axes (kept as size-1 axes)."""

    def __init__(self, axes: tuple[int, ...] | None):
        self.axes = axes

    def mean_square(self, g: jax.Array) -> jax.Array:
        return jnp.mean(jnp.square(g), axis=self.axes, keepdims=True)

    def per_entry(self, v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        return v


class QkvHeads:
    """qkv.weight [L, D, R, E] (R = 3, E = N*H; under grouped-query attention R = G + 2 rows of K*H: models/block.py
    `qkv_shape`): queries and keys one block per (layer, head) -> v [L, R - 1, E / H]; values one block per (layer,
    output neuron) -> v [L, E]."""

    def __init__(self, head_dim: int):
        self.head_dim = head_dim

    def mean_square(self, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        L, D, rows, E = g.shape
        g2 = jnp.square(g).reshape(L, D, rows, E // self.head_dim, self.head_dim)
        return jnp.mean(g2[:, :, :-1], axis=(1, 4)), jnp.mean(g2[:, :, -1], axis=1).reshape(L, E)

    def per_entry(self, v: tuple[jax.Array, jax.Array], shape: tuple[int, ...]) -> jax.Array:
        L, _, rows, E = shape
        v_qk, v_v = v
        qk = jnp.broadcast_to(v_qk[..., None], (L, rows - 1, E // self.head_dim, self.head_dim)).reshape(L, rows - 1, E)
        return jnp.concatenate([qk, v_v[:, None, :]], axis=1)[:, None]  # [L, 1, R, E], broadcast over inputs


def block_rule(role: Role, shape: tuple[int, ...], head_dim: int, vocab: int) -> Entries | Reduce | QkvHeads:
    """A tensor's partition into blocks, from its role."""
    if role.label == "bias":
        return Entries()
    if role.label in ("token_embedding", "head"):  # one block per token: all axes but the vocabulary's
        return Reduce(tuple(a for a in range(len(shape)) if a != shape.index(vocab)))
    if role.label == "value_embedding":  # [k, V, D]: each table one block per token row (the reference's "embed")
        return Reduce((len(shape) - 1,))
    if role.label == "attn_qkv":
        return QkvHeads(head_dim)
    if role.label in ("attn_out", "mlp_in", "mlp_out"):  # one block per output neuron: its inputs
        return Reduce((role.in_axis,))
    return Reduce(tuple(range(1, len(shape))) if role.stacked else None)  # per tensor (per layer when stacked)


class ScaleByAdamMiniState(NamedTuple):
    count: jax.Array  # steps taken, for the bias corrections
    mu: optax.Updates  # first moment, one per entry
    nu: optax.Updates  # second moment, one per block (shapes from each tensor's rule)


def scale_by_adam_mini(
    roles: dict[str, Role], head_dim: int, vocab: int, beta1: float, beta2: float, eps: float
) -> optax.GradientTransformation:
    def rule(role, x):
        return block_rule(role, x.shape, head_dim, vocab)

    def init(params):
        def zeros(role, p):
            shapes = jax.eval_shape(rule(role, p).mean_square, jax.ShapeDtypeStruct(p.shape, jnp.float32))
            return jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)

        return ScaleByAdamMiniState(
            jnp.zeros([], jnp.int32), optax.tree.zeros_like(params, jnp.float32), map_roles(zeros, roles, params)
        )

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        mu = optax.tree.update_moment(updates, state.mu, beta1, 1)
        nu = map_roles(
            lambda role, g, v: jax.tree.map(
                lambda old, new: beta2 * old + (1 - beta2) * new, v, rule(role, g).mean_square(g.astype(jnp.float32))
            ),
            roles,
            updates,
            state.nu,
        )
        bc1, bc2 = 1 - beta1**count, 1 - beta2**count

        def direction(role, g, m, v):
            v_hat = rule(role, g).per_entry(v, g.shape) / bc2
            return ((m / bc1) / (jnp.sqrt(v_hat) + eps)).astype(g.dtype)

        return map_roles(direction, roles, updates, mu, nu), ScaleByAdamMiniState(count, mu, nu)

    return optax.GradientTransformation(init, update)


@register("adam_mini")
def adam_mini(model, *, beta1: float, beta2: float, eps: float, weight_decay: float) -> optax.GradientTransformation:
    return optax.chain(
        scale_by_adam_mini(
            roles_of(model), model.cfg.n_embd // model.cfg.n_head, model.cfg.padded_vocab_size, beta1, beta2, eps
        ),
        optax.add_decayed_weights(weight_decay, fixed(model.weight_decay_mask())),
        optax.scale(-1.0),
    )
