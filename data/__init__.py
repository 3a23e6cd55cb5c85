"""Data: sources (documents or pieces) -> tokenizer -> packed token streams or records -> deterministic batches.

Three shapes of data, one interface (`Data`): text pretraining packs documents into one stream cut into windows;
text fine-tuning makes one `prompt <GENAI> completion` record per row; notes make records of `notes_per_record`
notes (pretraining) or of a piano task (fine-tuning), tokenised on the fly so that augmentation can vary them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import DataError
from data.mixture import MixtureTrainBatches
from data.packing import EvalBatches, TrainBatches, tokenized_corpus
from data.records import RecordBatches, RecordEvalBatches
from data.sources import MixtureCorpus, TextCorpus
from data.token_store import TokenStore
from data.tokenizers import Tokenizer


@dataclass
class Data:
    train: TrainBatches | MixtureTrainBatches | RecordBatches
    evals: dict[str, EvalBatches | RecordEvalBatches]  # the main validation split first, then the others
    test: EvalBatches | RecordEvalBatches | None
    token_bytes: np.ndarray  # [vocab] bytes of text per token id, for per-byte losses (all 0 for notes)
    summary: str  # one line for the start of the log: what each split holds

    @property
    def main_split(self) -> str:
        """The split whose loss picks the best checkpoint."""
        return next(iter(self.evals))

    def tokens_by_source(self, steps: int) -> dict[str, int]:
        """Training tokens each source of a mixture gave in the run's first `steps` steps ({} for a single source)."""
        return self.train.tokens_seen(steps) if isinstance(self.train, MixtureTrainBatches) else {}


def make_data(cfg: Any, corpus: dict, tokenizer: Tokenizer, context: int, process_index: int, process_count: int) -> Data:
    """Wrap every split of `corpus` in its batch source. `cfg`: the whole run config."""
    if tokenizer.kind == "notes":
        return _note_data(cfg, corpus, tokenizer, context, process_index, process_count)
    if cfg.dataset.prompt_column:
        return _prompt_data(cfg, corpus, tokenizer, context, process_index, process_count)
    if isinstance(corpus, MixtureCorpus):
        return _mixture_data(cfg, corpus, tokenizer, context, process_index, process_count)
    return _stream_data(cfg, corpus, tokenizer, context, process_index, process_count)


def _eval_order(names: list[str], main: str) -> list[str]:
    return [main] + [n for n in names if n not in ("train", main, "test")]


def _token_streams(d: Any, corpus: TextCorpus, tokenizer: Tokenizer, context: int, process_index: int,
                   process_count: int) -> tuple[TokenStore, dict[str, np.ndarray]]:
    """The corpus's token store and its splits, each checked to hold at least two windows."""
    store = tokenized_corpus(corpus, tokenizer, d, process_index, process_count)
    streams = {name: store.tokens(name) for name in store.splits}
    for name, tokens in streams.items():
        if len(tokens) < 2 * context + 2:
            raise DataError(
                f"dataset {d.name}: split {name!r} has {len(tokens)} tokens, fewer than two windows of "
                f"{context}; add documents or lower dataset.context_size"
            )
    return store, streams


def _stream_data(cfg: Any, corpus: TextCorpus, tokenizer: Tokenizer, context: int, process_index: int,
                 process_count: int) -> Data:
    store, streams = _token_streams(cfg.dataset, corpus, tokenizer, context, process_index, process_count)
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


def _mixture_data(cfg: Any, corpus: MixtureCorpus, tokenizer: Tokenizer, context: int, process_index: int,
                  process_count: int) -> Data:
    """Training rows drawn from the sources by weight (data/mixture.py); evaluation on `val` (every source's
    validation split in proportion to its weight: the split that picks the best checkpoint) and on each source's
    own splits as `<name>/<split>`."""
    t, eos = cfg.train, tokenizer.eos_id if cfg.dataset.document_mask else None
    streams = [_token_streams(d, part, tokenizer, context, process_index, process_count)[1]
               for part, d in zip(corpus.parts, corpus.configs)]
    train = MixtureTrainBatches(
        corpus.names, corpus.weights,
        [TrainBatches(s["train"], context, t.batch_size, t.grad_accum_steps, process_index, process_count,
                      (t.seed, i), tokenizer.pad_id, eos) for i, s in enumerate(streams)],
        t.batch_size, t.grad_accum_steps, process_index, process_count, t.seed)

    def eval_set(splits: list[np.ndarray], weights: list[float] | None = None) -> EvalBatches:
        return EvalBatches(splits, context, t.batch_size, t.eval_iters, process_index, process_count,
                           tokenizer.pad_id, eos, weights)

    def mixed(split: str) -> EvalBatches | None:
        have = [(s[split], w) for s, w in zip(streams, corpus.weights) if split in s]
        return eval_set([s for s, _ in have], [w for _, w in have]) if have else None

    evals = {"val": mixed("val")}
    for name, s in zip(corpus.names, streams):
        for split in ["val"] + sorted(k for k in s if k not in ("train", "val", "test")):
            evals[f"{name}/{split}"] = eval_set([s[split]])
    total = sum(corpus.weights)
    parts = ", ".join(f"{name} {w / total:.0%} (train {len(s['train']) / 1e6:.2f}M tokens)"
                      for name, w, s in zip(corpus.names, corpus.weights, streams))
    return Data(train=train, evals=evals, test=mixed("test"), token_bytes=tokenizer.token_byte_lengths(),
                summary=f"sources: {parts}")


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
