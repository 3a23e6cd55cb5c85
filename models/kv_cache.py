"""The KV cache decoding passes through the model's own blocks (models/gpt.py `GPT.hidden(tokens, cache=...)`):
every layer's keys and values, K key/value heads each (fewer than the query heads under grouped-query attention), and
where each row's next token goes. Keys are cached after QK-norm and the rotary turn, so a cached key is what the
no-cache model would compute at its position.

Shape suffixes as in models/gpt.py: L layers, B batch, C context, T new tokens, N query heads, K key/value heads,
H head size.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from models.attention import cached_attention, causal_attention


class LayerCache(eqx.Module):
    """One layer's keys and values [B, C, K, H] for the C positions of the context, and where this call's new
    tokens go in each row (`start`, [B]). `empty` (static): nothing is cached yet and the new tokens start at
    position 0 (the prompts), so they attend among themselves exactly as in training."""

    k: jax.Array
    v: jax.Array
    start: jax.Array
    empty: bool = eqx.field(static=True)

    def attend(
        self, q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, implementation: str, window: int | None = None
    ) -> tuple[jax.Array, LayerCache]:
        """Write the new keys and values at their rows' positions, then attend from each new token to every
        position up to its own. More new tokens than the cache has positions is refused while tracing (shapes are
        static); a row whose cache is already full is not (its length is only known at run time): `generate` never
        feeds one, as it stops using the cache at the context."""
        if k_BTKH.shape[1] > self.k.shape[1]:
            raise ValueError(
                f"KV cache: {k_BTKH.shape[1]} new tokens do not fit a cache of {self.k.shape[1]} positions"
            )
        write = jax.vmap(
            lambda cache, new, s: jax.lax.dynamic_update_slice_in_dim(cache, new.astype(cache.dtype), s, 0)
        )
        k_BCKH, v_BCKH = write(self.k, k_BTKH, self.start), write(self.v, v_BTKH, self.start)
        if self.empty:
            y_BTNH = causal_attention(q_BTNH, k_BTKH, v_BTKH, implementation, window=window)
        else:
            y_BTNH = cached_attention(q_BTNH, k_BCKH, v_BCKH, self.start, implementation, window)
        return y_BTNH, LayerCache(k_BCKH, v_BCKH, self.start, empty=False)


class KVCache(eqx.Module):
    """Every layer's keys and values for decoding ([L, B, C, K, H], C = the context) and how many positions each
    row holds (`lengths`, [B]: where its next token goes). Made by `GPT.init_cache`, filled and advanced by
    `GPT.hidden(tokens, cache=...)`: the same blocks as training, so decoding cannot drift from the model."""

    k: jax.Array
    v: jax.Array
    lengths: jax.Array
    empty: bool = eqx.field(static=True, default=False)
    tokens: jax.Array | None = None  # [B, C] the ids at each position (model.smear_gate looks one token back)

    def with_lengths(self, lengths_B: jax.Array) -> KVCache:
        """The cache with each row's length set, e.g. to its prompt's length after a right-padded prefill."""
        return KVCache(self.k, self.v, lengths_B.astype(jnp.int32), self.empty, self.tokens)
