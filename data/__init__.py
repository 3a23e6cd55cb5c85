"""Data: sources (documents or pieces) -> tokenizer -> numbered examples -> deterministic batches.

Three shapes of data, one interface (`Data`) and one pair of batch classes (data/batches.py) over one kind of
source, numbered examples (data/examples.py): text pretraining packs documents into one stream cut into windows;
text fine-tuning makes one `prompt <GENAI> completion` record per row; notes make records of `notes_per_record`
notes (pretraining) or of a piano task (fine-tuning), tokenised on the fly so that augmentation can vary them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from core.errors import DataError, warn
from data.batches import BatchSizes, EvalBatches, TrainBatches
from data.config import DataConfig, DatasetConfig, TextConfig
from data.examples import DocumentRows, Examples, Records, Windows
from data.mixture import MixtureTrainBatches
from data.note_sources import FULL_VAL_SPLIT
from data.packing import tokenize_prompts, tokenized_corpus
from data.sources import MixtureCorpus, TextCorpus
from data.tasks import NoteRecords
from data.token_shards import ShardCorpus, ShardStore
from data.token_store import TokenStore
from data.tokenizers import Tokenizer


class BatchSettings(Protocol):
    """What the batches take from the run's `train` section."""

    batch_size: int
    grad_accum_steps: int
    eval_iters: int
    seed: int


class RunData(Protocol):
    """What the data layer reads of the run's config (training/config/root.py `Config`)."""

    dataset: DatasetConfig
    data: DataConfig
    train: BatchSettings
    tasks: list[str]
    task_weights: list[float]
    loss_masking: str


@dataclass
class Data:
    train: TrainBatches | MixtureTrainBatches
    evals: dict[str, EvalBatches]  # the main validation split first, then the others
    test: EvalBatches | None
    token_bytes: np.ndarray  # [vocab] bytes of text per token id, for per-byte losses (all 0 for notes)
    summary: str  # one line for the start of the log: what each split holds

    @property
    def main_split(self) -> str:
        """The split whose loss picks the best checkpoint."""
        return next(iter(self.evals))

    def tokens_by_source(self, steps: int) -> dict[str, int]:
        """Training tokens each source of a mixture gave in the run's first `steps` steps ({} for a single source)."""
        return self.train.tokens_seen(steps) if isinstance(self.train, MixtureTrainBatches) else {}


def make_data(
    cfg: RunData,
    corpus: TextCorpus | MixtureCorpus | dict,
    tokenizer: Tokenizer,
    context: int,
    process_index: int,
    process_count: int,
    sizes: BatchSizes | None = None,
) -> Data:
    """Wrap every split of `corpus` in its batch source. `cfg`: the whole run config. `sizes`: the training batch's
    size step by step (the run's stages); None: train.batch_size at every step."""
    sizes = sizes or BatchSizes.constant(cfg.train.batch_size)
    if isinstance(corpus, MixtureCorpus):
        return _mixture_data(cfg, corpus, tokenizer, context, process_index, process_count, sizes)
    if tokenizer.kind == "notes":
        splits, main, summary = _note_records(cfg, corpus, tokenizer, context)
    elif cfg.dataset.records:
        splits, main, summary = _prompt_records(cfg, corpus, tokenizer, context)
    else:
        splits, main, summary = _stream_windows(cfg, corpus, tokenizer, context, process_index, process_count)
    t = cfg.train

    def eval_set(name: str) -> EvalBatches:
        return EvalBatches(splits[name], t.batch_size, t.eval_iters, process_index, process_count)

    return Data(
        train=TrainBatches(splits["train"], sizes, t.grad_accum_steps, process_index, process_count, t.seed),
        evals={name: eval_set(name) for name in _eval_order(list(splits), main)},
        test=eval_set("test") if "test" in splits else None,
        token_bytes=tokenizer.token_byte_lengths(),
        summary=summary,
    )


def _eval_order(names: list[str], main: str) -> list[str]:
    return [main] + [n for n in names if n not in ("train", main, "test")]


