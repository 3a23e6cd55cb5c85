"""Evaluation over named splits: loss per token, perplexity, and loss per byte of text (nats and bits).

Per-byte figures divide the summed loss by the UTF-8 bytes of the target tokens' text (special tokens count 0 bytes),
so they compare across tokenizers; notes have none. Only targets with `loss_mask` 1 count: after fine-tuning masking,
the loss is the target tokens' loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import jax
import numpy as np
from jax.sharding import Mesh

from training.distributed.sharding import put_batch

if TYPE_CHECKING:
    from models.gpt import GPT


def evaluate(
    eval_step: Callable,
    model: GPT,
    splits: Mapping[str, Iterable[dict[str, np.ndarray]]],
    mesh: Mesh,
    token_bytes: np.ndarray,
) -> dict[str, dict[str, float]]:
    pending = {}
    for name, batches in splits.items():
        sums = []
        for batch in batches:
            batch = {
                **batch,
                "target_bytes": (token_bytes[batch["targets"]] * (batch["loss_mask"] > 0)).astype(np.int32),
            }
            sums.append(eval_step(model, put_batch(batch, mesh)))
        pending[name] = sums
    fetched = jax.device_get(pending)  # one transfer after all splits were dispatched (returns keys sorted)
    results = {}
    for name in splits:
        sums = fetched[name]
        nll = float(sum(float(s[0]) for s in sums))
        tokens = float(sum(float(s[1]) for s in sums))
        nbytes = float(sum(int(s[2]) for s in sums))
        loss = nll / max(tokens, 1.0)
        results[name] = {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "tokens": tokens}
        if nbytes > 0:  # text; notes tokens stand for no bytes
            results[name].update(nats_per_byte=nll / nbytes, bits_per_byte=nll / nbytes / math.log(2), bytes=nbytes)
    return results
