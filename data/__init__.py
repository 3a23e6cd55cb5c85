"""Data: sources (documents or pieces) -> tokenizer -> packed token streams or records -> deterministic batches.

Three shapes of data, one interface (`Data`): text pretraining packs documents into one stream cut into windows;
text fine-tuning makes one `prompt <GENAI> completion` record per row; notes make records of `notes_per_record`
notes (pretraining) or of a piano task (fine-tuning), tokenised on the fly so that augmentation can vary them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from data.packing import EvalBatches, TrainBatches, tokenized_corpus
from data.records import RecordBatches, RecordEvalBatches
from data.tokenizers import Tokenizer
from training.errors import DataError


@dataclass
class Data:
    train: TrainBatches | RecordBatches
    evals: dict[str, EvalBatches | RecordEvalBatches]  # the main validation split first, then the others
    test: EvalBatches | RecordEvalBatches | None
    token_bytes: np.ndarray  # [vocab] bytes of text per token id, for per-byte losses (all 0 for notes)
    summary: str  # one line for the start of the log: what each split holds

    @property
    def main_split(self) -> str:
        """The split whose loss picks the best checkpoint."""
        return next(iter(self.evals))


def make_data(cfg: Any, corpus: dict, tokenizer: Tokenizer, context: int, process_index: int, process_count: int) -> Data:
    """Wrap every split of `corpus` in its batch source. `cfg`: the whole run config."""
    if tokenizer.kind == "notes":
        return _note_data(cfg, corpus, tokenizer, context, process_index, process_count)
    if cfg.dataset.prompt_column:
        return _prompt_data(cfg, corpus, tokenizer, context, process_index, process_count)
    return _stream_data(cfg, corpus, tokenizer, context, process_index, process_count)


def _eval_order(names: list[str], main: str) -> list[str]:
    return [main] + [n for n in names if n not in ("train", main, "test")]


def _stream_data(cfg: Any, corpus: dict, tokenizer: Tokenizer, context: int, process_index: int,
                 process_count: int) -> Data:
    store = tokenized_corpus(corpus, tokenizer, cfg.dataset, process_index, process_count)
    streams = {name: store.tokens(name) for name in store.splits}
    for name, tokens in streams.items():
        if len(tokens) < 2 * context + 2:
            raise DataError(
                f"dataset {cfg.dataset.name}: split {name!r} has {len(tokens)} tokens, fewer than two windows of "
                f"{context}; add documents or lower dataset.context_size"
            )
    t = cfg.train
    eos = tokenizer.eos_id if cfg.dataset.document_mask else None
    train = TrainBatches(streams["train"], context, t.batch_size, t.grad_accum_steps, process_index, process_count,
                         t.seed, tokenizer.pad_id, eos)

    def eval_set(name: str) -> EvalBatches:
        return EvalBatches(streams[name], context, t.batch_size, t.eval_iters, process_index, process_count,
                           tokenizer.pad_id, eos)

    bytes_per_token = store.text_bytes("train") / max(len(streams["train"]), 1)
    splits = ", ".join(f"{name} {len(tokens) / 1e6:.2f}M" for name, tokens in streams.items())
    names = ["val"] + sorted(n for n in streams if n not in ("train", "val", "test"))
    return Data(
        train=train,
        evals={name: eval_set(name) for name in _eval_order(names, "val")},
        test=eval_set("test") if "test" in streams else None,
        token_bytes=tokenizer.token_byte_lengths(),
        summary=f"tokens: {splits} | {bytes_per_token:.2f} bytes/token",
    )


def _records_data(cfg: Any, records: dict, tokenizer: Tokenizer, context: int, process_index: int,
                  process_count: int, main: str, summary: str) -> Data:
    """`records`: split -> (number of records, make_record)."""
    t, finetuning = cfg.train, cfg.loss_masking == "finetuning"
    for name, (n, _) in records.items():
        if n == 0:
            raise DataError(f"dataset {cfg.dataset.name}: split {name!r} has no records; add data")
    n, make = records["train"]
    train = RecordBatches(n, make, context, t.batch_size, t.grad_accum_steps, process_index, process_count, t.seed,
                          tokenizer.pad_id, tokenizer.genai_id, finetuning)

    def eval_set(name: str) -> RecordEvalBatches:
        n, make = records[name]
        return RecordEvalBatches(n, make, context, t.batch_size, t.eval_iters, process_index, process_count,
                                 tokenizer.pad_id, tokenizer.genai_id, finetuning)

    return Data(
        train=train,
        evals={name: eval_set(name) for name in _eval_order(list(records), main)},
        test=eval_set("test") if "test" in records else None,
        token_bytes=tokenizer.token_byte_lengths(),
        summary=summary,
    )


def _note_data(cfg: Any, corpus: dict, tokenizer: Any, context: int, process_index: int, process_count: int) -> Data:
    from data.note_sources import FULL_VAL_SPLIT
    from data.tasks import NoteRecords

    d = cfg.dataset
    records = {}
    for name, pieces in corpus.items():
        train = name == "train"
        split = NoteRecords(pieces, tokenizer, cfg.data.notes_per_record, d.pause_detection_threshold, context,
                            list(cfg.tasks), list(cfg.task_weights),
                            d.augmentation.max_pitch_shift if train else 0,
                            list(d.augmentation.speed_change_factors) if train else [])
        records[name] = (len(split), split.sequence)
    counts = ", ".join(f"{name} {len(corpus[name])}/{n}" for name, (n, _) in records.items())
    what = f"tasks {', '.join(cfg.tasks)}" if cfg.tasks else "next-token"
    summary = (f"pieces/records: {counts} | {cfg.data.notes_per_record} notes per record, {what}, "
               f"loss masking {cfg.loss_masking}")
    return _records_data(cfg, records, tokenizer, context, process_index, process_count, FULL_VAL_SPLIT, summary)


def _prompt_data(cfg: Any, corpus: dict, tokenizer: Tokenizer, context: int, process_index: int,
                 process_count: int) -> Data:
    """One `prompt <GENAI> completion <EOS>` record per row, tokenised once (cached by datasets)."""
    from data.packing import tokenize_prompts

    records = {}
    for name, ds in corpus.datasets.items():
        rows = tokenize_prompts(ds, tokenizer)
        records[name] = (len(rows), lambda i, rng, rows=rows: rows[i])
    counts = ", ".join(f"{name} {n}" for name, (n, _) in records.items())
    summary = f"records: {counts} | prompt <GENAI> completion, loss masking {cfg.loss_masking}"
    return _records_data(cfg, records, tokenizer, context, process_index, process_count, "val", summary)
