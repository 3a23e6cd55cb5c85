"""Notes: the tokenizer's round trip, MIDI files, pause splitting, augmentation, tasks and the fine-tuning loss mask."""

from __future__ import annotations

import struct

import mido
import numpy as np
import pytest

from core.errors import DataError
from data.examples import Records
from data.midi import read_midi, write_midi
from data.notes import Notes, augment, record_starts, split_at_pauses
from data.notes_tokenizer import NotesTokenizer
from data.task_names import TASK_NAMES
from data.tasks import TASKS, task_sequence, top_voice_mask
from data.tokenizers import tokenizer_from_json


def random_notes(rng: np.random.Generator, n: int, step: float = 0.01) -> Notes:
    """Notes whose starts sit within a third of a step of distinct grid points, so quantising keeps them apart."""
    grid = np.sort(rng.choice(np.arange(0, 60_000), size=n, replace=False))
    start = grid * step + rng.uniform(-step / 3, step / 3, n).clip(0, None)
    length = rng.uniform(0.02, 7.5, n)  # up to 7.5 s: lengths that need several DUR tokens
    return Notes.from_lists(rng.integers(0, 128, n), rng.integers(1, 128, n), start, start + length)


def assert_round_trip(notes: Notes, tok: NotesTokenizer) -> None:
    back = tok.decode_notes(tok.encode_notes(notes))
    assert len(back) == len(notes)
    np.testing.assert_array_equal(back.pitch, notes.pitch)
    half_step = tok.time_step / 2 + 1e-9
    assert np.abs(back.start - notes.start).max() <= half_step
    long_enough = notes.end - notes.start >= tok.time_step
    assert np.abs(back.end - notes.end)[long_enough].max() <= 2 * half_step  # start and end each within half a step
    assert np.abs(back.velocity - notes.velocity).max() <= 128 / tok.velocity_bins / 2 + 0.5
    # Decoding is exact on quantised notes: a second trip changes nothing.
    again = tok.decode_notes(tok.encode_notes(back))
    for a, b in zip(
        (again.pitch, again.velocity, again.start, again.end), (back.pitch, back.velocity, back.start, back.end)
    ):
        np.testing.assert_allclose(a, b, atol=1e-9)


@pytest.mark.parametrize("bins", [32, 128])
def test_random_notes_round_trip_within_the_quantisation(bins):
    tok = NotesTokenizer(time_step=0.01, max_shift_steps=100, max_duration_steps=100, velocity_bins=bins)
    assert_round_trip(random_notes(np.random.default_rng(bins), 400), tok)


def test_long_gaps_and_notes_take_several_tokens_and_come_back():
    tok = NotesTokenizer(time_step=0.01, max_shift_steps=100, max_duration_steps=100)
    notes = Notes.from_lists([60, 62], [64, 100], [0.0, 3.57], [2.5, 3.6])
    ids = tok.encode_notes(notes)
    assert tok.decode(ids) == (
        "PITCH_60 VEL_16 DUR_100 DUR_100 DUR_50 SHIFT_100 SHIFT_100 SHIFT_100 SHIFT_57 PITCH_62 VEL_25 DUR_3"
    )
    assert_round_trip(notes, tok)


def test_a_real_corpus_piece_round_trips(bach_chorale):
    assert len(bach_chorale) > 100
    assert_round_trip(bach_chorale, NotesTokenizer())


def test_the_tokenizer_description_rebuilds_it():
    tok = NotesTokenizer(time_step=0.02, max_shift_steps=50, max_duration_steps=80, velocity_bins=16)
    again = tokenizer_from_json(tok.to_json())
    assert again.to_json() == tok.to_json() and again.vocab_size == tok.vocab_size == 3 + 3 + 50 + 128 + 16 + 80


