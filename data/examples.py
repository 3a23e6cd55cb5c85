"""A split as a source of numbered examples: what one row of a batch holds before it becomes inputs and targets.

Two kinds, one interface (`Examples`): `Windows` of context + 1 tokens cut from a split's packed token stream (text
pretraining), and `Records`, one sequence per example, padded or cut to context + 1 (notes, tokenised on the fly so
that augmentation can vary them; `prompt <GENAI> completion <EOS>` rows for text fine-tuning). An epoch visits every
example once, in an order drawn from (seed, epoch) (`epoch_order`); an evaluation set takes examples at fixed places
(`fixed_ids`); `rows` reads them. The examples also say how their targets count (`batch`): `<PAD>` never, with
`genai_id` only after `<GENAI>`, and with `eos_id` each document of a window attends only to itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from data.shuffle import IndexShuffle

Seed = int | tuple[int, ...]  # the run's seed, or (run seed, source index) for one source of a mixture
MakeRecord = Callable[[int, "np.random.Generator | None"], list[int]]  # (record index, rng or None) -> token ids


def seeded_rng(seed: Seed, *more: int) -> np.random.Generator:
    """A generator drawn from the seed and more integers (an epoch; a sample number): nothing else."""
    return np.random.Generator(np.random.PCG64([*np.atleast_1d(seed).tolist(), *more]))


def token_batch(
    rows: np.ndarray, pad_id: int, eos_id: int | None = None, genai_id: int | None = None
) -> dict[str, np.ndarray]:
    """[..., T+1] token rows -> inputs/targets/loss_mask of shape [..., T]. `loss_mask` is 1 where the target is not
    `<PAD>` and, with `genai_id` (fine-tuning), comes after a `<GENAI>`. With `eos_id` (document masking) also
    `segment_ids`: the number of <EOS> at or before each input in its row, so a document's segment begins at the
    <EOS> before it, its BOS (as the speedrun's do, and as sampling's prompts begin: the model reads a document's
    first token after an <EOS> in training too); the row's tokens before its first <EOS> are segment 0."""
    inputs = rows[..., :-1].astype(np.int32)
    targets = rows[..., 1:].astype(np.int32)
    mask = targets != pad_id
    if genai_id is not None:  # target j counts when a <GENAI> came at or before input j
        mask &= np.cumsum(inputs == genai_id, axis=-1) > 0
    batch = {"inputs": inputs, "targets": targets, "loss_mask": mask.astype(np.float32)}
    if eos_id is not None:
        batch["segment_ids"] = np.cumsum(inputs == eos_id, axis=-1).astype(np.int32)
    return batch


