"""Piano tasks and note records: what a record of notes becomes as a token sequence.

Pretraining: the record's tokens, then `<EOS>`. A task turns a record into `<TASK> prompt <GENAI> target <EOS>`:

- `dynamics`: the notes without velocities -> the velocity of each note, in order.
- `continuation`: the first half of the record -> the second half (its times continue from the prompt's last note).
- `lower_voices`: the top voice (the highest note of each onset) -> every other note.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from data.notes import Notes, augment, notes_of_row, record_starts, split_at_pauses
from data.notes_tokenizer import NotesTokenizer
from data.task_names import CONTINUATION, DYNAMICS, LOWER_VOICES

if TYPE_CHECKING:
    import datasets

Task = Callable[[Notes, NotesTokenizer], tuple[list[int], list[int]]]  # notes -> (prompt, target) ids


def dynamics(notes: Notes, tok: NotesTokenizer) -> tuple[list[int], list[int]]:
    return tok.encode_notes(notes, velocity=False), tok.velocity_tokens(notes)


def continuation(notes: Notes, tok: NotesTokenizer) -> tuple[list[int], list[int]]:
    half = max(len(notes) // 2, 1)
    head, tail = notes.take(slice(0, half)), notes.take(slice(half, None))
    return tok.encode_notes(head), tok.encode_notes(tail, start_from=float(head.start[-1]))


def top_voice_mask(notes: Notes, tok: NotesTokenizer) -> np.ndarray:
    """True for the highest note of each onset: the notes that start in one of the tokenizer's time steps (a chord
    played a few milliseconds apart is one onset, as its tokens say). Notes are sorted by start."""
    steps = tok.steps(notes.start)
    order = np.lexsort((notes.pitch, steps))  # by onset, then pitch: each onset's last is its highest
    last = np.ones(len(order), bool)
    last[:-1] = steps[order][1:] != steps[order][:-1]
    top = np.zeros(len(notes), bool)
    top[order[last]] = True
    return top


def lower_voices(notes: Notes, tok: NotesTokenizer) -> tuple[list[int], list[int]]:
    top = top_voice_mask(notes, tok)
    return tok.encode_notes(notes.take(top)), tok.encode_notes(notes.take(~top))


TASKS: dict[str, Task] = {DYNAMICS: dynamics, CONTINUATION: continuation, LOWER_VOICES: lower_voices}


def task_sequence(task: str, notes: Notes, tok: NotesTokenizer) -> list[int]:
    prompt, target = TASKS[task](notes, tok)
    return [tok.task_ids[task], *prompt, tok.genai_id, *target, tok.eos_id]


class NoteRecords:
    """Every record of a split: pieces split at pauses, then cut into runs of `notes_per_record` notes (next-token
    records: of no more notes than fit the context, `_windows`). `sequence(i, rng)` is the `make_record` of
    data/examples.py `Records`."""

    def __init__(
        self,
        pieces: datasets.Dataset,
        tok: NotesTokenizer,
        notes_per_record: int,
        pause_threshold: float,
        context: int,
        tasks: list[str],
        task_weights: list[float],
        max_pitch_shift: int,
        speed_change_factors: list[float],
    ) -> None:
        self.tok, self.notes_per_record, self.context = tok, notes_per_record, context
        self.tasks = list(tasks)
        weights = np.asarray(task_weights or [1.0] * len(self.tasks), np.float64)
        self.task_p = weights / weights.sum() if self.tasks else None
        self.max_pitch_shift, self.speed_change_factors = max_pitch_shift, list(speed_change_factors)
        self.segments: list[Notes] = []
        for row in pieces:
            self.segments += [s for s in split_at_pauses(notes_of_row(row), pause_threshold) if len(s)]
        self.index = [(s, a, b) for s, seg in enumerate(self.segments) for a, b in self._windows(seg)]

    def _windows(self, segment: Notes) -> list[tuple[int, int]]:
        """The records of a segment, as (first, end) note indices: runs of `notes_per_record` notes; for next-token
        records, also no more notes than fit the context with an `<EOS>`, played at the slowest speed augmentation
        may draw (what a record holds past context + 1 tokens is cut and never trained on: the next record starts
        there instead; `sequence` leaves out the rare last note that another speed's rounding pushes past it). A task
        shortens its own record's notes (`sequence`)."""
        n, size = len(segment), self.notes_per_record
        if self.tasks:
            return [(int(a), min(int(a) + size, n)) for a in record_starts(n, size)]
        slowest = min([1.0, *self.speed_change_factors])  # a factor below 1 plays slower: more SHIFT and DUR tokens
        windows, first = [], 0
        while first < n:
            notes = segment.take(slice(first, min(first + size, n))).shifted_to_zero()  # as `notes(i)` encodes it
            notes = Notes(notes.pitch, notes.velocity, notes.start / slowest, notes.end / slowest)
            shift, own = self.tok.note_token_counts(notes)
            fits = int(np.searchsorted(np.cumsum(shift + own), self.context, side="right"))
            windows.append((first, first + max(fits, 1)))
            first = windows[-1][1]
        return windows

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_fixed(self) -> int:
        """Places of an evaluation set: every record under each task in turn (task-major: place p is record
        p mod len under task p // len), so that evenly spaced places give every task an equal share of rows and
        each task evenly spaced records. A task drawn by the record's index instead left a set whose spacing was a
        multiple of the number of tasks scoring one task only."""
        return len(self) * max(len(self.tasks), 1)

    def notes(self, i: int) -> Notes:
        s, first, end = self.index[i]
        return self.segments[s].take(slice(first, end)).shifted_to_zero()

    def task_of(self, i: int, rng: np.random.Generator | None) -> str:
        """Training draws a task by `task_weights` for record i; evaluation's place i names its task (`num_fixed`)."""
        if rng is None:
            return self.tasks[i // len(self)]
        return self.tasks[int(rng.choice(len(self.tasks), p=self.task_p))]

    def sequence(self, i: int, rng: np.random.Generator | None) -> list[int]:
        """Record i's token ids: in training (`rng`, augmenting) record i under a drawn task; in evaluation (no
        `rng`) place i of `num_fixed`."""
        task = self.task_of(i, rng) if self.tasks else None
        i %= len(self)
        notes = self.notes(i)
        if rng is not None:
            notes = augment(notes, rng, self.max_pitch_shift, self.speed_change_factors)
        if not self.tasks:  # <EOS> only where the piece (or segment) really ends, not at every record's end
            s, _, end = self.index[i]
            ids = self.tok.encode_notes(notes) + ([self.tok.eos_id] if end == len(self.segments[s]) else [])
            # `_windows` sized the record at the slowest speed, but rounding onsets to the time step is not monotonic
            # in the speed: a chord rolled over a few milliseconds shares a step at one speed and takes two at
            # another, one SHIFT more. A record drawn past context + 1 tokens leaves its last notes out (and its <EOS>,
            # which no longer ends the piece), rather than be cut inside a note.
            if len(ids) == self.context + 2 and ids[-1] == self.tok.eos_id:
                return ids[:-1]  # the notes fit whole: only the <EOS> goes, as the row's cut would take it
            while len(ids) > self.context + 1 and len(notes) > 1:
                notes = notes.take(slice(0, len(notes) - 1))
                ids = self.tok.encode_notes(notes)
            return ids
        ids = task_sequence(task, notes, self.tok)
        while len(ids) > self.context + 1 and len(notes) > 2:  # a target is never cut: fewer notes instead
            notes = notes.take(slice(0, max(len(notes) * 7 // 8, 2)))
            ids = task_sequence(task, notes, self.tok)
        return ids


# --- prompting a trained model -------------------------------------------------------------------------------------


def note_prompt(task: str | None, notes: Notes, tok: NotesTokenizer) -> list[int]:
    """Ids a model continues: the notes themselves (a pretrained model), or `<TASK> prompt <GENAI>` for a task. The
    prompt is made of the quantised notes, in the order `notes_from_generation` reads the answer against: a chord
    rolled by a few ms sorts by pitch there, and a `dynamics` answer's i-th velocity is the i-th note's."""
    notes = tok.quantise(notes)
    if task is None:
        return tok.encode_notes(notes)
    prompt, _ = TASKS[task](notes, tok)
    if task == CONTINUATION:  # the prompt is the given notes, not their first half
        prompt = tok.encode_notes(notes)
    return [tok.task_ids[task], *prompt, tok.genai_id]


def notes_from_generation(task: str | None, notes: Notes, generated: list[int], tok: NotesTokenizer) -> Notes:
    """The piece a generation describes: the prompt's notes with what the model added (for `dynamics`, the same
    notes with the predicted velocities)."""
    given = tok.quantise(notes)
    if task == DYNAMICS:
        velocities = [int(tok.bin_velocity(v)) for kind, v in map(tok.token_kind, generated) if kind == "velocity"]
        velocity = np.asarray((velocities + given.velocity.tolist()[len(velocities) :])[: len(given)])
        return Notes(given.pitch, velocity, given.start, given.end)
    if task == LOWER_VOICES:
        given = given.take(top_voice_mask(given, tok))
        added = tok.decode_notes(generated)
    elif task == CONTINUATION or task is None:
        added = tok.decode_notes(generated, start_from=float(given.start[-1]) if len(given) else 0.0)
    else:
        raise ValueError(f"unknown task {task!r}")
    both = [
        np.r_[a, b]
        for a, b in zip(
            (given.pitch, given.velocity, given.start, given.end), (added.pitch, added.velocity, added.start, added.end)
        )
    ]
    return Notes.from_lists(*both)