def test_decoding_tolerates_what_a_model_might_generate():
    tok = NotesTokenizer()
    # a pitch without velocity or length, a stray velocity, specials in between
    ids = [
        tok.pitch_base + 60,
        tok.velocity_base + 3,
        tok.velocity_base + 9,
        tok.eos_id,
        tok.shift_base + 10,
        tok.pitch_base + 64,
    ]
    notes = tok.decode_notes(ids, default_velocity=70)
    np.testing.assert_array_equal(notes.pitch, [60, 64])
    np.testing.assert_array_equal(notes.velocity, [tok.bin_velocity(3), 70])
    np.testing.assert_allclose(notes.end - notes.start, [0.01, 0.01])


def test_midi_file_written_is_read_back_with_the_same_notes(tmp_path, bach_chorale):
    tok = NotesTokenizer()
    notes = tok.quantise(bach_chorale)
    path = write_midi(notes, tmp_path / "piece.mid")
    assert mido.MidiFile(str(path)).length == pytest.approx(notes.end.max(), abs=1e-3)
    back = read_midi(path)
    assert len(back) == len(notes)
    np.testing.assert_array_equal(back.pitch, notes.pitch)
    np.testing.assert_array_equal(back.velocity, notes.velocity)
    np.testing.assert_allclose(back.start, notes.start, atol=1 / 960)
    np.testing.assert_allclose(back.end, notes.end, atol=1 / 960)


def test_a_key_released_as_it_is_struck_again_is_two_notes(tmp_path):
    # Two voices on one channel: the tenor lets C4 go at the beat where the alto strikes it, the alto's track first
    # (mido lists its strike before the release); and one track that writes a re-strike's note_on before the old
    # note's note_off.
    def on(time: int, velocity: int = 70) -> mido.Message:
        return mido.Message("note_on", note=60, velocity=velocity, time=time)

    def off(time: int) -> mido.Message:
        return mido.Message("note_off", note=60, time=time)

    midi = mido.MidiFile(type=1, ticks_per_beat=480)
    midi.tracks.append(mido.MidiTrack([on(480), off(480)]))
    midi.tracks.append(mido.MidiTrack([on(0, velocity=50), off(480)]))
    midi.save(tmp_path / "voices.mid")
    midi = mido.MidiFile(type=0, ticks_per_beat=480)
    midi.tracks.append(
        mido.MidiTrack(
            [
                mido.Message("note_on", note=60, velocity=50, time=0),
                mido.Message("note_on", note=60, velocity=70, time=480),
                mido.Message("note_off", note=60, time=0),
                mido.Message("note_off", note=60, time=480),
                # struck and released at one moment: no note
                mido.Message("note_on", note=62, velocity=70, time=0),
                mido.Message("note_off", note=62, time=0),
            ]
        )
    )
    midi.save(tmp_path / "restrike.mid")
    for name in ("voices.mid", "restrike.mid"):
        notes = read_midi(tmp_path / name)
        assert list(zip(notes.pitch.tolist(), notes.velocity.tolist(), notes.start.tolist(), notes.end.tolist())) == [
            (60, 50, 0.0, 0.5),
            (60, 70, 0.5, 1.0),
        ], name


def test_a_key_struck_twice_within_a_tick_writes_a_valid_file(tmp_path):
    """Below MIDI's tick (notes_tokenizer.time_step=0.0005), a key struck twice in one tick was written note_off
    first, then two note_ons with no off between them; the file read back lost a note it should have kept."""
    notes = Notes.from_lists([60, 60, 64], [80, 90, 70], [0.0, 0.0005, 0.0], [0.5, 0.5, 0.5])
    messages = [
        m for m in mido.MidiFile(write_midi(notes, tmp_path / "tick.mid")).tracks[0] if m.type.startswith("note")
    ]
    sounding = set()
    for m in messages:  # every note_on meets its key silent, every note_off a key sounding
        assert (m.note in sounding) == (m.type == "note_off"), messages
        (sounding.add if m.type == "note_on" else sounding.discard)(m.note)
    back = read_midi(tmp_path / "tick.mid")
    assert sorted(zip(back.pitch.tolist(), back.velocity.tolist())) == [(60, 90), (64, 70)]


