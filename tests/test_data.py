"""Data: deterministic splits, packing with <EOS>, and batches that are a pure function of (seed, step, process)."""

import re
import socket

import numpy as np
import pytest

from core.errors import ConfigError, DataError
from data.batches import EvalBatches, TrainBatches
from data.corpus import load_corpus
from data.examples import DocumentRows, Examples, Records, Windows, token_positions
from data.sources import split_of, stdlib_files
from training.config import load_config

PAD = 257


def stream(n=5000, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n).astype(np.uint16)


def test_split_is_a_stable_hash_of_the_identity():
    labels = [split_of(f"pkg/file{i}.py", 0.1, 0.1) for i in range(5000)]
    assert labels == [split_of(f"pkg/file{i}.py", 0.1, 0.1) for i in range(5000)]
    share = {name: labels.count(name) / len(labels) for name in ("train", "val", "test")}
    assert abs(share["val"] - 0.1) < 0.02 and abs(share["test"] - 0.1) < 0.02


def test_pystdlib_holds_out_whole_packages_as_extra_validation_splits(data_cache):
    cfg = load_config([f"dataset.cache_dir={data_cache}", "dataset.extra_val_splits=[json,email]"])
    corpus = load_corpus(cfg.dataset).datasets
    assert set(corpus) == {"train", "val", "test", "json", "email"}
    root, files = stdlib_files()
    json_files = {str(p) for p in files if p.relative_to(root).parts[0] == "json"}
    assert len(corpus["json"]) == len(json_files)
    assert "site-packages" not in str(files) and not any("/test/" in str(p) for p in files)
    assert sum(len(corpus[s]) for s in corpus) == len(files)  # every file in exactly one split
    joined = "".join(corpus["train"]["text"])
    assert "class JSONDecoder" not in joined  # json/decoder.py lives in the json split only


def augmented_record(index: int, rng: np.random.Generator | None) -> list[int]:
    """Record `index` opens with its index; in training a random tail (drawn from rng) follows, so the batch shows
    whether a record's augmentation is a function of (seed, sample)."""
    return [index % 256, *(rng.integers(0, 256, rng.integers(1, 11)).tolist() if rng is not None else [])]


def examples(kind: str) -> Examples:
    """Both kinds of numbered examples: windows of a packed stream, and augmented records padded to 16 + 1."""
    return Windows(stream(), 16, PAD) if kind == "windows" else Records(300, augmented_record, 16, PAD)


KINDS = ["windows", "records"]


@pytest.mark.parametrize("kind", KINDS)
def test_train_batch_is_a_pure_function_of_seed_and_step(kind):
    a = TrainBatches(examples(kind), 4, 1, 0, 1, seed=3)
    b = TrainBatches(examples(kind), 4, 1, 0, 1, seed=3)
    for step in (0, 7, 100, 5):
        for key in ("inputs", "targets", "loss_mask"):
            np.testing.assert_array_equal(a.batch(step)[key], b.batch(step)[key])
    c = TrainBatches(examples(kind), 4, 1, 0, 1, seed=4)
    assert not np.array_equal(a.batch(0)["inputs"], c.batch(0)["inputs"])


def test_batch_shapes_and_targets_are_inputs_shifted():
    data = stream()
    batches = TrainBatches(Windows(data, 16, PAD), 4, 2, 0, 1, seed=0)
    batch = batches.batch(3)
    assert batch["inputs"].shape == (2, 4, 16) and batch["inputs"].dtype == np.int32
    np.testing.assert_array_equal(batch["inputs"][..., 1:], batch["targets"][..., :-1])
    assert batch["loss_mask"].min() == 1.0  # packed pretraining data has no padding


@pytest.mark.parametrize("kind", KINDS)
def test_processes_slice_the_single_process_batch(kind):
    full = TrainBatches(examples(kind), 8, 2, 0, 1, seed=0).batch(5)
    parts = [TrainBatches(examples(kind), 4, 2, p, 2, seed=0).batch(5) for p in range(2)]
    for key in ("inputs", "loss_mask"):
        np.testing.assert_array_equal(np.concatenate([p[key] for p in parts], axis=1), full[key])


