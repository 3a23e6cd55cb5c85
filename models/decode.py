"""Fast sampling: a jitted decode loop with a KV cache, so each new token costs one position, not the whole prefix.

`generate` prefills the cache with the prompts (one forward pass over the longest prompt; shorter ones are
right-padded and each row decodes from its own length), then runs the whole loop of new tokens inside one
`lax.while_loop`: one position per row through the model, sample. Rows stop at `<EOS>`; the loop stops when all
have. The cache lives in the model (`GPT.hidden(tokens, cache=...)`, models/gpt.py): decoding runs the very blocks
training runs, so there is no second copy of the model's arithmetic here.

The cache holds the model's context. A generation that would run past it continues without the cache, exactly as
`generate_no_cache` does (the window slides, so every position changes and nothing cached can be reused), drawing from
a key of its own, folded from the seed's.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from models.sampling import check_sampling, generate_no_cache, sample_logits

if TYPE_CHECKING:
    from models.gpt import GPT

PROMPT_BUCKET = 16  # prompts are padded to a multiple of this, so similar lengths share one compiled prefill


@functools.partial(eqx.filter_jit, donate="none")
def _generate_cached(
    model: GPT,
    tokens_BP: jax.Array,
    lengths_B: jax.Array,
    key: jax.Array,
    max_new: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    eos_id: int,
):
    """New tokens [B, max_new] (eos_id after a row's <EOS>) and how many each row generated."""
    B = tokens_BP.shape[0]
    h_BPD, cache = model.hidden(tokens_BP, cache=model.init_cache(B))
    cache = cache.with_lengths(lengths_B)  # right-padded prompts: each row continues from its own length
    last_BD = jnp.take_along_axis(h_BPD, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
    key, first_key = jax.random.split(key)
    vocab = model.cfg.vocab_size  # the padded rows' logits are finite: a high enough temperature would draw them
    first_B = sample_logits(model.logits(last_BD[:, None])[:, 0, :vocab], first_key, temperature, top_k, top_p)
    out_BN = jnp.full((B, max_new), eos_id, jnp.int32).at[:, 0].set(first_B.astype(jnp.int32))
    done_B = first_B == eos_id
    count_B = jnp.ones((B,), jnp.int32)

    def cond(carry):
        i, _, _, _, done_B, _ = carry
        return (i < max_new) & ~jnp.all(done_B)

    def body(carry):
        i, key, out_BN, cache, done_B, count_B = carry
        h_B1D, cache = model.hidden(out_BN[:, i - 1, None], cache=cache)
        logits_BV = model.logits(h_B1D)[:, 0, :vocab]
        key, step_key = jax.random.split(key)
        next_B = sample_logits(logits_BV, step_key, temperature, top_k, top_p).astype(jnp.int32)
        next_B = jnp.where(done_B, eos_id, next_B)
        out_BN = out_BN.at[:, i].set(next_B)
        count_B = count_B + (~done_B).astype(jnp.int32)
        return i + 1, key, out_BN, cache, done_B | (next_B == eos_id), count_B

    carry = (jnp.int32(1), key, out_BN, cache, done_B, count_B)
    _, _, out_BN, _, _, count_B = jax.lax.while_loop(cond, body, carry)
    return out_BN, count_B


def generate(
    model: GPT,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_id: int | None = None,
) -> list[list[int]]:
    """Continue each prompt by up to `max_new_tokens` ids (fewer once a row emits `eos_id`), with a KV cache.
    Same interface and, at temperature 0, the same tokens as `generate_no_cache`."""
    check_sampling(temperature, top_k, top_p)
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
        out, counts = _generate_cached(
            model,
            jnp.asarray(tokens),
            jnp.asarray(lengths),
            jax.random.PRNGKey(seed),
            cached,
            float(temperature),
            top_k,
            top_p,
            stop,
        )
        out, counts = np.asarray(out), np.asarray(counts)
        for row in range(len(prompts)):
            sequences[row] += out[row, : counts[row]].tolist()
    finished = [eos_id is not None and len(s) > len(p) and s[-1] == eos_id for s, p in zip(sequences, prompts)]
    rest = max_new_tokens - cached
    if rest > 0 and not all(finished):  # past the context: the window slides, nothing cached applies
        # a stream of its own: PRNGKey(seed + 1) would be the cached part's stream of seed + 1, its draws shared
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
        more = generate_no_cache(
            model, sequences, rest, temperature=temperature, top_k=top_k, top_p=top_p, seed=key, eos_id=eos_id
        )
        sequences = [s if f else s + m for s, m, f in zip(sequences, more, finished)]
    return [s[len(p) :] for s, p in zip(sequences, prompts)]