def _header_division(path, division: int) -> None:
    """A one-track file: C4 from tick 0 to tick 480, the header's division as given."""
    track = bytes([0x00, 0x90, 60, 64, 0x83, 0x60, 0x80, 60, 0, 0x00, 0xFF, 0x2F, 0x00])
    header = b"MThd" + struct.pack(">IHHH", 6, 0, 1, division)
    path.write_bytes(header + b"MTrk" + struct.pack(">I", len(track)) + track)


def test_smpte_time_is_read_and_a_zero_division_is_one_line(tmp_path):
    _header_division(tmp_path / "smpte.mid", 0xE728)  # 25 frames per second, 40 ticks per frame: 1,000 ticks a second
    notes = read_midi(tmp_path / "smpte.mid")
    assert (notes.start.tolist(), notes.end.tolist()) == ([0.0], [pytest.approx(0.48)])
    _header_division(tmp_path / "ppq.mid", 480)
    assert read_midi(tmp_path / "ppq.mid").end.tolist() == [pytest.approx(0.5)]
    _header_division(tmp_path / "zero.mid", 0)
    with pytest.raises(DataError, match=r"zero.mid: its header gives 0 ticks per beat"):
        read_midi(tmp_path / "zero.mid")
    _header_division(tmp_path / "frames.mid", 0xEC00)  # 20 frames per second, 0 ticks per frame
    with pytest.raises(DataError, match=r"frames.mid: an SMPTE time division of 20 frames per second"):
        read_midi(tmp_path / "frames.mid")


def test_pauses_longer_than_the_threshold_split_a_piece():
    # a 5 s silence after 1.5 s; a note held across a 5 s gap between onsets is not a silence
    notes = Notes.from_lists([60, 62, 64, 65, 67], [80] * 5, [0.0, 1.0, 6.5, 7.0, 13.0], [1.0, 1.5, 7.0, 13.5, 14.0])
    segments = split_at_pauses(notes, threshold_s=4.0)
    assert [len(s) for s in segments] == [2, 3]
    assert [float(s.start[0]) for s in segments] == [0.0, 0.0]
    np.testing.assert_allclose(segments[1].start, [0.0, 0.5, 6.5])
    assert len(split_at_pauses(notes, threshold_s=6.0)) == 1


def test_records_are_non_overlapping_runs_of_notes_that_cover_the_segment():
    # the last record holds the segment's end (shorter): its notes and its <EOS> were dropped with it
    np.testing.assert_array_equal(record_starts(300, 128), [0, 128, 256])
    np.testing.assert_array_equal(record_starts(256, 128), [0, 128])
    np.testing.assert_array_equal(record_starts(50, 128), [0])


def test_every_note_of_a_split_is_in_a_record_and_every_segment_ends_in_eos(bach_chorale):
    from data.tasks import NoteRecords

    tok = NotesTokenizer()
    piece = tok.quantise(bach_chorale)
    records = NoteRecords([piece.as_columns()], tok, 32, 4.0, 10_000, [], [], 0, [])
    assert sum(len(records.notes(i)) for i in range(len(records.index))) == len(piece) > 32
    ends = [records.sequence(i, None)[-1] == tok.eos_id for i in range(len(records.index))]
    assert ends[-1] and sum(ends) == len(records.segments)


def test_next_token_records_hold_no_more_notes_than_fit_the_context(bach_chorale):
    from data.tasks import NoteRecords

    tok = NotesTokenizer()
    shift, own = tok.note_token_counts(tok.quantise(bach_chorale))
    assert int((shift + own).sum()) == len(tok.encode_notes(tok.quantise(bach_chorale)))
    # the performed times (not on the tokenizer's grid: a record's own rounding), and augmentation that plays slower
    rng = np.random.default_rng(0)
    start = bach_chorale.start + rng.uniform(0, 0.02, len(bach_chorale))
    length = bach_chorale.end - bach_chorale.start
    piece = Notes.from_lists(bach_chorale.pitch, bach_chorale.velocity, start, start + length)
    context = 64  # ~ 20 of the chorale's notes: a window of 32 notes would be cut
    for speeds in ([], [0.8, 1.25]):
        records = NoteRecords([piece.as_columns()], tok, 32, 4.0, context, [], [], 0, speeds)
        lengths = [len(records.sequence(i, None)) for i in range(len(records))]
        assert max(lengths) <= context + 1 and min(lengths[:-1]) > context * (0.8 if speeds else 1) - 12, lengths
        assert sum(len(records.notes(i)) for i in range(len(records))) == len(piece)
        assert [records.sequence(i, None)[-1] == tok.eos_id for i in range(len(records))].count(True) == 1
        drawn = [len(records.sequence(i, np.random.default_rng(i))) for i in range(len(records)) for _ in range(4)]
        assert max(drawn) <= context + 1  # at the slowest speed drawn too
    # A task's records stay runs of notes_per_record notes (a task shortens its own record's notes)
    tasks = NoteRecords([piece.as_columns()], tok, 32, 4.0, context, ["continuation"], [], 0, [])
    assert [len(tasks.notes(i)) for i in range(len(tasks) - 1)] == [32] * (len(tasks) - 1)