@pytest.mark.parametrize("kind", KINDS)
def test_accumulated_micro_batches_are_the_big_batch(kind):
    micro = TrainBatches(examples(kind), 4, 3, 0, 1, seed=0).batch(2)["inputs"]
    big = TrainBatches(examples(kind), 12, 1, 0, 1, seed=0).batch(2)["inputs"]
    np.testing.assert_array_equal(micro.reshape(1, 12, 16), big)


def test_an_epoch_visits_every_record_once_and_pads_short_ones():
    batches = TrainBatches(Records(300, augmented_record, 16, PAD), 5, 1, 0, 1, seed=1)
    firsts = np.concatenate([batches.batch(step)["inputs"][0, :, 0] for step in range(60)])
    assert sorted(firsts.tolist()) == sorted(i % 256 for i in range(300))  # 300 samples: every record once
    batch = batches.batch(0)
    lengths = (batch["inputs"] != PAD).sum(-1)
    np.testing.assert_array_equal(batch["loss_mask"].sum(-1), lengths - 1)  # no target past the record's end


def test_an_epoch_visits_every_window_once():
    data = np.arange(16 * 50 + 40, dtype=np.int64) % 60000  # distinct values identify windows
    batches = TrainBatches(Windows(data.astype(np.uint16), 16, PAD), 5, 1, 0, 1, seed=1)
    starts = []
    for step in range(batches.examples.num_examples // 5):
        starts.extend(batches.batch(step)["inputs"][0, :, 0].tolist())
    assert len(set(starts)) == len(starts) == (batches.examples.num_examples // 5) * 5
    assert all(s % 16 == starts[0] % 16 for s in starts)  # one epoch, one offset


def speedrun_rows(documents: list[list[int]], eos: int, context: int, most: int | None) -> list[list[int]]:
    """The GPT-2 speedrun's document-aligned sequences, written from its rule: documents in order, each with its BOS
    (here the <EOS> before it; the first document has none) and cut to `most` tokens; a sequence takes them until it
    holds context + 1 tokens, cutting the last, and the next sequence starts at the next document."""
    pieces = [([] if i == 0 else [eos]) + doc for i, doc in enumerate(documents)]
    pieces = [p[:most] if most else p for p in pieces]
    rows, i = [], 0
    while sum(len(p) for p in pieces[i:]) >= context + 1:
        row = []
        while len(row) < context + 1:
            row += pieces[i][: context + 1 - len(row)]
            i += 1
        rows.append(row)
    return rows


@pytest.mark.parametrize("most", [None, 2, 5, 40])
def test_document_rows_begin_at_a_document_and_cut_documents_as_the_speedrun_does(most):
    rng = np.random.default_rng(0)
    documents = [rng.integers(1, 200, rng.integers(1, 30)).tolist() for _ in range(150)]
    stream_ = np.asarray([t for doc in documents for t in [*doc, 255]], np.uint16)  # each document ends in <EOS>
    rows = DocumentRows(stream_, 16, PAD, 255, most)
    want = speedrun_rows(documents, 255, 16, most)
    assert rows.num_examples == len(want) > 10
    np.testing.assert_array_equal(rows.rows(np.arange(rows.num_examples)), np.asarray(want))
    assert all(r[0] == 255 for r in want[1:])  # every row after the split's first begins at a document's BOS
    # the documents found a chunk at a time (a split too large to read at once), or given by a token store's index
    np.testing.assert_array_equal(token_positions(stream_, 255, chunk=7), np.flatnonzero(stream_ == 255))
    given = DocumentRows(stream_, 16, PAD, 255, most, eos_positions=np.flatnonzero(stream_ == 255))
    np.testing.assert_array_equal(given.rows(np.arange(given.num_examples)), np.asarray(want))
    # with document masking a document's segment begins at its BOS, as the speedrun's does
    masked = DocumentRows(stream_, 16, PAD, 255, most, eos_id=255)
    batch = masked.batch(masked.rows(np.arange(masked.num_examples)))
    for inputs, segments in zip(batch["inputs"][1:], batch["segment_ids"][1:]):
        starts = np.flatnonzero(inputs == 255)
        assert starts[0] == 0 and (np.diff(segments) == (inputs[1:] == 255)).all()  # a new segment at each BOS
        np.testing.assert_array_equal(segments[starts], np.arange(1, len(starts) + 1))


def test_document_starts_train_on_rows_that_begin_at_a_document_and_leave_evaluation_as_it_was(data_cache):
    from helpers import build, tiny_overrides

    common = tiny_overrides(data_cache, "dataset.document_mask=true")
    plain = build(common)
    aligned = build([*common, "dataset.document_starts=true", "dataset.max_document_tokens=48"])
    eos = aligned.tokenizer.eos_id
    inputs = np.concatenate([aligned.data.train.batch(s)["inputs"].reshape(-1, 64) for s in range(4)])
    first = aligned.data.train.examples.rows(np.zeros(1, np.int64))[0, :-1]  # the split's first document has no BOS
    assert (inputs[:, 0] == eos).sum() >= 24 and all(row[0] == eos or np.array_equal(row, first) for row in inputs)
    # no document runs past 48 tokens: a document's tokens are those between two <EOS> of a row
    runs = [len(part) for row in inputs for part in np.split(row, np.flatnonzero(row == eos))[1:-1]]
    assert runs and max(runs) <= 48 and min(runs) >= 1
    assert not (plain.data.train.batch(0)["inputs"][..., 0] == eos).all()  # windows start anywhere
    for a, b in zip(plain.data.evals["val"], aligned.data.evals["val"]):
        np.testing.assert_array_equal(a["inputs"], b["inputs"])


def test_max_document_tokens_needs_document_starts():
    with pytest.raises(ConfigError, match=r"^config: dataset.max_document_tokens: cuts documents of rows"):
        load_config(["dataset.max_document_tokens=64"])


def test_eval_batches_are_fixed_and_padded():
    data = stream(16 * 10 + 1)
    ev = EvalBatches(Windows(data, 16, PAD), 4, num_batches=5, process_index=0, process_count=1)
    batches = list(ev)
    assert len(batches) == len(ev) == 3  # all 10 windows, in batches of 4
    np.testing.assert_array_equal(batches[0]["inputs"][0], data[:16])
    assert batches[2]["loss_mask"][:2].min() == 1 and batches[2]["loss_mask"][2:].max() == 0
    again = list(EvalBatches(Windows(data, 16, PAD), 4, 5, 0, 1))
    np.testing.assert_array_equal(again[1]["targets"], batches[1]["targets"])


def test_eval_windows_spread_over_the_whole_split():
    data = np.arange(16 * 100 + 1, dtype=np.int64).astype(np.uint16)
    ev = EvalBatches(Windows(data, 16, PAD), 5, num_batches=2, process_index=0, process_count=1)
    starts = np.concatenate([b["inputs"][:, 0] for b in ev])
    np.testing.assert_array_equal(starts, np.arange(10) * 160)  # 10 of 100 windows, every 10th


def test_text_files_source_reads_the_users_files(tmp_path, data_cache):
    for i in range(40):
        (tmp_path / f"doc{i}.txt").write_text(f"document number {i}\n" * 20)
    cfg = load_config(
        [
            "dataset=text_files",
            f"dataset.files=[{tmp_path}/*.txt]",
            f"dataset.cache_dir={data_cache}",
            "dataset.val_fraction=0.2",
            "dataset.test_fraction=0.1",
        ]
    )
    corpus = load_corpus(cfg.dataset).datasets
    assert sum(len(v) for v in corpus.values()) == 40
    assert len(corpus["val"]) > 0 and len(corpus["train"]) > len(corpus["val"])


@pytest.mark.parametrize("source", ["text_files", "json_files", "hf"])
def test_files_rewritten_with_their_old_modification_time_are_read_anew(source, tmp_path, data_cache):
    """`cp -p`, `rsync -a` or `tar x` give a rewritten file its old time back: `datasets`, which tells local files
    apart by path and time alone, handed back its Arrow copy of the old text, into a token store built for the new
    (dataset=hf over local files too: a Hub builder, `json`, reading them)."""
    import json
    import os

    suffix = "txt" if source == "text_files" else "jsonl"
    paths = [tmp_path / f"doc{i:02d}.{suffix}" for i in range(20)]

    def write(word: str) -> None:
        for i, path in enumerate(paths):
            text = f"{word} {i}\n" * (3 if word == "old" else 5)
            path.write_text(text if source == "text_files" else json.dumps({"text": text}) + "\n")
            os.utime(path, ns=(10**18 + i, 10**18 + i))  # the same time for the old and the new contents

    overrides = [f"dataset={source}", f"dataset.files=[{tmp_path}/*.{suffix}]", f"dataset.cache_dir={data_cache}"]
    if source == "hf":
        overrides += ["dataset.hf_path=json", "dataset.val_split=null", "dataset.test_split=null"]
    cfg = load_config([*overrides, "dataset.val_fraction=0.2", "dataset.test_fraction=0"])
    texts, fingerprints = [], []
    for word in ("old", "new"):
        write(word)
        corpus = load_corpus(cfg.dataset)
        texts.append(" ".join(text for split in corpus.datasets.values() for text in split["text"]))
        fingerprints.append(corpus.fingerprint)  # the token store's key: a new one for the new text
    assert "old" in texts[0] and "new" not in texts[0]
    assert "new" in texts[1] and "old" not in texts[1]
    assert fingerprints[0] != fingerprints[1]


def test_a_file_two_patterns_find_is_read_once_and_a_folders_hidden_files_are_not_read(tmp_path, monkeypatch):
    """A folder given twice (absolute and relative, or through a link) was read twice, its files' copies in two
    splits; a folder's `.git` objects (zlib bytes) and a `.cache` of token stores were read as documents."""
    from data.files import named_files

    for name in ("c/one.txt", "c/sub/two.txt", "c/.git/objects/ab", "c/.cache/tokens/x.bin", "c/.notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "c")
    monkeypatch.chdir(tmp_path)
    found = named_files(["c", f"{tmp_path}/c/", "link", "c/.notes.txt"])
    assert found == {"c/one.txt": "one.txt", "c/sub/two.txt": "sub/two.txt", "c/.notes.txt": ".notes.txt"}


def test_an_empty_json_lines_file_is_named_as_empty(tmp_path, data_cache):
    """It was `datasets cannot read them as JSON (StopIteration)`."""
    (tmp_path / "rows.jsonl").write_text("\n")
    cfg = load_config(
        ["dataset=json_files", f"dataset.files=[{tmp_path}/rows.jsonl]", f"dataset.cache_dir={data_cache}"]
    )
    with pytest.raises(DataError, match=rf"^dataset.files: {tmp_path}/rows.jsonl is empty \(no JSON row\)"):
        _ = load_corpus(cfg.dataset).datasets


def _json_corpus(tmp_path, data_cache, rows_per_file):
    import json

    paths = []
    for i, rows in enumerate(rows_per_file):
        paths.append(tmp_path / f"part{i}.jsonl")
        paths[-1].write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = load_config(
        ["dataset=json_files", f"dataset.files=[{','.join(map(str, paths))}]", f"dataset.cache_dir={data_cache}"]
    )
    return paths, cfg.dataset, load_corpus(cfg.dataset)


def test_json_files_with_other_columns_beside_the_text_are_read_together(tmp_path, data_cache):
    """Shards from two sources (an `id` in one, a `url` in the other) failed with `datasets cannot read them as JSON
    (Couldn't cast)`: the first file's columns were taken as every file's. The rows, in order, split as one file's."""
    one = [{"text": f"first {i}", "id": i} for i in range(30)]
    two = [{"text": f"second {i}", "url": f"u{i}"} for i in range(30)]
    three = [{"text": f"third {i}", "id": f"x{i}"} for i in range(30)]  # `id` of another type: that failed too
    _, d, corpus = _json_corpus(tmp_path, data_cache, [one, two, three])
    texts = [row["text"] for row in one + two + three]
    split = [split_of(f"row-{i}", d.val_fraction, d.test_fraction) for i in range(len(texts))]
    expected = {name: [t for t, s in zip(texts, split) if s == name] for name in set(split)}
    assert {name: list(rows["text"]) for name, rows in corpus.datasets.items()} == expected


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [[{"text": "a", "id": 1}], [{"body": "b", "url": "u"}]],
            "dataset.text_column: 'text' is not a column of {1}; it has body, url",
        ),
        (
            [[{"text": "a"}, {"text": 5}, {"text": "c"}]],
            "dataset.text_column: 'text' is 5 (int), not text, in {0} line 2",
        ),
        (
            [[{"text": "a", "id": 1}], [{"text": "b", "url": "u"}, {"text": ["x"], "url": "v"}]],
            "'text' is [\"x\"] (list), not text, in {1} line 2",
        ),
    ],
    ids=["a file without the column", "a number among strings", "a list in a file of other columns"],
)
def test_a_json_row_without_text_is_named_by_file_and_line(tmp_path, data_cache, rows, message):
    """It said `datasets cannot read them as JSON (Couldn't cast)`, or `'text' holds json, not text` naming no row."""
    paths, _, corpus = _json_corpus(tmp_path, data_cache, rows)
    with pytest.raises(DataError) as caught:
        _ = corpus.datasets
    assert message.format(*paths) in str(caught.value), caught.value