def _windows(
    d: TextConfig,
    corpus: TextCorpus | ShardCorpus,
    tokenizer: Tokenizer,
    context: int,
    process_index: int,
    process_count: int,
) -> tuple[TokenStore | ShardStore, dict[str, Windows | DocumentRows]]:
    """The corpus's token store and its splits' windows (the extra validation splits in order of name), each split
    checked to hold at least two windows."""
    if isinstance(corpus, ShardCorpus):  # tokenised already: the shards are the store
        store = corpus.store(tokenizer.vocab_size, tokenizer.token_byte_lengths())
    else:
        store = tokenized_corpus(corpus, tokenizer, d, process_index, process_count)
    eos = tokenizer.eos_id if d.document_mask else None
    splits = {}
    for name in store.splits:
        tokens = store.tokens(name)
        if name == "test" and len(tokens) == 0 and getattr(d, "test_fraction", None) == 0:
            continue  # a stream with test_fraction=0 holds an empty one: no test split, as when loaded whole
        if len(tokens) < 2 * context + 2:
            raise DataError(
                f"dataset {d.name}: split {name!r} has {len(tokens)} tokens, fewer than two windows of "
                f"{context}; add documents or lower dataset.context_size"
            )
        if name == "train" and d.document_starts:
            ends = store.document_ends(name) if isinstance(store, TokenStore) else None  # each after its <EOS>
            rows = DocumentRows(
                tokens,
                context,
                tokenizer.pad_id,
                tokenizer.eos_id,
                d.max_document_tokens,
                eos,
                None if ends is None else ends - 1,
            )
            if rows.num_examples < 2:
                raise DataError(
                    f"dataset {d.name}: split 'train' holds {rows.num_examples} rows that begin at a document; add "
                    "documents, lower dataset.context_size, or set dataset.document_starts=false"
                )
            splits[name] = rows
        else:
            splits[name] = Windows(tokens, context, tokenizer.pad_id, eos)
    return store, dict(sorted(splits.items()))


def _stream_windows(
    cfg: RunData, corpus: TextCorpus, tokenizer: Tokenizer, context: int, process_index: int, process_count: int
) -> tuple[dict[str, Examples], str, str]:
    store, splits = _windows(cfg.dataset, corpus, tokenizer, context, process_index, process_count)
    bytes_per_token = store.text_bytes("train") / max(len(splits["train"].tokens), 1)
    sizes = ", ".join(f"{name} {len(store.tokens(name)) / 1e6:.2f}M" for name in store.splits if name in splits)
    return splits, "val", f"tokens: {sizes} | {bytes_per_token:.2f} bytes/token"


def _mixture_data(
    cfg: RunData,
    corpus: MixtureCorpus,
    tokenizer: Tokenizer,
    context: int,
    process_index: int,
    process_count: int,
    sizes: BatchSizes,
) -> Data:
    """Training rows drawn from the sources by weight (data/mixture.py); evaluation on `val` (every source's
    validation split in proportion to its weight: the split that picks the best checkpoint) and on each source's
    own splits as `<name>/<split>`."""
    t = cfg.train
    sources = [
        _windows(d, part, tokenizer, context, process_index, process_count)[1]
        for part, d in zip(corpus.parts, corpus.configs)
    ]
    train = MixtureTrainBatches(
        corpus.names,
        corpus.weights,
        [
            TrainBatches(s["train"], sizes, t.grad_accum_steps, process_index, process_count, (t.seed, i))
            for i, s in enumerate(sources)
        ],
        sizes,
        t.grad_accum_steps,
        process_index,
        process_count,
        t.seed,
    )

    def eval_set(splits: list[Examples], weights: list[float] | None = None) -> EvalBatches:
        return EvalBatches(splits, t.batch_size, t.eval_iters, process_index, process_count, weights)

    def mixed(split: str) -> EvalBatches | None:
        have = [(s[split], w) for s, w in zip(sources, corpus.weights) if split in s]
        return eval_set([s for s, _ in have], [w for _, w in have]) if have else None

    evals = {"val": mixed("val")}
    for name, s in zip(corpus.names, sources):
        for split in _eval_order(list(s), "val"):
            evals[f"{name}/{split}"] = eval_set([s[split]])
    total = sum(corpus.weights)
    parts = ", ".join(
        f"{name} {w / total:.0%} (train {len(s['train'].tokens) / 1e6:.2f}M tokens)"
        for name, w, s in zip(corpus.names, corpus.weights, sources)
    )
    return Data(
        train=train,
        evals=evals,
        test=mixed("test"),
        token_bytes=tokenizer.token_byte_lengths(),
        summary=f"sources: {parts}",
    )