def test_a_next_token_record_is_whole_notes_within_the_context_at_every_drawn_speed():
    """Records are sized at the slowest speed, but rounding onsets to the time step is not monotonic in the speed:
    chords rolled over 4-6 ms (a performance, not a score) drew records one SHIFT past context + 1 tokens at 1.0 or
    1.1x, the row then cut inside its last note (a pitch and velocity with no duration)."""
    from data.examples import seeded_rng
    from data.tasks import NoteRecords

    rng = np.random.default_rng(0)
    pieces = []
    for _ in range(5):
        start = np.cumsum(rng.choice([0.0, 0.004, 0.006, 0.12, 0.25], size=400))
        end = start + rng.uniform(0.05, 0.6, size=400)
        pieces.append(Notes.from_lists(rng.integers(40, 90, 400), rng.integers(30, 110, 400), start, end).as_columns())
    tok, context = NotesTokenizer(), 64
    records = NoteRecords(pieces, tok, 64, 4.0, context, [], [], 0, [0.9, 1.1])
    for i in range(len(records)):
        for sample in range(20):
            ids = records.sequence(i, seeded_rng(0, 1, sample))
            played = tok.encode_notes(augment(records.notes(i), seeded_rng(0, 1, sample), 0, [0.9, 1.1]))
            notes = ids[:-1] if ids[-1] == tok.eos_id else ids
            next_kind = tok.token_kind(played[len(notes)])[0] if len(notes) < len(played) else "end"
            assert len(ids) <= context + 1 and notes == played[: len(notes)], (i, sample)
            assert next_kind in ("shift", "pitch", "end"), (i, sample)  # what is left out begins a note


def test_a_record_whose_notes_fill_the_context_whole_loses_only_its_eos(bach_chorale):
    """Notes of exactly context + 1 tokens at the segment's end: the <EOS> goes, not a whole note with it."""
    from data.tasks import NoteRecords

    tok = NotesTokenizer()
    records = NoteRecords([tok.quantise(bach_chorale).as_columns()], tok, 32, 4.0, 10_000, [], [], 0, [])
    last = len(records) - 1
    whole = tok.encode_notes(records.notes(last))
    records.context = len(whole) - 1  # the notes fill the row: only the <EOS> is past it
    assert records.sequence(last, None) == whole


def test_a_dynamics_answer_lands_on_the_notes_it_was_asked_about():
    from data.tasks import note_prompt, notes_from_generation

    tok = NotesTokenizer()
    # A chord rolled from the top (C5 3 ms before C4), then E4 struck twice within one 10 ms step, then G4.
    starts, ends = [0.001, 0.004, 0.5, 0.503, 1.0], [0.4, 0.4, 0.9, 0.9, 1.5]
    notes = Notes.from_lists([72, 60, 64, 64, 67], [100, 30, 40, 42, 90], starts, ends)
    loudness = {72: 100, 60: 30, 64: 40, 67: 90}
    prompt = note_prompt("dynamics", notes, tok)
    asked = [v for kind, v in map(tok.token_kind, prompt) if kind == "pitch"]
    answer = [tok.velocity_base + int(tok.velocity_bin(loudness[p])) for p in asked]  # a model that knows
    piece = notes_from_generation("dynamics", notes, answer, tok)
    assert sorted(piece.pitch.tolist()) == sorted(loudness)
    for pitch, velocity in zip(piece.pitch.tolist(), piece.velocity.tolist()):
        assert abs(velocity - loudness[pitch]) <= 2, (pitch, velocity)


