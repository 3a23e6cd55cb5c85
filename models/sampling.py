"""Sampling from a trained model: temperature, top-k, top-p, stop at <EOS>, seedable.

`generate_no_cache` recomputes the whole window for every new token: simple, and the reference the KV-cached decoder
is checked against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError

if TYPE_CHECKING:
    from models.gpt import GPT


def check_sampling(
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    names: tuple[str, str, str] = ("temperature", "top_k", "top_p"),
) -> None:
    """Values that would sample from another distribution than asked (a negative temperature inverts it): one line,
    naming each value by `names` (a tool's flags)."""
    if not 0 <= temperature < float("inf"):  # NaN too: it drew id 0 every time
        raise ConfigError(f"{names[0]}: must be a finite number >= 0 (0: the most likely token); got {temperature}")
    if top_k is not None and top_k < 0:
        raise ConfigError(f"{names[1]}: must be >= 1, or 0 / none for every token; got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"{names[2]}: must be in (0, 1]; got {top_p}")


def sample_logits(
    logits_BV: jax.Array, key: jax.Array, temperature: float, top_k: int | None, top_p: float | None
) -> jax.Array:
    """One token id per row. temperature 0 = greedy; top_k / top_p keep the k most likely ids / the smallest set
    whose probability reaches p."""
    logits_BV = logits_BV.astype(jnp.float32)
    if temperature == 0.0:
        return jnp.argmax(logits_BV, axis=-1)
    # from each row's largest: a tiny temperature then makes the others -inf, not every logit +-inf (which drew id 0)
    top = logits_BV.max(axis=-1, keepdims=True)
    logits_BV = (logits_BV - jnp.where(jnp.isfinite(top), top, 0.0)) / temperature
    if top_k is not None and top_k > 0:
        kth = jax.lax.top_k(logits_BV, min(top_k, logits_BV.shape[-1]))[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
    if top_p is not None and top_p < 1.0:
        sorted_desc = jnp.sort(logits_BV, axis=-1)[:, ::-1]
        cumulative = jnp.cumsum(jax.nn.softmax(sorted_desc, axis=-1), axis=-1)
        # the smallest logit still inside the nucleus: keep every id at least that likely
        cutoff_index = jnp.sum(cumulative < top_p, axis=-1, keepdims=True)
        cutoff = jnp.take_along_axis(sorted_desc, cutoff_index, axis=-1)
        logits_BV = jnp.where(logits_BV < cutoff, -jnp.inf, logits_BV)
    return jax.random.categorical(key, logits_BV, axis=-1)


@eqx.filter_jit
def _next_token(
    model: GPT,
    window_BC: jax.Array,
    lengths_B: jax.Array,
    key: jax.Array,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> jax.Array:
    logits_BCV = model(window_BC)
    last_BV = jnp.take_along_axis(logits_BCV, (lengths_B - 1)[:, None, None], axis=1)[:, 0, : model.cfg.vocab_size]
    return sample_logits(last_BV, key, temperature, top_k, top_p)  # not the padded rows (finite: decode.py)


def generate_no_cache(
    model: GPT,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | jax.Array = 0,
    eos_id: int | None = None,
) -> list[list[int]]:
    """Continue each prompt by up to `max_new_tokens` ids (fewer once a row emits `eos_id`). Prompts may differ in
    length; when a sequence outgrows the context, the model sees its last `context_size` tokens. `seed`: an int, or
    a PRNG key (models/decode.py's stream past the context)."""
    check_sampling(temperature, top_k, top_p)
    context = model.cfg.context_size
    key = seed if isinstance(seed, jax.Array) else jax.random.PRNGKey(seed)
    sequences = [list(p) for p in prompts]
    done = [False] * len(prompts)
    for _ in range(max_new_tokens):
        window = np.zeros((len(sequences), context), np.int32)
        lengths = np.zeros(len(sequences), np.int32)
        for row, seq in enumerate(sequences):
            tail = seq[-context:]
            window[row, : len(tail)] = tail
            lengths[row] = len(tail)
        key, step_key = jax.random.split(key)
        next_ids = np.asarray(_next_token(model, window, lengths, step_key, temperature, top_k, top_p))
        for row, token in enumerate(next_ids):
            if not done[row]:
                sequences[row].append(int(token))
                done[row] = eos_id is not None and int(token) == eos_id
        if all(done):
            break
    return [seq[len(p) :] for seq, p in zip(sequences, prompts)]