class Examples(ABC):
    """A split's examples: `num_examples` per training epoch, `num_fixed` places for a fixed evaluation set."""

    context: int
    pad_id: int
    eos_id: int | None = None  # set: batches carry segment_ids (document masking)
    genai_id: int | None = None  # set: only targets after <GENAI> count (fine-tuning)
    num_examples: int
    num_fixed: int

    @abstractmethod
    def epoch_order(self, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
        """An epoch's order, drawn from `rng`: positions in the epoch (0 .. num_examples - 1) -> example ids."""

    @abstractmethod
    def fixed_ids(self, places: np.ndarray) -> np.ndarray:
        """Example ids of the fixed places 0 .. num_fixed - 1 (evaluation)."""

    @abstractmethod
    def rows(self, ids: np.ndarray, seed: Seed = 0, samples: np.ndarray | None = None) -> np.ndarray:
        """[*ids.shape, context + 1] token rows of these examples. `samples`: the run-wide sample number of each,
        from which (with `seed`) a record draws its augmentation; None (evaluation): no augmentation."""

    def batch(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return token_batch(rows, self.pad_id, self.eos_id, self.genai_id)


class Windows(Examples):
    """Windows of context + 1 tokens cut from a packed token stream (documents each followed by <EOS>). An epoch
    starts at an offset drawn from (seed, epoch) and takes every window from there once, in an order evaluated per
    window (data/shuffle.py: never materialised, so its memory does not grow with the split); evaluation takes
    windows from offset 0. An example's id is where its window starts."""

    def __init__(self, tokens: np.ndarray, context: int, pad_id: int, eos_id: int | None = None) -> None:
        self.tokens, self.context, self.pad_id, self.eos_id = tokens, context, pad_id, eos_id
        # One window's worth of slack so that every epoch's random start offset keeps all windows in range.
        self.num_examples = max((len(tokens) - 1 - context) // context, 0)
        self.num_fixed = max((len(tokens) - 1) // context, 0)

    def epoch_order(self, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
        offset = int(rng.integers(self.context))
        shuffle = IndexShuffle(self.num_examples, rng)
        return lambda positions: offset + shuffle[positions] * self.context

    def fixed_ids(self, places: np.ndarray) -> np.ndarray:
        return places * self.context

    def rows(self, ids: np.ndarray, seed: Seed = 0, samples: np.ndarray | None = None) -> np.ndarray:
        rows = np.empty(ids.shape + (self.context + 1,), self.tokens.dtype)
        for idx, start in np.ndenumerate(ids):
            rows[idx] = self.tokens[start : start + self.context + 1]
        return rows


class DocumentRows(Examples):
    """Training rows that each begin at a document, as the GPT-2 speedrun's batches do: a document's piece is the
    <EOS> before it (standing as its BOS; the split's first document has none) and its tokens, cut to
    `max_document_tokens` when set; a row takes pieces in order until it holds context + 1 tokens, its last piece cut
    there, and the next row begins at the next document, so what a row cuts off is never read. Without a cut the pieces
    are contiguous and a row is a window that starts at an <EOS>. The rows are fixed by the split alone (worked out
    once, a binary search per row); an epoch visits them in an order drawn from (seed, epoch), as `Windows` does. A
    split too short for one row has none; evaluation (`fixed_ids`) takes the rows in order. `eos_positions`: where
    the documents' <EOS> are (a token store keeps their ends); without it the split is read for them, a chunk at a
    time."""

    def __init__(
        self,
        tokens: np.ndarray,
        context: int,
        pad_id: int,
        document_eos: int,
        max_document_tokens: int | None = None,
        eos_id: int | None = None,
        eos_positions: np.ndarray | None = None,
    ) -> None:
        self.tokens, self.context, self.pad_id, self.eos_id = tokens, context, pad_id, eos_id
        if eos_positions is None:
            eos_positions = token_positions(tokens, document_eos)
        starts = np.asarray(eos_positions, np.int64)
        if len(tokens) and (not len(starts) or starts[0] != 0):
            starts = np.concatenate([[0], starts])
        ends = np.append(starts[1:], len(tokens))
        if max_document_tokens is not None:
            ends = np.minimum(ends, starts + max_document_tokens)
        self.starts, self.ends = starts.astype(np.int64), ends.astype(np.int64)
        filled = np.concatenate([[0], np.cumsum(self.ends - self.starts)])  # tokens in pieces before piece i
        first, firsts = 0, []
        while first < len(starts) and filled[-1] - filled[first] >= context + 1:
            firsts.append(first)
            last = int(np.searchsorted(filled, filled[first] + context + 1)) - 1  # the piece the row ends in
            first = last + 1
        self.firsts = np.asarray(firsts, np.int64)  # each row's first piece
        self.num_examples = self.num_fixed = len(self.firsts)

    def epoch_order(self, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
        shuffle = IndexShuffle(self.num_examples, rng)
        return lambda positions: shuffle[positions]

    def fixed_ids(self, places: np.ndarray) -> np.ndarray:
        return places

    def rows(self, ids: np.ndarray, seed: Seed = 0, samples: np.ndarray | None = None) -> np.ndarray:
        rows = np.empty(ids.shape + (self.context + 1,), self.tokens.dtype)
        for idx, row in np.ndenumerate(ids):
            out, piece = rows[idx], int(self.firsts[row])
            at = 0
            while at < len(out):
                start, end = self.starts[piece], self.ends[piece]
                n = min(end - start, len(out) - at)
                out[at : at + n] = self.tokens[start : start + n]
                at, piece = at + n, piece + 1
        return rows


def token_positions(tokens, token: int, chunk: int = 1 << 24) -> np.ndarray:
    """Positions of `token` in a (memory-mapped or sharded) token sequence, read `chunk` tokens at a time."""
    found = [np.flatnonzero(np.asarray(tokens[i : i + chunk]) == token) + i for i in range(0, len(tokens), chunk)]
    return np.concatenate(found) if found else np.zeros(0, np.int64)


class Records(Examples):
    """`num_records` records, each `make_record(index, rng)`: its token ids, `rng` seeded from (seed, 1, sample
    number) in training and None in evaluation (no augmentation, the same records every time). An epoch is a
    permutation of the records drawn from (seed, epoch); an example's id is its record's index. An evaluation set's
    places are `num_fixed` (the records, unless given: piano tasks score each record under every task), each its own
    id, read by `make_record(place, None)`."""

    def __init__(
        self,
        num_records: int,
        make_record: MakeRecord,
        context: int,
        pad_id: int,
        genai_id: int | None = None,
        num_fixed: int | None = None,
    ) -> None:
        self.num_examples, self.num_fixed = num_records, num_records if num_fixed is None else num_fixed
        self.make_record, self.context, self.pad_id, self.genai_id = make_record, context, pad_id, genai_id

    def epoch_order(self, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
        permutation = rng.permutation(self.num_examples)
        return lambda positions: permutation[positions]

    def fixed_ids(self, places: np.ndarray) -> np.ndarray:
        return places

    def rows(self, ids: np.ndarray, seed: Seed = 0, samples: np.ndarray | None = None) -> np.ndarray:
        """Records longer than context + 1 tokens are cut, shorter ones padded."""
        rows = np.full(ids.shape + (self.context + 1,), self.pad_id, np.int32)
        for idx, index in np.ndenumerate(ids):
            rng = None if samples is None else seeded_rng(seed, 1, int(samples[idx]))
            record = self.make_record(int(index), rng)[: self.context + 1]
            rows[idx][: len(record)] = record
        return rows
