"""Standard MIDI files <-> Notes, with mido. Reading follows the file's tempo map; writing uses one piano track."""

from __future__ import annotations

from pathlib import Path

import mido
import numpy as np

from core.errors import DataError
from data.notes import Notes

PERCUSSION_CHANNEL = 9  # General MIDI drums: not pitched notes
TICKS_PER_BEAT = 480
TEMPO_US_PER_BEAT = 500_000  # 120 beats per minute: 960 ticks per second


def read_midi(path: str | Path) -> Notes:
    """Every pitched note of a .mid file, times in seconds (mido applies the tempo changes while iterating)."""
    try:
        midi = mido.MidiFile(str(path))
    except Exception as e:  # mido raises whatever the damaged bytes lead it to (OSError, EOFError, ValueError, ...)
        reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise DataError(f"{path}: not a readable MIDI file ({reason})") from None
    if midi.ticks_per_beat == 0:
        raise DataError(f"{path}: its header gives 0 ticks per beat, so its events have no times; a damaged file")
    if midi.type == 2:  # mido cannot merge its tracks (a TypeError while iterating, which read as a traceback)
        raise DataError(
            f"{path}: a type 2 MIDI file (independent sequences, one per track), which has no single timeline; "
            "save it as type 0 or 1"
        )
    now, sounding = 0.0, {}
    pitch, velocity, start, end = [], [], [], []

    def release(key, at):
        began, vel = sounding.pop(key)
        pitch.append(key[1]), velocity.append(vel), start.append(began), end.append(at)

    for dt, messages in _moments(midi, path):
        now += dt
        notes = [m for m in messages if m.type in ("note_on", "note_off") and m.channel != PERCUSSION_CHANNEL]
        # The releases of a moment before its strikes, wherever the file lists them: a voice that lets a key go as
        # another strikes it (two tracks on one channel; an on written before its off) is two notes, not a new one
        # cut to nothing by the old one's release.
        unmatched: dict[tuple[int, int], int] = {}
        for msg in notes:
            if msg.type == "note_off" or (msg.type == "note_on" and msg.velocity == 0):
                key = (msg.channel, msg.note)
                if key in sounding:
                    release(key, now)
                else:
                    unmatched[key] = unmatched.get(key, 0) + 1
        for msg in notes:
            if msg.type == "note_on" and msg.velocity > 0:
                key = (msg.channel, msg.note)
                if key in sounding:  # struck again while sounding: the sounding one ends here
                    release(key, now)
                sounding[key] = (now, msg.velocity)
                if unmatched.get(key):  # struck and released at one moment: a note of no length (dropped)
                    unmatched[key] -= 1
                    release(key, now)
    for (_channel, note), (began, vel) in sounding.items():  # never released: ends with the file
        pitch.append(note), velocity.append(vel), start.append(began), end.append(max(now, began + 0.01))
    return Notes.from_lists(pitch, velocity, start, end)


def _moments(midi: mido.MidiFile, path: str | Path) -> list[tuple[float, list[mido.Message]]]:
    """The file's messages grouped by the moment they happen at: (seconds since the previous moment, messages). Time
    in beats follows the tempo map (mido applies it); SMPTE time (the header's division negative: frames per second
    and ticks per frame) counts ticks of 1 / (frames per second x ticks per frame) seconds."""
    if midi.ticks_per_beat > 0:
        timed = ((msg.time, msg) for msg in midi)  # merged tracks; msg.time is seconds since the previous message
    else:
        fps, ticks_per_frame = -(midi.ticks_per_beat >> 8), midi.ticks_per_beat & 0xFF
        if fps not in (24, 25, 29, 30) or ticks_per_frame == 0:
            raise DataError(
                f"{path}: an SMPTE time division of {fps} frames per second and {ticks_per_frame} ticks per frame, "
                "which no MIDI file has (24, 25, 29 or 30 frames, >= 1 tick); a damaged file"
            )
        tick = 1 / ((30_000 / 1001 if fps == 29 else fps) * ticks_per_frame)  # 29: drop-frame, 29.97 frames/s
        timed = ((msg.time * tick, msg) for msg in mido.merge_tracks(midi.tracks))
    moments: list[tuple[float, list[mido.Message]]] = []
    for dt, msg in timed:
        if moments and dt == 0:
            moments[-1][1].append(msg)
        else:
            moments.append((dt, [msg]))
    return moments


def written_by(path: str | Path, maker: str) -> bool:
    """`path` is a .mid file that write_midi wrote for `maker` (its track's name)."""
    try:
        midi = mido.MidiFile(str(path))
    except Exception:  # not MIDI, damaged or unreadable: not known to be the maker's, so kept
        return False
    return any(m.type == "track_name" and m.name == maker for track in midi.tracks for m in track)


def write_midi(notes: Notes, path: str | Path, maker: str | None = None) -> Path:
    """A one-track .mid of `notes` (piano, 120 bpm) that any player opens. A note still sounding when the same key
    is struck again ends there: MIDI cannot hold one key twice; struck again within its own tick (1/960 s, a
    notes_tokenizer.time_step below it), it is left out, as it would end before it began."""
    seconds_to_ticks = TICKS_PER_BEAT * 1_000_000 / TEMPO_US_PER_BEAT
    ons = np.rint(notes.start * seconds_to_ticks).astype(np.int64)
    offs = np.maximum(np.rint(notes.end * seconds_to_ticks).astype(np.int64), ons + 1)
    next_on: dict[int, int] = {}
    for i in range(len(notes) - 1, -1, -1):  # backwards: the next strike of each key
        p = int(notes.pitch[i])
        if p in next_on:
            offs[i] = min(offs[i], next_on[p])
        next_on[p] = int(ons[i])
    events = []  # (tick, order, message): note_offs sort before note_ons at the same tick
    kept = offs > ons
    for p, v, on, off in zip(*(a[kept].tolist() for a in (notes.pitch, notes.velocity, ons, offs))):
        events.append((on, 1, mido.Message("note_on", note=p, velocity=int(v), channel=0)))
        events.append((off, 0, mido.Message("note_off", note=p, velocity=0, channel=0)))
    events.sort(key=lambda x: (x[0], x[1]))
    track = mido.MidiTrack(
        [
            *([mido.MetaMessage("track_name", name=maker, time=0)] if maker else []),  # written_by reads it
            mido.MetaMessage("set_tempo", tempo=TEMPO_US_PER_BEAT, time=0),
            mido.Message("program_change", program=0, channel=0, time=0),
        ]
    )
    last = 0
    for tick, _, msg in events:
        track.append(msg.copy(time=tick - last))
        last = tick
    track.append(mido.MetaMessage("end_of_track", time=0))
    midi = mido.MidiFile(ticks_per_beat=TICKS_PER_BEAT, tracks=[track])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    midi.save(str(path))
    return path
