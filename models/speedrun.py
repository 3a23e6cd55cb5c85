"""The modded-nanogpt speedrun's pieces of the model (model.unet_skips, value_embeddings, smear_gate; models/gpt.py
calls them): which blocks run together under the U-net's skips and the value embeddings, how a value embedding enters
a block's values, and the smear gate's one token of look-back."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models.config import ModelOptions
from models.kv_cache import KVCache

VALUE_EMBEDDING_STD = 0.01  # the speedrun's init of its value-embedding tables
GATE_CHANNELS = 12  # the value embeddings' and the smear's gates read the first 12 channels of their input


@dataclasses.dataclass(frozen=True)
class Segment:
    """Blocks lo..hi-1 that run alike (one scan, or one loop unrolled): whether their outputs are the U-net's first
    half (`collect`), which of the mirrored first-half outputs and skip weights they add (`skips`: a range of both),
    which value-embedding tables and gates they mix into their values (`tables`, `gates`: ranges)."""

    lo: int
    hi: int
    collect: bool = False
    skips: tuple[int, int] | None = None
    tables: tuple[int, int] | None = None
    gates: tuple[int, int] | None = None


def layer_segments(cfg: ModelOptions) -> list[Segment]:
    """The blocks cut where the U-net's halves (model.unet_skips: the first n = L // 2 and the last n of L) and the
    value embeddings' layers (model.value_embeddings = k: the first k and the last k, both with tables 0..k-1) begin
    or end. Without either, one segment of every block."""
    L, k = cfg.n_layer, cfg.value_embeddings
    n = L // 2 if cfg.unet_skips else 0
    cuts = sorted({0, L, n, L - n, k, L - k})
    segments = []
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        skips = (lo - (L - n), hi - (L - n)) if n and lo >= L - n else None
        tables = gates = None
        if k and hi <= k:
            tables = gates = (lo, hi)
        elif k and lo >= L - k:
            tables = (lo - (L - k), hi - (L - k))
            gates = (k + tables[0], k + tables[1])
        segments.append(Segment(lo, hi, bool(n) and hi <= n, skips, tables, gates))
    return segments


def add_value_embedding(v_BTKH: jax.Array, h_BTD: jax.Array, ve_BTD: jax.Array, gate_KG: jax.Array) -> jax.Array:
    """A block's values plus its value embedding: v + 2 sigmoid(w_k . h[:G]) ve per key/value head k, h the block's
    normed input (a gate of 1 while w = 0)."""
    G = gate_KG.shape[-1]
    gate_BTK = 2 * jax.nn.sigmoid(jnp.einsum("btg,kg->btk", h_BTD[..., :G], gate_KG.astype(h_BTD.dtype)))
    return v_BTKH + gate_BTK[..., None] * ve_BTD.reshape(v_BTKH.shape)


def smear(
    x_BTD: jax.Array,
    tokens_BT: jax.Array,
    positions: jax.Array,
    cache: KVCache | None,
    weights: jax.Array,
    wte_VD: jax.Array,
) -> tuple[jax.Array, KVCache | None]:
    """The smear gate: x_t + lambda sigmoid(w . x_t[:G]) x_{t-1}, x the token embeddings (`weights`: w, then lambda),
    nothing added at a position 0 (a sequence's or a document's start). Decoding reads the previous token of a call's
    first new token from the cache's ids, and writes this call's ids there."""
    G = weights.shape[0] - 1
    w, lam = weights[:G].astype(x_BTD.dtype), weights[G].astype(x_BTD.dtype)
    previous_BT = jnp.concatenate([tokens_BT[:, :1], tokens_BT[:, :-1]], axis=1)
    if cache is not None:
        tokens_BC = cache.tokens
        before_B = jnp.take_along_axis(tokens_BC, jnp.maximum(cache.lengths - 1, 0)[:, None], axis=1)[:, 0]
        previous_BT = previous_BT.at[:, 0].set(before_B)
        write = jax.vmap(lambda row, new, s: jax.lax.dynamic_update_slice_in_dim(row, new, s, 0))
        tokens_BC = write(tokens_BC, tokens_BT.astype(jnp.int32), cache.lengths)
        cache = KVCache(cache.k, cache.v, cache.lengths, cache.empty, tokens_BC)
    gate_BT1 = lam * jax.nn.sigmoid(x_BTD[..., :G] @ w)[..., None]
    has_previous_BT1 = (jnp.broadcast_to(positions, tokens_BT.shape) > 0)[..., None]
    return x_BTD + jnp.where(has_previous_BT1, gate_BT1 * wte_VD[previous_BT], 0.0), cache
