"""Where notes come from: the music21 corpus (embedded), Hub piano datasets in the maestro layout, or local MIDI files.

Each loader (`music21_corpus`, `maestro_corpus`, `midi_files_corpus`; data/corpus.py picks one by `dataset.source`)
returns `{split: datasets.Dataset}` with one piece per row and the columns of `note_features()`: `train`, `test`, and
the validation splits (`full`, then one per composer in `dataset.eval_composers` that the validation pieces have).
Scores and MIDI files are parsed once, in parallel, by `datasets.Dataset.from_generator`, and read back from its
Arrow cache under `dataset.cache_dir` after that.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import DataError, first_line, warn
from core.hf_datasets import hf_datasets
from core.hub import hub_reachable, offline_hub
from data.config import MaestroConfig, MidiFilesConfig, Music21Config, NotesConfig
from data.files import expand_files
from data.notes import Notes

if TYPE_CHECKING:
    import datasets
    import music21

FULL_VAL_SPLIT = "full"
MUSIC21_SKIPPED_SUFFIXES = (".rntxt",)  # Roman-numeral analyses, not notes


def note_features() -> datasets.Features:
    """The columns of a piece: its composer and title, and its notes as parallel lists."""
    datasets = hf_datasets()
    return datasets.Features(
        {
            "composer": datasets.Value("string"),
            "title": datasets.Value("string"),
            "pitch": datasets.Sequence(datasets.Value("int16")),
            "velocity": datasets.Sequence(datasets.Value("int16")),
            "start": datasets.Sequence(datasets.Value("float64")),
            "end": datasets.Sequence(datasets.Value("float64")),
        }
    )


def music21_corpus(d: Music21Config) -> dict[str, datasets.Dataset]:
    return _note_splits(_split_by_piece(_music21(d), d), d)


def midi_files_corpus(d: MidiFilesConfig) -> dict[str, datasets.Dataset]:
    return _note_splits(_split_by_piece(_midi_files(d), d), d)


def maestro_corpus(d: MaestroConfig) -> dict[str, datasets.Dataset]:
    return _note_splits(_maestro(d), d)


def _note_splits(corpus: dict[str, datasets.Dataset], d: NotesConfig) -> dict[str, datasets.Dataset]:
    """Train, val and test capped by dataset.max_documents and checked; then val as `full` and one split per
    composer of dataset.eval_composers."""
    if d.max_documents is not None:
        corpus = {k: v.select(range(min(len(v), d.max_documents))) for k, v in corpus.items()}
    more = {
        "music21": "add composers or raise dataset.max_pieces_per_composer",
        "midi_files": "add files (a file's composer is its folder)",
    }.get(d.source, "add pieces")
    for name in ("train", "val"):
        if len(corpus.get(name, [])) == 0:
            why = (
                "a composer holds pieces out for val and test only from 3 pieces on: "
                if name == "val" and d.source in ("music21", "midi_files")
                else ""
            )
            raise DataError(f"dataset {d.name}: the {name} split has no pieces; {why}{more}")
    return _with_composer_splits(corpus, d.eval_composers)


def _with_composer_splits(corpus: dict[str, datasets.Dataset], composers: list[str]) -> dict[str, datasets.Dataset]:
    """`val` becomes `full`, and each composer of `composers` with validation pieces gets a split of its own."""
    val = corpus.pop("val")
    out = {"train": corpus.pop("train"), FULL_VAL_SPLIT: val}
    names = [_composer_key(c) for c in val["composer"]]
    for composer in composers:
        rows = [i for i, name in enumerate(names) if name == _composer_key(composer)]
        if rows:
            out[composer] = val.select(rows)
    out.update(corpus)  # test
    return out


def _composer_key(name: str) -> str:
    """`Frédéric Chopin`, `chopin` and `Chopin` name the same composer: compare by the last word, lower-cased."""
    return name.strip().split()[-1].lower() if name and name.strip() else ""


def _split_by_piece(pieces: datasets.Dataset, d: NotesConfig) -> dict[str, datasets.Dataset]:
    """Held-out pieces per composer, chosen by a hash of the title: every composer with at least three pieces has
    one in validation and one in test (so each composer's validation split exists), the rest by the fractions."""
    by_composer: dict[str, list[tuple[float, int]]] = {}
    for i, (composer, title) in enumerate(zip(pieces["composer"], pieces["title"])):
        u = int(hashlib.sha256(f"{composer}/{title}".encode()).hexdigest()[:12], 16) / 16**12
        by_composer.setdefault(composer, []).append((u, i))
    rows: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for members in by_composer.values():
        members.sort()
        n = len(members)
        n_val = max(1, round(d.val_fraction * n)) if n >= 3 else 0
        n_test = max(1, round(d.test_fraction * n)) if n >= 3 else 0
        for rank, (_, i) in enumerate(members):
            rows["val" if rank < n_val else "test" if rank < n_val + n_test else "train"].append(i)
    return {name: pieces.select(sorted(r)) for name, r in rows.items() if r}


# --- music21's corpus --------------------------------------------------------------------------------------------


def music21_paths(composers: list[str], max_pieces: int | None) -> list[tuple[str, str]]:
    """(composer, path) of the corpus's scores, the smallest files first so that a cap keeps parsing quick."""
    from music21 import corpus

    found = []
    for composer in composers:
        paths = [Path(p) for p in corpus.getComposer(composer) if not str(p).endswith(MUSIC21_SKIPPED_SUFFIXES)]
        if not paths:
            raise DataError(
                f"dataset.composers: music21's corpus has no scores by {composer!r}; it has e.g. bach, "
                "beethoven, mozart, haydn, palestrina, monteverdi, chopin"
            )
        paths.sort(key=lambda p: (p.stat().st_size, str(p)))
        unique = {}  # some pieces come in two encodings (movement3.krn and movement3.mxl): keep the smaller file
        for p in paths:
            unique.setdefault(p.with_suffix(""), p)
        found += [(composer, str(p)) for p in list(unique.values())[:max_pieces]]
    return found


def _music21(d: Music21Config) -> datasets.Dataset:
    listed = music21_paths(list(d.composers), d.max_pieces_per_composer)
    return _parse_in_parallel(_music21_pieces, listed, d, "music21")


def _music21_pieces(items: list[tuple[str, str]], default_velocity: int) -> Iterator[dict]:
    from music21 import converter, stream

    corpus_root = _music21_corpus_root()
    for composer, path in items:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # music21 warns about every overfull measure it repairs
            parsed = converter.parse(path, forceSource=True)
        scores = list(parsed.scores) if isinstance(parsed, stream.Opus) else [parsed]
        for n, score in enumerate(scores):
            notes = score_notes(score, default_velocity)
            if len(notes):
                title = os.path.relpath(path, corpus_root) + (f"#{n}" if len(scores) > 1 else "")
                yield {"composer": composer, "title": title, **notes.as_columns()}


def _music21_corpus_root() -> str:
    from music21 import common

    return str(common.getCorpusFilePath())


def score_notes(score: music21.stream.Score, default_velocity: int) -> Notes:
    """A music21 score as notes in seconds: offsets through the score's tempo map, ties merged, chords expanded,
    each part's velocity from its latest dynamic mark (`default_velocity` before the first one)."""
    from music21 import dynamics

    to_seconds = _tempo_map(score)
    pitch, velocity, start, end = [], [], [], []
    for part in score.parts or [score]:
        flat = part.stripTies().flatten()
        marks = sorted(
            (float(m.offset), round(m.volumeScalar * 127))
            for m in flat.getElementsByClass(dynamics.Dynamic)
            if m.volumeScalar is not None
        )
        m, current = 0, default_velocity
        for element in flat.notes:  # sorted by offset
            offset, length = float(element.offset), float(element.quarterLength)
            if length <= 0:  # grace notes have no length of their own
                continue
            while m < len(marks) and marks[m][0] <= offset:
                current = marks[m][1]
                m += 1
            vel = element.volume.velocity if element.volume.velocity is not None else current
            begin, finish = to_seconds(offset), to_seconds(offset + length)
            for p in element.pitches:
                pitch.append(p.midi), velocity.append(vel), start.append(begin), end.append(finish)
    return Notes.from_lists(pitch, velocity, start, end)


def _tempo_map(score: music21.stream.Score):
    """quarter-note offset -> seconds, from the score's metronome marks (music21 assumes 120 bpm without any)."""
    spans = [
        (float(Fraction(a)), float(Fraction(b)), mark.secondsPerQuarter())
        for a, b, mark in score.flatten().metronomeMarkBoundaries()
    ]
    starts_s, total = [], 0.0
    for a, b, spq in spans:
        starts_s.append(total)
        total += (b - a) * spq

    def to_seconds(offset: float) -> float:
        for (a, b, spq), base in zip(spans, starts_s):
            if offset < b:
                return base + (offset - a) * spq
        a, b, spq = spans[-1]
        return starts_s[-1] + (offset - a) * spq

    return to_seconds


# --- local MIDI files ----------------------------------------------------------------------------------------------


def _midi_files(d: MidiFilesConfig) -> datasets.Dataset:
    paths = [p for p in expand_files(d.files) if p.lower().endswith((".mid", ".midi"))]
    if not paths:
        raise DataError(f"dataset.files: {list(d.files)} holds no .mid or .midi files")
    # A file's composer is its folder's name (bach/prelude.mid), as collections are usually sorted.
    listed = [(Path(p).parent.name, p) for p in paths]
    try:
        pieces = _parse_in_parallel(_midi_pieces, listed, d, "midi")
    except ValueError as e:  # datasets refuses to build an empty dataset: no file gave notes
        if "corresponds to no data" not in str(e):
            raise
        pieces = None
    parsed = set() if pieces is None else set(zip(pieces["composer"], pieces["title"]))
    skipped = [(path, _why_no_notes(path)) for composer, path in listed if (composer, Path(path).name) not in parsed]
    if pieces is None:
        path, why = skipped[0]
        raise DataError(f"dataset.files: none of the {len(listed)} MIDI files gives notes; {path}: {why}")
    for path, why in skipped:
        warn(f"dataset.files: {path}: {why}; skipped")
    return pieces


def _midi_pieces(items: list[tuple[str, str]], default_velocity: int) -> Iterator[dict]:
    """The notes of each readable file; a file that is not is left out here and named by _midi_files."""
    from data.midi import read_midi

    for composer, path in items:
        try:
            notes = read_midi(path)
        except DataError:
            continue
        if len(notes):
            yield {"composer": composer, "title": Path(path).name, **notes.as_columns()}


def _why_no_notes(path: str) -> str:
    from data.midi import read_midi

    try:
        read_midi(path)
    except DataError as e:
        return str(e).removeprefix(f"{path}: ")
    return "holds no notes"


def _parse_in_parallel(generator, items: list[tuple[str, str]], d: NotesConfig, label: str) -> datasets.Dataset:
    """Run `generator` over shards of `items` in dataset.num_proc worker processes; datasets caches the result by
    the generator's code and its arguments, so the next run reads Arrow files instead of parsing."""
    shards = min(d.num_proc, len(items))
    stamps = [os.path.getmtime(path) for _, path in items]  # an edited file is parsed again
    pieces = hf_datasets().Dataset.from_generator(
        _in_workers,
        features=note_features(),
        # Interleaving spreads the big files (the list is sorted by size) over all the workers.
        gen_kwargs={
            "parse": generator,
            "shards": [items[i::shards] for i in range(shards)],
            "default_velocity": d.default_velocity,
        },
        cache_dir=str(Path(d.cache_dir) / "notes"),
        fingerprint=hashlib.sha256(json.dumps([label, items, stamps, d.default_velocity]).encode()).hexdigest()[:16],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyarrow's deprecation notice about datasets' sort options
        return pieces.sort(["composer", "title"])


def _in_workers(parse, shards: list[list[tuple[str, str]]], default_velocity: int) -> Iterator[dict]:
    """The pieces of every shard, each shard parsed in a worker started with `spawn`: forking a process that runs
    JAX's threads can deadlock it."""
    if len(shards) <= 1:
        for shard in shards:
            yield from parse(shard, default_velocity)
        return
    with ProcessPoolExecutor(len(shards), mp_context=multiprocessing.get_context("spawn")) as pool:
        for pieces in pool.map(_parse_shard, [parse] * len(shards), shards, [default_velocity] * len(shards)):
            yield from pieces


def _parse_shard(parse, items: list[tuple[str, str]], default_velocity: int) -> list[dict]:
    return list(parse(items, default_velocity))


# --- Hub datasets in the maestro layout ----------------------------------------------------------------------------


def _maestro(d: MaestroConfig) -> dict[str, datasets.Dataset]:
    """`dataset.base_dataset_name` gives the validation and test splits, `dataset.extra_datasets` the training
    pieces (the base dataset's own train split when there are none). A name is a Hub id or a local folder."""
    if not hub_reachable():
        offline_hub()
    train_names = list(d.extra_datasets) or [d.base_dataset_name]
    corpus = {
        "val": _maestro_split(d.base_dataset_name, d.val_split or "validation", d),
        "test": _maestro_split(d.base_dataset_name, d.test_split or "test", d),
        "train": hf_datasets().concatenate_datasets([_maestro_split(name, "train", d) for name in train_names]),
    }
    return corpus


def _maestro_split(name: str, split: str, d: MaestroConfig) -> datasets.Dataset:
    try:
        ds = hf_datasets().load_dataset(name, split=split, cache_dir=str(Path(d.cache_dir) / "hf"))
    except Exception as e:  # the Hub raises many types: connection, offline mode, not found, gated, bad config
        reason = first_line(e)
        raise DataError(
            f"dataset {name} ({split}): could not load it: {reason}. Offline? Use dataset=music21 (ships "
            f"with music21) or dataset=midi_files dataset.files=[...]"
        ) from None
    return ds.map(_maestro_row, remove_columns=ds.column_names, features=note_features())


def _maestro_row(row: dict) -> dict:
    """One row of the maestro layout: `notes` (a struct of pitch / velocity / start / end lists) or those four as
    columns; `source` (a JSON string with composer and title) or `composer` / `title` columns."""
    notes = row["notes"] if "notes" in row else row
    meta = json.loads(row["source"]) if isinstance(row.get("source"), str) else row
    composer = meta.get("composer") or meta.get("canonical_composer") or ""
    title = meta.get("title") or meta.get("canonical_title") or ""
    parsed = Notes.from_lists(notes["pitch"], notes["velocity"], notes["start"], notes["end"])
    return {"composer": composer, "title": title, **parsed.as_columns()}