@pytest.mark.parametrize(
    ("late", "message"),
    [({"text": "late", "url": "u"}, None), ({"text": 7, "url": "u"}, "'text' is 7 (int), not text, in {0} line 1101")],
    ids=["another key", "a number"],
)
def test_one_json_file_whose_rows_change_keys_past_10_mb_is_read(tmp_path, data_cache, late, message):
    """datasets takes a file's keys from its first 10 MB: a row after them with another key was refused ('its rows do
    not all have the same keys'). Every row is read, in order; a bad value there is still named by its line."""
    rows = [{"text": f"{i} " + "x" * 10_000} for i in range(1100)] + [late, {"text": "last"}]
    paths, d, corpus = _json_corpus(tmp_path, data_cache, [rows])
    assert paths[0].stat().st_size > 11 * 10**6
    if message:
        with pytest.raises(DataError, match=re.escape(message.format(*paths))):
            _ = corpus.datasets
        return
    split = [split_of(f"row-{i}", d.val_fraction, d.test_fraction) for i in range(len(rows))]
    expected = {name: [r["text"] for r, s in zip(rows, split) if s == name] for name in set(split)}
    assert {name: list(part["text"]) for name, part in corpus.datasets.items()} == expected


def test_a_glob_that_matches_a_directory_takes_the_files_under_it(tmp_path):
    from data.files import expand_files

    for name in ("a/one.txt", "a/sub/two.txt", "b.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    every = [str(tmp_path / n) for n in ("a/one.txt", "a/sub/two.txt", "b.txt")]
    assert expand_files([f"{tmp_path}/*"]) == expand_files([str(tmp_path)]) == every
    assert expand_files([f"{tmp_path}/a/su*"]) == [str(tmp_path / "a/sub/two.txt")]  # it said: matches no file


def test_a_files_split_is_the_same_however_its_folder_is_spelled(tmp_path, data_cache, monkeypatch):
    """text_files: a file's split comes from its name below its pattern's folder, so the folder given absolute,
    relative, as a glob or with `./` (a resume from elsewhere, another machine) holds out the same files: with the
    path's whole spelling, a run from another directory trained on the first one's validation files."""
    for i in range(40):
        (tmp_path / "c" / f"doc{i:02d}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "c" / f"doc{i:02d}.txt").write_text(f"document {i}\n" * 5)
    monkeypatch.chdir(tmp_path)
    held_out = []
    for files in (f"{tmp_path}/c", "c", "./c/*.txt", f"{tmp_path}/c/*"):
        cfg = load_config(["dataset=text_files", f"dataset.files=[{files}]", f"dataset.cache_dir={data_cache}"])
        corpus = load_corpus(cfg.dataset)
        held_out.append(sorted(t for t in corpus.datasets["val"]["text"]))
    assert held_out[0] and all(h == held_out[0] for h in held_out), held_out


def test_a_compressed_text_file_is_read_and_one_that_does_not_decompress_is_named(tmp_path, data_cache):
    """datasets' text loader decompresses a file by its name (`.gz`) or first bytes; one that does not decompress
    (not gzip after all, `.zst` without zstandard) was a traceback ending "An error occurred while generating the
    dataset", naming no file."""
    import gzip

    for i in range(12):
        (tmp_path / f"doc{i}.txt").write_text(f"document number {i}\n" * 20)
    (tmp_path / "packed.txt.gz").write_bytes(gzip.compress(b"a packed document\n" * 20))
    overrides = ["dataset=text_files", f"dataset.files=[{tmp_path}]", f"dataset.cache_dir={data_cache}"]
    texts = [t for split in load_corpus(load_config(overrides).dataset).datasets.values() for t in split["text"]]
    assert sum("a packed document" in t for t in texts) == 1 and len(texts) == 13
    (tmp_path / "notes.gz").write_text("plain text under a gzip name\n")
    with pytest.raises(DataError, match=rf"^dataset.files: {tmp_path}/notes.gz: read as compressed .* \(Not a gzip"):
        _ = load_corpus(load_config(overrides).dataset).datasets
    (tmp_path / "notes.gz").unlink()  # a download stopped part way: its header reads, its end is missing
    whole = gzip.compress(np.random.default_rng(0).bytes(300_000).hex().encode())
    (tmp_path / "cut.txt.gz").write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(DataError, match=rf"^dataset.files: {tmp_path}/cut.txt.gz: .* \(Compressed file ended before"):
        _ = load_corpus(load_config(overrides).dataset).datasets


def test_text_files_that_match_nothing_fail_clearly(tmp_path):
    cfg = load_config(["dataset=text_files", f"dataset.files=[{tmp_path}/missing/*.txt]"])
    with pytest.raises(DataError, match="matches no file"):
        load_corpus(cfg.dataset)


@pytest.mark.parametrize(
    ("empty", "fix"), [("train", "lower dataset.val_fraction"), ("val", "raise dataset.val_fraction")]
)
def test_an_empty_split_names_the_fraction_that_fills_it(tmp_path, data_cache, empty, fix):
    """One file, placed by its path's hash in the split that is not empty: the line says which way to move."""
    kept = "val" if empty == "train" else "train"
    path = next(p for i in range(100) if split_of((p := tmp_path / f"doc{i}.txt").name, 0.4, 0.0) == kept)
    path.write_text("the only document\n" * 20)
    overrides = ["dataset=text_files", f"dataset.files=[{path}]", f"dataset.cache_dir={data_cache}"]
    cfg = load_config([*overrides, "dataset.val_fraction=0.4", "dataset.test_fraction=0"])
    with pytest.raises(DataError, match=f"the {empty} split is empty; add documents or {fix}"):
        _ = load_corpus(cfg.dataset).datasets


def test_the_hub_is_probed_only_outside_offline_mode(monkeypatch):
    """HF_HUB_OFFLINE=1 (set for every test) means no lookup at all; without it, a failed lookup is what sends the
    Hub code paths offline at once (instead of huggingface_hub's retries)."""
    import datasets

    from core.hub import hub_reachable

    lookups = []

    def no_dns(host, *args, **kwargs):
        lookups.append(host)
        raise OSError("no network")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    assert hub_reachable() is False and lookups == []
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    assert hub_reachable() is False and lookups == ["huggingface.co"]


def test_every_loader_has_a_section_class_and_every_section_class_a_loader():
    """data/corpus.py's loaders and data/config.py's sections name the same sources (a mixture has no loader of its
    own: it loads its sources'), and the notes loaders are the notes sections."""
    from data.config import MIXTURE, SOURCE_CONFIGS, NotesConfig
    from data.corpus import LOADERS, NOTE_SOURCES

    assert set(LOADERS) | {MIXTURE} == set(SOURCE_CONFIGS)
    assert {s for s, c in SOURCE_CONFIGS.items() if issubclass(c, NotesConfig)} == set(NOTE_SOURCES)
