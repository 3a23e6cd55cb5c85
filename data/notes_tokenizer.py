"""The notes tokenizer: notes (pitch, velocity, start, end) <-> tokens, and back to a playable `.mid`.

Each note is `[SHIFT...] PITCH VELOCITY DUR...`: the time since the previous note's start in steps of `time_step`
seconds (no SHIFT for a note that starts with the previous one: a chord), the MIDI pitch, the velocity in
`velocity_bins` bins, and the length in steps. Shifts and lengths longer than the largest token are written as
several tokens that add up, so nothing is clipped: decoding gives back exactly the quantised notes (times within
half a step, velocities within half a bin). Ids 0..2 are `<EOS>`, `<PAD>`, `<GENAI>`; then one token per piano task
(the prompt says which task it poses); then SHIFT_1.., PITCH_0..127, VEL_0.., DUR_1...
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from core.errors import DataError
from data.notes import PITCH_RANGE, VELOCITY_RANGE, Notes
from data.task_names import TASK_NAMES
from data.tokenizer_base import Tokenizer

TOKEN_NAMES = {"shift": "SHIFT", "pitch": "PITCH", "velocity": "VEL", "duration": "DUR"}


class NotesTokenizer(Tokenizer):
    kind = "notes"

    def __init__(
        self,
        time_step: float = 0.01,
        max_shift_steps: int = 100,
        max_duration_steps: int = 100,
        velocity_bins: int = 32,
    ) -> None:
        if time_step <= 0 or max_shift_steps < 1 or max_duration_steps < 1 or not 1 <= velocity_bins <= VELOCITY_RANGE:
            raise DataError(
                "notes tokenizer: time_step must be > 0, max_shift_steps and max_duration_steps >= 1, "
                f"velocity_bins in [1, 128]; got {time_step}, {max_shift_steps}, {max_duration_steps}, "
                f"{velocity_bins}"
            )
        self.time_step, self.velocity_bins = float(time_step), int(velocity_bins)
        self.max_shift_steps, self.max_duration_steps = int(max_shift_steps), int(max_duration_steps)
        self.eos_id, self.pad_id, self.genai_id = 0, 1, 2
        self.task_ids = {name: 3 + i for i, name in enumerate(TASK_NAMES)}
        self.shift_base = 3 + len(TASK_NAMES) - 1  # SHIFT_k is shift_base + k, k >= 1
        self.pitch_base = self.shift_base + self.max_shift_steps + 1
        self.velocity_base = self.pitch_base + PITCH_RANGE
        self.duration_base = self.velocity_base + self.velocity_bins - 1  # DUR_k is duration_base + k, k >= 1
        self.vocab_size = self.duration_base + self.max_duration_steps + 1

    # --- quantisation ---------------------------------------------------------------------------------------------

    def steps(self, seconds) -> np.ndarray:
        return np.rint(np.asarray(seconds, np.float64) / self.time_step).astype(np.int64)

    def velocity_bin(self, velocity) -> np.ndarray:
        return np.asarray(velocity, np.int64) * self.velocity_bins // VELOCITY_RANGE

    def bin_velocity(self, bins) -> np.ndarray:
        """The velocity a bin decodes to: the middle of the velocities it holds (the upper one of two), so that
        every velocity comes back within half a bin (itself, with 128 bins)."""
        b = np.asarray(bins, np.int64)
        first = -(-b * VELOCITY_RANGE // self.velocity_bins)  # the smallest velocity v with v * bins // 128 == b
        last = -(-(b + 1) * VELOCITY_RANGE // self.velocity_bins) - 1
        return np.clip((first + last + 1) // 2, 1, VELOCITY_RANGE - 1)

    def quantise(self, notes: Notes, start_from: float = 0.0) -> Notes:
        """What `decode_notes(encode_notes(notes))` gives back."""
        return self.decode_notes(self.encode_notes(notes, start_from=start_from), start_from=start_from)

    # --- notes <-> ids --------------------------------------------------------------------------------------------

    def encode_notes(
        self, notes: Notes, *, start_from: float = 0.0, velocity: bool = True, duration: bool = True
    ) -> list[int]:
        """Tokens of `notes`, times counted from `start_from` seconds. `velocity=False` / `duration=False` leave those
        tokens out (a dynamics prompt is the notes without their velocities)."""
        starts = self.steps(notes.start)
        shifts = np.diff(starts, prepend=int(self.steps(start_from)))
        lengths = np.maximum(self.steps(notes.end) - starts, 1)
        bins = self.velocity_bin(notes.velocity)
        out: list[int] = []
        for shift, pitch, vbin, length in zip(shifts.tolist(), notes.pitch.tolist(), bins.tolist(), lengths.tolist()):
            out += self._repeat(self.shift_base, max(shift, 0), self.max_shift_steps)
            out.append(self.pitch_base + pitch)
            if velocity:
                out.append(self.velocity_base + vbin)
            if duration:
                out += self._repeat(self.duration_base, length, self.max_duration_steps)
        return out

    def note_token_counts(self, notes: Notes) -> tuple[np.ndarray, np.ndarray]:
        """Per note, the SHIFT tokens before it (from the previous note's start; none before the first) and its own
        tokens (PITCH, VEL, DUR...): `encode_notes` of notes starting at 0 s writes their sum."""
        starts = self.steps(notes.start)
        shifts = np.maximum(np.diff(starts, prepend=starts[:1]), 0)
        lengths = np.maximum(self.steps(notes.end) - starts, 1)
        return -(-shifts // self.max_shift_steps), 2 + -(-lengths // self.max_duration_steps)

    def velocity_tokens(self, notes: Notes) -> list[int]:
        return (self.velocity_base + self.velocity_bin(notes.velocity)).tolist()

    @staticmethod
    def _repeat(base: int, steps: int, largest: int) -> list[int]:
        full, rest = divmod(steps, largest)
        return [base + largest] * full + ([base + rest] if rest else [])

    def decode_notes(self, ids: Iterable[int], start_from: float = 0.0, default_velocity: int = 80) -> Notes:
        """Notes of a token sequence; tolerant of what a model may generate (a note without a velocity gets
        `default_velocity`, without a length one step; special and task tokens are skipped)."""
        t = int(self.steps(start_from))
        pitch, vel, start, length = [], [], [], []
        for i in (int(x) for x in ids):
            kind, value = self.token_kind(i)
            if kind == "shift":
                t += value
            elif kind == "pitch":
                pitch.append(value), vel.append(None), start.append(t), length.append(0)
            elif kind == "velocity" and pitch and vel[-1] is None:
                vel[-1] = int(self.bin_velocity(value))
            elif kind == "duration" and pitch:
                length[-1] += value
        velocity = [default_velocity if v is None else v for v in vel]
        s = np.asarray(start, np.float64) * self.time_step
        e = s + np.maximum(np.asarray(length, np.float64), 1) * self.time_step
        return Notes.from_lists(pitch, velocity, s, e)

    def token_kind(self, i: int) -> tuple[str, int]:
        if i < 3:
            return "special", i
        if i <= self.shift_base:
            return "task", i - 3
        if i < self.pitch_base:
            return "shift", i - self.shift_base
        if i < self.velocity_base:
            return "pitch", i - self.pitch_base
        if i <= self.duration_base:
            return "velocity", i - self.velocity_base
        if i < self.vocab_size:
            return "duration", i - self.duration_base
        raise DataError(f"token id {i} is outside the notes vocabulary of {self.vocab_size}")

    # --- the Tokenizer interface ----------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        raise DataError(
            "the notes tokenizer encodes notes, not text: use a notes source (dataset=music21, maestro, "
            "midi_files) or a text tokenizer (dataset.tokenizer=bpe)"
        )

    def decode(self, ids: Iterable[int]) -> str:
        """Token names, e.g. `SHIFT_25 PITCH_60 VEL_20 DUR_50`, for reading a sequence."""
        words = []
        for i in (int(x) for x in ids):
            kind, value = self.token_kind(i)
            if kind == "special":
                words.append(("<EOS>", "<PAD>", "<GENAI>")[value])
            elif kind == "task":
                words.append(f"<{TASK_NAMES[value].upper()}>")
            else:
                words.append(f"{TOKEN_NAMES[kind]}_{value}")
        return " ".join(words)

    def token_byte_lengths(self) -> np.ndarray:
        return np.zeros(self.vocab_size, np.int32)  # not text: per-byte losses do not apply

    def to_json(self) -> dict:
        return {
            "kind": "notes",
            "time_step": self.time_step,
            "max_shift_steps": self.max_shift_steps,
            "max_duration_steps": self.max_duration_steps,
            "velocity_bins": self.velocity_bins,
            "tasks": list(TASK_NAMES),
        }

    @staticmethod
    def from_json(desc: dict) -> NotesTokenizer:
        if list(desc.get("tasks", TASK_NAMES)) != list(TASK_NAMES):
            raise DataError(
                f"notes tokenizer: the checkpoint's task tokens {desc.get('tasks')} differ from this "
                f"version's {list(TASK_NAMES)}"
            )
        return NotesTokenizer(
            desc["time_step"], desc["max_shift_steps"], desc["max_duration_steps"], desc["velocity_bins"]
        )


def notes_tokenizer(d) -> NotesTokenizer:
    """The notes tokenizer `dataset.notes_tokenizer` describes."""
    n = d.notes_tokenizer
    return NotesTokenizer(n.time_step, n.max_shift_steps, n.max_duration_steps, n.velocity_bins)
