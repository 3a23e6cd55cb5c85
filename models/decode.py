"""Fast sampling: a jitted decode loop with a KV cache, so each new token costs one position, not the whole prefix.

`generate` prefills the cache with the prompts (one forward pass over the longest prompt; shorter ones are
right-padded and each row decodes from its own length), then runs the whole loop of new tokens inside one
`lax.while_loop`: embed the last token at its row's position, write its keys and values into the cache, attend to
the cached positions up to it, sample. Rows stop at `<EOS>`; the loop stops when all have.

The cache holds the model's context. A generation that would run past it continues without the cache, exactly as
`generate_no_cache` does (the window slides, so every position changes and nothing cached can be reused).
"""

from __future__ import annotations

import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from models.sampling import generate_no_cache, sample_logits

PROMPT_BUCKET = 16  # prompts are padded to a multiple of this, so similar lengths share one compiled prefill


def _split_heads(a_BTD: jax.Array, n_head: int) -> jax.Array:
    B, T, D = a_BTD.shape
    return a_BTD.reshape(B, T, n_head, D // n_head)


def _mlp(block: Any, x_BTD: jax.Array) -> jax.Array:
    return x_BTD + block.mlp_proj(jax.nn.gelu(block.fc(block.ln2(x_BTD)), approximate=True))


def _prefill(model: Any, tokens_BP: jax.Array, cache_len: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Hidden states [B, P, D] of the prompts, and the cache [L, B, C, N, H] (keys, values) filled up to P."""
    from models.attention import causal_attention

    cfg = model.cfg
    B, P = tokens_BP.shape
    x_BPD = model.wte[tokens_BP] + model.wpe[:P]
    params, static = eqx.partition(model.blocks, eqx.is_array)

    def layer(x_BPD, p):
        block = eqx.combine(p, static)
        q, k, v = (_split_heads(a, cfg.n_head) for a in jnp.split(block.qkv(block.ln1(x_BPD)), 3, axis=-1))
        y_BPNH = causal_attention(q, k, v, "xla")
        x_BPD = _mlp(block, x_BPD + block.attn_proj(y_BPNH.reshape(B, P, -1)))
        pad = ((0, 0), (0, cache_len - P), (0, 0), (0, 0))
        return x_BPD, (jnp.pad(k, pad), jnp.pad(v, pad))

    x_BPD, (k_LBCNH, v_LBCNH) = jax.lax.scan(layer, x_BPD, params)
    return model.ln_f(x_BPD), k_LBCNH, v_LBCNH


def _decode_one(model: Any, token_B: jax.Array, pos_B: jax.Array, k_LBCNH: jax.Array, v_LBCNH: jax.Array):
    """Logits [B, V] for one new token per row at position pos_B, and the cache with its keys and values added."""
    cfg = model.cfg
    B = token_B.shape[0]
    C = k_LBCNH.shape[2]
    x_B1D = (model.wte[token_B] + model.wpe[pos_B])[:, None, :]
    visible_BC = jnp.arange(C)[None, :] <= pos_B[:, None]
    rows = jnp.arange(B)
    params, static = eqx.partition(model.blocks, eqx.is_array)

    def layer(x_B1D, layer_in):
        p, k_BCNH, v_BCNH = layer_in
        block = eqx.combine(p, static)
        q, k, v = (_split_heads(a, cfg.n_head) for a in jnp.split(block.qkv(block.ln1(x_B1D)), 3, axis=-1))
        k_BCNH = k_BCNH.at[rows, pos_B].set(k[:, 0])
        v_BCNH = v_BCNH.at[rows, pos_B].set(v[:, 0])
        scale = 1.0 / np.sqrt(q.shape[-1])
        s_BNC = jnp.einsum("bnh,bcnh->bnc", q[:, 0] * scale, k_BCNH, preferred_element_type=jnp.float32)
        s_BNC = jnp.where(visible_BC[:, None, :], s_BNC, -jnp.inf)
        y_BNH = jnp.einsum("bnc,bcnh->bnh", jax.nn.softmax(s_BNC, axis=-1).astype(v_BCNH.dtype), v_BCNH)
        x_B1D = _mlp(block, x_B1D + block.attn_proj(y_BNH.reshape(B, 1, -1)))
        return x_B1D, (k_BCNH, v_BCNH)

    x_B1D, (k_LBCNH, v_LBCNH) = jax.lax.scan(layer, x_B1D, (params, k_LBCNH, v_LBCNH))
    return model.logits(model.ln_f(x_B1D))[:, 0], k_LBCNH, v_LBCNH


@functools.partial(eqx.filter_jit, donate="none")
def _generate_cached(model: Any, tokens_BP: jax.Array, lengths_B: jax.Array, key: jax.Array, max_new: int,
                     temperature: float, top_k: int | None, top_p: float | None, eos_id: int):
    """New tokens [B, max_new] (eos_id after a row's <EOS>) and how many each row generated."""
    B = tokens_BP.shape[0]
    cache_len = model.cfg.context_size
    h_BPD, k_cache, v_cache = _prefill(model, tokens_BP, cache_len)
    last_BD = jnp.take_along_axis(h_BPD, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
    key, first_key = jax.random.split(key)
    first_B = sample_logits(model.logits(last_BD[:, None])[:, 0], first_key, temperature, top_k, top_p)
    out_BN = jnp.full((B, max_new), eos_id, jnp.int32).at[:, 0].set(first_B.astype(jnp.int32))
    done_B = first_B == eos_id
    count_B = jnp.ones((B,), jnp.int32)

    def cond(carry):
        i, _, _, _, _, done_B, _ = carry
        return (i < max_new) & ~jnp.all(done_B)

    def body(carry):
        i, key, out_BN, k_cache, v_cache, done_B, count_B = carry
        token_B = out_BN[:, i - 1]
        logits_BV, k_cache, v_cache = _decode_one(model, token_B, lengths_B + i - 1, k_cache, v_cache)
        key, step_key = jax.random.split(key)
        next_B = sample_logits(logits_BV, step_key, temperature, top_k, top_p).astype(jnp.int32)
        next_B = jnp.where(done_B, eos_id, next_B)
        out_BN = out_BN.at[:, i].set(next_B)
        count_B = count_B + (~done_B).astype(jnp.int32)
        return i + 1, key, out_BN, k_cache, v_cache, done_B | (next_B == eos_id), count_B

    carry = (jnp.int32(1), key, out_BN, k_cache, v_cache, done_B, count_B)
    _, _, out_BN, _, _, _, count_B = jax.lax.while_loop(cond, body, carry)
    return out_BN, count_B


def generate(model: Any, prompts: list[list[int]], max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             eos_id: int | None = None) -> list[list[int]]:
    """Continue each prompt by up to `max_new_tokens` ids (fewer once a row emits `eos_id`), with a KV cache.
    Same interface and, at temperature 0, the same tokens as `generate_no_cache`."""
    if max_new_tokens < 1:
        return [[] for _ in prompts]
    if not prompts or min(len(p) for p in prompts) < 1:
        raise ValueError("every prompt needs at least one token (e.g. <EOS> to start from nothing)")
    context = model.cfg.context_size
    longest = max(len(p) for p in prompts)
    room = context - longest  # new tokens whose keys and values still fit in the cache
    cached = min(max_new_tokens, max(room, 0))
    sequences = [list(p) for p in prompts]
    if cached > 0:
        padded = min(-(-longest // PROMPT_BUCKET) * PROMPT_BUCKET, context)
        tokens = np.zeros((len(prompts), padded), np.int32)
        for row, p in enumerate(prompts):
            tokens[row, : len(p)] = p
        lengths = np.asarray([len(p) for p in prompts], np.int32)
        stop = -1 if eos_id is None else eos_id
        out, counts = _generate_cached(model, jnp.asarray(tokens), jnp.asarray(lengths), jax.random.PRNGKey(seed),
                                       cached, float(temperature), top_k, top_p, stop)
        out, counts = np.asarray(out), np.asarray(counts)
        for row in range(len(prompts)):
            sequences[row] += out[row, : counts[row]].tolist()
    finished = [eos_id is not None and len(s) > len(p) and s[-1] == eos_id for s, p in zip(sequences, prompts)]
    rest = max_new_tokens - cached
    if rest > 0 and not all(finished):  # past the context: the window slides, nothing cached applies
        more = generate_no_cache(model, sequences, rest, temperature=temperature, top_k=top_k, top_p=top_p,
                                 seed=seed + 1, eos_id=eos_id)
        sequences = [s if f else s + m for s, m, f in zip(sequences, more, finished)]
    return [s[len(p):] for s, p in zip(sequences, prompts)]