def test_velocities_come_back_within_half_a_bin():
    velocities = np.arange(1, 128)
    for bins in (128, 32, 100, 7):
        tok = NotesTokenizer(velocity_bins=bins)
        back = tok.bin_velocity(tok.velocity_bin(velocities))
        assert np.abs(back - velocities).max() <= np.ceil(64 / bins), bins  # half a bin, in whole velocities
        assert (tok.velocity_bin(back) == tok.velocity_bin(velocities)).all()  # each decodes inside its bin
    assert (NotesTokenizer(velocity_bins=128).bin_velocity(velocities) == velocities).all()  # odd ones were off by 1


def test_pitch_shift_and_speed_change_keep_notes_valid():
    rng = np.random.default_rng(0)
    extremes = Notes.from_lists([0, 127, 60], [80] * 3, [0.0, 0.5, 1.0], [0.4, 0.9, 1.5])
    for _ in range(20):
        shifted = augment(extremes, rng, max_pitch_shift=6, speed_change_factors=[])
        np.testing.assert_array_equal(shifted.pitch, extremes.pitch)  # nowhere to go without leaving 0..127
    notes = random_notes(rng, 200)
    factors = set()
    for seed in range(40):
        out = augment(notes, np.random.default_rng(seed), max_pitch_shift=12, speed_change_factors=[0.5, 2.0])
        assert out.pitch.min() >= 0 and out.pitch.max() <= 127
        assert (out.start >= 0).all() and (out.end > out.start).all()
        shift = set((out.pitch - notes.pitch).tolist())
        assert len(shift) == 1 and abs(shift.pop()) <= 12
        factors.add(round(float(notes.end[-1] / out.end[-1]), 6))
    assert factors == {0.5, 1.0, 2.0}
    same = [augment(notes, np.random.default_rng(7), 12, [0.5, 2.0]) for _ in range(2)]
    np.testing.assert_array_equal(same[0].pitch, same[1].pitch)
    np.testing.assert_array_equal(same[0].start, same[1].start)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_fine_tuning_mask_covers_exactly_the_target_tokens(task, bach_chorale):
    tok = NotesTokenizer()
    notes = bach_chorale.take(slice(0, 24)).shifted_to_zero()
    prompt, target = TASKS[task](notes, tok)
    ids = task_sequence(task, notes, tok)
    assert ids == [tok.task_ids[task], *prompt, tok.genai_id, *target, tok.eos_id]
    context = len(ids) + 10  # room for padding after the record
    finetuning = Records(1, lambda i, rng: ids, context, tok.pad_id, genai_id=tok.genai_id)
    batch = finetuning.batch(finetuning.rows(np.zeros(1, np.int64)))
    masked = batch["targets"][0][batch["loss_mask"][0] > 0].tolist()
    assert masked == [*target, tok.eos_id]
    first = int(np.flatnonzero(batch["loss_mask"][0])[0])
    assert batch["inputs"][0][first] == tok.genai_id  # the first counted target is the one right after <GENAI>
    pretraining = Records(1, lambda i, rng: ids, context, tok.pad_id)
    pretraining_mask = pretraining.batch(pretraining.rows(np.zeros(1, np.int64)))["loss_mask"][0]
    assert pretraining_mask.sum() == len(ids) - 1  # every real target, no padding


def test_every_task_name_has_its_task_and_its_own_token():
    tok = NotesTokenizer()
    assert list(TASKS) == list(TASK_NAMES)
    assert sorted(tok.task_ids.values()) == list(range(3, 3 + len(TASK_NAMES)))  # after <EOS>, <PAD>, <GENAI>
    assert [tok.token_kind(tok.task_ids[name]) for name in TASK_NAMES] == [("task", i) for i in range(len(TASK_NAMES))]


