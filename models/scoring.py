"""How likely the model finds a continuation of a context: the summed log-probability of its tokens, and whether
greedy decoding would have produced it (what cloze and multiple-choice benchmarks ask of a language model).

A request is token ids (context, continuation). The model sees at most its context of tokens, so the context loses
its oldest tokens first and the continuation is kept whole. Requests are right-padded to the next of a few fixed
lengths (powers of two up to the context) and grouped by that length, so jit compiles a handful of shapes rather
than one per request; right padding leaves the real tokens' log-probabilities unchanged (attention is causal).
The log-probability is computed as the training loss computes it: the target's logit minus log(Z), in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from models.gpt import GPT

SHORTEST_LENGTH = 16  # the smallest padded length; shorter requests share it
DEFAULT_BATCH_TOKENS = 8192  # padded tokens per call: rows = this // padded length (logits are rows x length x vocab)


def padded_lengths(context_size: int) -> list[int]:
    """The lengths requests are padded to: powers of two from SHORTEST_LENGTH, and the context itself."""
    lengths, n = [], SHORTEST_LENGTH
    while n < context_size:
        lengths.append(n)
        n *= 2
    return lengths + [context_size]


def padded_rows(n: int, most: int) -> int:
    """Rows of a call that has `n` requests and room for `most`: the next power of two, so calls have few shapes."""
    return min(most, 1 << (n - 1).bit_length())


@eqx.filter_jit
def _score_rows(
    model: GPT, inputs_BL: jax.Array, targets_BL: jax.Array, first_B: jax.Array, end_B: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Per row: the summed log-probability of the targets at positions [first, end), and whether each of them is
    the most likely token there."""
    logits_BLV = model(inputs_BL).astype(jnp.float32)
    log_z_BL = jax.nn.logsumexp(logits_BLV, axis=-1)
    target_logit_BL = jnp.take_along_axis(logits_BLV, targets_BL[..., None], axis=-1)[..., 0]
    greedy_BL = jnp.argmax(logits_BLV, axis=-1) == targets_BL
    t_L = jnp.arange(inputs_BL.shape[1])
    scored_BL = (t_L >= first_B[:, None]) & (t_L < end_B[:, None])
    logprob_B = jnp.sum(jnp.where(scored_BL, target_logit_BL - log_z_BL, 0.0), axis=1)
    return logprob_B, jnp.all(greedy_BL | ~scored_BL, axis=1)


def continuation_logprobs(
    model: GPT, requests: Sequence[tuple[Sequence[int], Sequence[int]]], batch_tokens: int = DEFAULT_BATCH_TOKENS
) -> list[tuple[float, bool]]:
    """(log P(continuation | context), is the continuation greedy) for each (context ids, continuation ids).

    Every context needs at least one token (e.g. <EOS> for "no context"); a continuation may be as long as the
    model's context. `batch_tokens` bounds the padded tokens of one call; results do not depend on it."""
    context_size = model.cfg.context_size
    rows = []  # (inputs, targets, first scored position)
    for context, continuation in requests:
        if not context or not continuation or len(continuation) > context_size:
            raise ValueError(
                f"a request needs a context of at least one token and a continuation of 1 to "
                f"{context_size} tokens; got {len(context)} and {len(continuation)}"
            )
        window = (list(context) + list(continuation))[-(context_size + 1) :]
        rows.append((window[:-1], window[1:], len(window) - 1 - len(continuation)))
    lengths = padded_lengths(context_size)
    results: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # longest first: each length's rows together
    by_length: dict[int, list[int]] = {}
    for i in order:
        by_length.setdefault(next(n for n in lengths if n >= len(rows[i][0])), []).append(i)
    for length, indices in by_length.items():
        most_rows = max(1, batch_tokens // length)
        for start in range(0, len(indices), most_rows):
            chunk = indices[start : start + most_rows]
            n_rows = padded_rows(len(chunk), most_rows)
            inputs, targets = np.zeros((n_rows, length), np.int32), np.zeros((n_rows, length), np.int32)
            first, end = np.zeros(n_rows, np.int32), np.zeros(n_rows, np.int32)  # padding rows score nothing
            for r, i in enumerate(chunk):
                row_inputs, row_targets, row_first = rows[i]
                inputs[r, : len(row_inputs)], targets[r, : len(row_targets)] = row_inputs, row_targets
                first[r], end[r] = row_first, len(row_inputs)
            logprob, greedy = _score_rows(
                model, jnp.asarray(inputs), jnp.asarray(targets), jnp.asarray(first), jnp.asarray(end)
            )
            logprob, greedy = np.asarray(logprob), np.asarray(greedy)
            for r, i in enumerate(chunk):
                results[i] = (float(logprob[r]), bool(greedy[r]))
    return results
