"""Notes: a piece as arrays (pitch, velocity, start, end in seconds), and what is done to them before tokenising.

A `Notes` is sorted by (start, pitch). Pieces are split at long pauses (`split_at_pauses`), cut into records of
`notes_per_record` consecutive notes (`record_starts`), and augmented on the fly (`augment`: a pitch shift and a
speed change drawn from a generator the caller seeds from (seed, sample), so a resumed run sees the same ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PITCH_RANGE = 128  # MIDI pitches 0..127
VELOCITY_RANGE = 128


@dataclass(frozen=True)
class Notes:
    pitch: np.ndarray  # [N] int, 0..127
    velocity: np.ndarray  # [N] int, 1..127
    start: np.ndarray  # [N] float seconds, non-decreasing
    end: np.ndarray  # [N] float seconds, > start

    @staticmethod
    def from_lists(pitch, velocity, start, end) -> Notes:
        """Validated and sorted by (start, pitch). Notes of zero or negative length are dropped, and so is a second
        note of the same pitch at the same time (two voices in unison are one key on a piano): the longer one stays."""
        p = np.asarray(pitch, np.int64)
        v = np.clip(np.asarray(velocity, np.int64), 1, VELOCITY_RANGE - 1)
        s = np.asarray(start, np.float64)
        e = np.asarray(end, np.float64)
        keep = (e > s) & (p >= 0) & (p < PITCH_RANGE) & (s >= 0)
        p, v, s, e = p[keep], v[keep], s[keep], e[keep]
        order = np.lexsort((-e, p, s))
        p, v, s, e = p[order], v[order], s[order], e[order]
        first = np.ones(len(p), bool)
        first[1:] = (p[1:] != p[:-1]) | (s[1:] != s[:-1])
        return Notes(p[first], v[first], s[first], e[first])

    def __len__(self) -> int:
        return len(self.pitch)

    def take(self, index) -> Notes:
        return Notes(self.pitch[index], self.velocity[index], self.start[index], self.end[index])

    def shifted_to_zero(self) -> Notes:
        """The same notes with the first one starting at 0 s (a record does not remember where in the piece it was)."""
        t0 = self.start[0] if len(self) else 0.0
        return Notes(self.pitch, self.velocity, self.start - t0, self.end - t0)

    def as_columns(self) -> dict[str, list]:
        return {
            "pitch": self.pitch.tolist(),
            "velocity": self.velocity.tolist(),
            "start": self.start.tolist(),
            "end": self.end.tolist(),
        }


def notes_of_row(row: dict) -> Notes:
    """A dataset row (columns pitch, velocity, start, end) as sorted, validated Notes."""
    return Notes.from_lists(row["pitch"], row["velocity"], row["start"], row["end"])


def split_at_pauses(notes: Notes, threshold_s: float) -> list[Notes]:
    """Segments of a piece separated by silences longer than `threshold_s` (no note sounding), each shifted to 0 s.

    A silence is measured from the latest end of any note so far to the next start, so a long held chord is not a pause.
    """
    if len(notes) == 0:
        return []
    sounding_until = np.maximum.accumulate(notes.end)
    gaps = notes.start[1:] - sounding_until[:-1]
    cuts = np.flatnonzero(gaps > threshold_s) + 1
    return [notes.take(slice(a, b)).shifted_to_zero() for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(notes)])]


def record_starts(num_notes: int, notes_per_record: int) -> np.ndarray:
    """First-note indices of the records of one segment: non-overlapping windows of `notes_per_record` notes, the
    last one shorter where they do not divide the segment (it holds the segment's end); a segment shorter than one
    window is one record."""
    return np.arange(0, max(num_notes, 1), notes_per_record)


def augment(notes: Notes, rng: np.random.Generator, max_pitch_shift: int, speed_change_factors: list[float]) -> Notes:
    """Transpose by a uniform shift in [-max_pitch_shift, max_pitch_shift] (narrowed so every pitch stays in
    0..127) and play it at a speed drawn from `speed_change_factors` plus 1.0 (1.1 = 10% faster: times / 1.1)."""
    pitch, start, end = notes.pitch, notes.start, notes.end
    if max_pitch_shift > 0 and len(notes):
        low = max(-max_pitch_shift, -int(pitch.min()))
        high = min(max_pitch_shift, PITCH_RANGE - 1 - int(pitch.max()))
        pitch = pitch + int(rng.integers(low, high + 1))
    if speed_change_factors:
        factor = float(rng.choice([1.0, *speed_change_factors]))
        start, end = start / factor, end / factor
    return Notes(pitch, notes.velocity, start, end)