def test_tasks_pose_what_they_promise(bach_chorale):
    tok = NotesTokenizer()
    notes = tok.quantise(bach_chorale.take(slice(0, 40)).shifted_to_zero())
    prompt, target = TASKS["dynamics"](notes, tok)
    assert not any(tok.token_kind(i)[0] == "velocity" for i in prompt)
    assert target == tok.velocity_tokens(notes)
    prompt, target = TASKS["continuation"](notes, tok)
    head = tok.decode_notes(prompt)
    tail = tok.decode_notes(target, start_from=float(head.start[-1]))
    assert len(head) + len(tail) == len(notes)
    np.testing.assert_allclose(np.r_[head.start, tail.start], notes.start, atol=1e-9)
    prompt, target = TASKS["lower_voices"](notes, tok)
    top = tok.decode_notes(prompt)
    assert len(top) == len(np.unique(notes.start)) and len(top) + len(tok.decode_notes(target)) == len(notes)
    assert top_voice_mask(notes, tok).sum() == len(top)


def test_a_chord_played_a_few_milliseconds_apart_is_one_onset_to_lower_voices():
    """Performed MIDI: the notes of a chord start within a time step, not at one time; each chord's top note is its
    highest, whichever was struck first (every note had been its own onset: the target was empty)."""
    tok = NotesTokenizer()
    pitch = [60, 67, 64, 62, 71, 65]
    start = [0.0, 0.002, 0.004, 0.5, 0.501, 0.503]  # two chords, the highest not struck last in the first
    notes = Notes.from_lists(pitch, [80] * 6, start, [s + 0.4 for s in start])
    top = top_voice_mask(notes, tok)
    assert sorted(notes.pitch[top].tolist()) == [67, 71]
    prompt, target = TASKS["lower_voices"](notes, tok)
    assert len(tok.decode_notes(prompt)) == 2 and len(tok.decode_notes(target)) == 4


def test_a_val_split_without_pieces_says_why_and_what_fixes_it(tmp_path, bach_chorale):
    """Two pieces in a folder: a composer holds pieces out only from 3 on (the message said to raise val_fraction,
    which changes nothing, or a key midi_files does not have)."""
    from core.errors import DataError
    from data.config import MidiFilesConfig
    from data.note_sources import midi_files_corpus

    for i in range(2):
        write_midi(bach_chorale, tmp_path / "songs" / "bach" / f"piece{i}.mid")
    d = MidiFilesConfig(name="midi_files", files=[str(tmp_path / "songs")], num_proc=1, cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataError) as e:
        midi_files_corpus(d)
    assert str(e.value) == (
        "dataset midi_files: the val split has no pieces; a composer holds pieces out for val and test only from 3 "
        "pieces on: add files (a file's composer is its folder)"
    )


def test_an_evaluation_set_scores_every_task_alike(bach_chorale):
    """Evaluation took each record's task from its index and a fixed set takes evenly spaced records: a spacing that
    was a multiple of the number of tasks (16 records, 8 rows, two tasks) scored one task only."""
    from data import make_data
    from training.config import load_config

    tasks = ["dynamics", "continuation"]
    cfg = load_config(
        [
            "dataset=music21",
            "stage=piano_task",
            "init_from=runs/x",
            f"tasks=[{','.join(tasks)}]",
            "data.notes_per_record=4",
        ]
        + ["train.batch_size=4", "train.eval_iters=2"]
    )
    tok = NotesTokenizer()
    piece = tok.quantise(bach_chorale).take(slice(0, 64)).as_columns()  # 16 records of 4 notes
    data = make_data(cfg, {"train": [piece], "full": [piece]}, tok, 128, 0, 1)
    rows = np.concatenate([b["inputs"] for b in data.evals["full"]])
    asked = [tasks[[tok.task_ids[t] for t in tasks].index(first)] for first in rows[:, 0]]
    assert data.train.examples.num_examples == 16
    assert len(asked) == 8 and asked.count("dynamics") == asked.count("continuation") == 4