def _records(cfg: RunData, counts_and_makers: dict, tokenizer: Tokenizer, context: int) -> dict[str, Examples]:
    """`counts_and_makers`: split -> (number of records, make_record, evaluation places, or None for one per record);
    each split checked to hold a record."""
    genai = tokenizer.genai_id if cfg.loss_masking == "finetuning" else None
    for name, (n, _, _) in counts_and_makers.items():
        if n == 0:
            raise DataError(f"dataset {cfg.dataset.name}: split {name!r} has no records; add data")
    return {
        name: Records(n, make, context, tokenizer.pad_id, genai, fixed)
        for name, (n, make, fixed) in counts_and_makers.items()
    }


def _note_records(
    cfg: RunData, corpus: dict, tokenizer: Tokenizer, context: int
) -> tuple[dict[str, Examples], str, str]:
    d = cfg.dataset
    records = {}
    for name, pieces in corpus.items():
        train = name == "train"
        split = NoteRecords(
            pieces,
            tokenizer,
            cfg.data.notes_per_record,
            d.pause_detection_threshold,
            context,
            list(cfg.tasks),
            list(cfg.task_weights),
            d.augmentation.max_pitch_shift if train else 0,
            list(d.augmentation.speed_change_factors) if train else [],
        )
        records[name] = (len(split), split.sequence, split.num_fixed)
    counts = ", ".join(f"{name} {len(corpus[name])}/{n}" for name, (n, _, _) in records.items())
    what = f"tasks {', '.join(cfg.tasks)}" if cfg.tasks else "next-token"
    summary = (
        f"pieces/records: {counts} | {cfg.data.notes_per_record} notes per record, {what}, "
        f"loss masking {cfg.loss_masking}"
    )
    return _records(cfg, records, tokenizer, context), FULL_VAL_SPLIT, summary


def _prompt_records(
    cfg: RunData, corpus: TextCorpus, tokenizer: Tokenizer, context: int
) -> tuple[dict[str, Examples], str, str]:
    """One `prompt <GENAI> completion <EOS>` record per row, tokenised once (cached by datasets). Fine-tuning counts
    only targets after `<GENAI>`: a row whose prompt fills the context has none in its cut row, and trains (or scores)
    nothing: said in the summary and in a warning, refused when a split has nothing else."""
    records, blind = {}, {}
    for name, ds in corpus.datasets.items():
        rows, genai_at = tokenize_prompts(ds, tokenizer)
        records[name] = (len(rows), lambda i, rng, rows=rows: rows[i], None)
        blind[name] = int(np.sum(genai_at >= context)) if cfg.loss_masking == "finetuning" else 0
        if blind[name] and blind[name] == len(rows):
            raise DataError(
                f"dataset {cfg.dataset.name}: every record of split {name!r} has a prompt of model.context_size="
                f"{context} tokens or more, so no completion token is within a row; raise model.context_size or "
                "shorten the prompts"
            )
        if blind[name]:
            warn(
                f"dataset {cfg.dataset.name}: {blind[name]} of {len(rows)} {name} records have a prompt of "
                f"model.context_size={context} tokens or more: no completion token is within their rows, and they "
                f"{'train' if name == 'train' else 'score'} nothing; raise model.context_size or shorten those prompts"
            )
    counts = ", ".join(
        f"{name} {n}" + (f" ({blind[name]} without a target in the context)" if blind[name] else "")
        for name, (n, _, _) in records.items()
    )
    summary = f"records: {counts} | prompt <GENAI> completion, loss masking {cfg.loss_masking}"
    return _records(cfg, records, tokenizer, context), "val", summary
