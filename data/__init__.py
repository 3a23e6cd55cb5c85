"""Data: sources (documents) -> tokenizer -> packed token streams -> deterministic batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from data.packing import EvalBatches, TrainBatches, tokenize_split
from data.tokenizers import Tokenizer
from training.errors import DataError

MAIN_VAL_SPLIT = "val"


@dataclass
class Data:
    train: TrainBatches
    evals: dict[str, EvalBatches]  # the main validation split first, then any extra ones
    test: EvalBatches | None
    token_bytes: np.ndarray  # [vocab] bytes of text per token id, for per-byte losses
    split_tokens: dict[str, int]  # tokens in each split


def make_data(cfg: Any, corpus: dict, tokenizer: Tokenizer, context: int, process_index: int, process_count: int) -> Data:
    """Tokenise every split of `corpus` and wrap it in its batch source. `cfg`: the whole run config."""
    streams = {name: tokenize_split(ds, tokenizer, cfg.dataset.num_proc) for name, ds in corpus.items()}
    for name, tokens in streams.items():
        if len(tokens) < 2 * context + 2:
            raise DataError(
                f"dataset {cfg.dataset.name}: split {name!r} has {len(tokens)} tokens, fewer than two windows of "
                f"{context}; add documents or lower dataset.context_size"
            )
    t = cfg.train
    train = TrainBatches(streams["train"], context, t.batch_size, t.grad_accum_steps, process_index, process_count,
                         t.seed, tokenizer.pad_id)

    def eval_set(name: str) -> EvalBatches:
        return EvalBatches(streams[name], context, t.batch_size, t.eval_iters, process_index, process_count,
                           tokenizer.pad_id)

    eval_names = [MAIN_VAL_SPLIT] + sorted(n for n in streams if n not in ("train", MAIN_VAL_SPLIT, "test"))
    return Data(
        train=train,
        evals={name: eval_set(name) for name in eval_names},
        test=eval_set("test") if "test" in streams else None,
        token_bytes=tokenizer.token_byte_lengths(),
        split_tokens={name: len(tokens) for name, tokens in streams.items()},
    )
