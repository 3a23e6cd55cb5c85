"""The token store: built once, read as memory maps, never trusted when stale, the same bytes however it was built."""

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from core.errors import DataError
from data.corpus import load_corpus
from data.packing import tokenized_corpus
from data.token_store import token_dtype
from data.tokenizers import ByteTokenizer, build_tokenizer
from helpers import communicate, spawn
from training.config import load_config

ROOT = Path(__file__).resolve().parent.parent

# A child process that builds a store slowly (the real build, each batch delayed), so it can be killed midway.
SLOW_BUILD = """
import sys, time
sys.path.insert(0, {root!r})
from data.tokenizers import ByteTokenizer
from data.packing import tokenized_corpus
from data.corpus import load_corpus
from training.config import load_config
encode = ByteTokenizer.encode_documents
def slow(self, texts):
    time.sleep({delay})
    return encode(self, texts)
ByteTokenizer.encode_documents = slow
d = load_config({overrides!r}).dataset
tokenized_corpus(load_corpus(d), ByteTokenizer(), d, {index}, {count})
"""


class CountingByteTokenizer(ByteTokenizer):
    """The byte tokenizer (same ids, same fingerprint), counting the documents it encodes."""

    documents = 0

    def encode_documents(self, texts):
        self.documents += len(texts)
        return super().encode_documents(texts)


# A file's split is a hash of its path, which holds pytest's temporary folder: with 60 documents the val split (0.2)
# is empty with probability 0.8^60, whatever the folder
DOCS = 60


def write_files(folder: Path, n: int, start: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + n):
        (folder / f"doc{i:03d}.txt").write_text(f"document {i}: " + "text é " * (i % 7) + "\n")


def text_files(folder: Path, cache: Path, *extra: str) -> list[str]:
    return [
        "dataset=text_files",
        f"dataset.files=[{folder}]",
        "dataset.tokenizer=byte",
        f"dataset.cache_dir={cache}",
        "dataset.val_fraction=0.2",
        "dataset.test_fraction=0.1",
        *extra,
    ]


def streamed(jsonl: Path, cache: Path, *extra: str) -> list[str]:
    """A streamed corpus through the Hub loader's code path, from a local JSON-lines file (no network)."""
    return [
        "dataset=hf",
        "dataset.hf_path=json",
        f"dataset.files=[{jsonl}]",
        "dataset.streaming=true",
        "dataset.tokenizer=byte",
        "dataset.val_split=null",
        "dataset.test_split=null",
        "dataset.val_fraction=0.2",
        "dataset.test_fraction=0.1",
        "dataset.max_tokens=1000000000",
        f"dataset.cache_dir={cache}",
        *extra,
    ]


def loaded(jsonl: Path, cache: Path, *extra: str) -> list[str]:
    """The same file through the Hub loader's code path, loaded whole instead of streamed (no cap on its tokens)."""
    return [
        *(o for o in streamed(jsonl, cache) if not o.startswith("dataset.max_tokens=")),
        "dataset.streaming=false",
        *extra,
    ]


def write_jsonl(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"text": f"row {i} " + "words " * (i % 5), "id": i}) + "\n" for i in range(n)))


def store_bytes(store) -> dict:
    return {split: (store.tokens(split).tobytes(), store.document_ends(split).tobytes()) for split in store.splits}


def build(overrides: list[str], tokenizer=None, index: int = 0, count: int = 1):
    d = load_config(overrides).dataset
    corpus = load_corpus(d)
    return corpus, tokenized_corpus(corpus, tokenizer or ByteTokenizer(), d, index, count)


def test_a_split_local_files_do_not_have_is_one_line_naming_its_key(tmp_path):
    """A datasets builder over local files (hf_path=json) has only a train split: the preset's validation split is
    one line naming dataset.val_split and what to set, not a failure blamed on the Hub."""
    write_jsonl(tmp_path / "a.jsonl", 30)
    overrides = [
        o for o in loaded(tmp_path / "a.jsonl", tmp_path / "cache") if "_split=" not in o and "fraction" not in o
    ]
    with pytest.raises(DataError) as refused:
        load_corpus(load_config(overrides).dataset)
    assert str(refused.value).startswith('dataset.val_split: Unknown split "validation"'), refused.value
    assert str(refused.value).endswith("; dataset.val_split=null holds out dataset.val_fraction of train instead")


def test_a_missing_test_split_beside_the_sources_validation_split_names_what_null_does_there(tmp_path):
    """A local dataset folder with train and validation files and no test file: `dataset.test_split=null` was said
    to hold out test_fraction of train, where it runs without a test split (train is split only when val_split is
    null too; test_fraction is then refused)."""
    (tmp_path / "ds").mkdir()
    write_jsonl(tmp_path / "ds" / "train.jsonl", 30)
    write_jsonl(tmp_path / "ds" / "validation.jsonl", 5)
    overrides = ["dataset=hf", f"dataset.hf_path={tmp_path / 'ds'}", f"dataset.cache_dir={tmp_path / 'cache'}"]
    with pytest.raises(DataError) as refused:
        load_corpus(load_config([*overrides, "dataset.val_split=validation", "dataset.test_split=test"]).dataset)
    assert str(refused.value).startswith('dataset.test_split: Unknown split "test"'), refused.value
    assert str(refused.value).endswith(
        "; dataset.test_split=null runs without a test split (dataset.test_fraction of train is held out only when "
        "dataset.val_split, here validation, is null too)"
    )
    corpus = load_corpus(load_config([*overrides, "dataset.val_split=validation", "dataset.test_split=null"]).dataset)
    assert set(corpus.datasets) == {"train", "val"}  # as said


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"text": "a"}\n{"text": "b"\n', "dataset.files: {f} line 2: not valid JSON (column 13: Expecting"),
        ("", "dataset.files: {f} is empty (no JSON row); fill it or leave it out"),
    ],
    ids=["malformed line", "empty"],
)
def test_local_json_files_through_the_hub_loader_that_do_not_parse_are_named_not_blamed_on_the_hub(
    content, message, tmp_path, capfd
):
    """dataset=hf dataset.hf_path=json over local files (docs/data.md: as json_files reads them): a line that does
    not parse was 'could not load it from the Hugging Face Hub ... Offline?', after datasets' own ERROR line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    with pytest.raises(DataError) as refused:
        load_corpus(load_config(loaded(bad, tmp_path / "cache")).dataset)
    assert str(refused.value).startswith(message.format(f=bad)), refused.value
    assert "Hub" not in str(refused.value) and "ERROR" not in capfd.readouterr().err


def test_a_local_csv_the_hub_loader_cannot_read_is_one_line_naming_it_and_the_readers_reason(tmp_path):
    """Another builder than json (csv): its reader's reason (a quote left open) is said with the file, not datasets'
    'An error occurred while generating the dataset', which names neither."""
    bad = tmp_path / "bad.csv"
    bad.write_text('text\n"an open quote\n')
    overrides = ["dataset=hf", "dataset.hf_path=csv", f"dataset.files=[{bad}]", "dataset.streaming=false"]
    overrides += ["dataset.val_split=null", "dataset.test_split=null", f"dataset.cache_dir={tmp_path / 'cache'}"]
    with pytest.raises(DataError) as refused:
        load_corpus(load_config(overrides).dataset)
    assert str(refused.value).startswith(f"dataset.files: the csv builder (dataset.hf_path) could not read {bad}: ")
    assert "EOF inside string" in str(refused.value), refused.value


def test_a_text_column_of_numbers_is_one_line_streamed_or_not(tmp_path):
    """dataset.text_column naming a column of numbers: the tokenizer's AttributeError on an int read as a traceback."""
    write_jsonl(tmp_path / "a.jsonl", 30)
    for overrides, message in (
        (loaded, r"dataset.text_column: 'id' of json holds int64, not text; its text columns: text$"),
        (streamed, r"dataset.text_column: 'id' of .* holds int, not text \(row 0\); name a column of strings$"),
    ):
        d = load_config(overrides(tmp_path / "a.jsonl", tmp_path / "cache", "dataset.text_column=id")).dataset
        with pytest.raises(DataError, match=message):
            tokenized_corpus(load_corpus(d), ByteTokenizer(), d, 0, 1)


def test_each_split_is_its_documents_each_followed_by_eos(tmp_path):
    write_files(tmp_path / "docs", DOCS)
    (tmp_path / "docs" / "empty.txt").write_text("")
    corpus, store = build(text_files(tmp_path / "docs", tmp_path / "cache"))
    tok = ByteTokenizer()
    for split, ds in corpus.datasets.items():
        docs = [t for t in ds["text"] if t]  # an empty file is not a document
        expected = [i for t in docs for i in tok.encode(t) + [tok.eos_id]]
        tokens = store.tokens(split)
        # a memory map; a split the path hash left empty (it depends on tmp_path) cannot map 0 bytes
        assert tokens.dtype == np.uint16 and (isinstance(tokens, np.memmap) or not expected)
        assert tokens.tolist() == expected
        assert store.document_ends(split).tolist() == np.cumsum([len(t.encode()) + 1 for t in docs]).tolist()
        assert store.text_bytes(split) == sum(len(t.encode()) for t in docs)
    assert token_dtype(50_259) == np.uint16 and token_dtype(70_000) == np.uint32


def test_a_second_run_opens_the_store_without_reading_a_document(tmp_path):
    write_files(tmp_path / "docs", DOCS)
    overrides = text_files(tmp_path / "docs", tmp_path / "cache")
    _, first = build(overrides)
    d = load_config(overrides).dataset
    corpus = load_corpus(d)
    corpus.load = lambda: pytest.fail("the documents were read again")
    second = tokenized_corpus(corpus, ByteTokenizer(), d)
    assert second.root == first.root and store_bytes(second) == store_bytes(first)


@pytest.mark.parametrize("spelling", ["relative", "renamed"])
def test_the_same_files_spelled_or_named_otherwise_open_the_store_built_first(tmp_path, monkeypatch, spelling):
    """The same files through a relative path, or under another dataset.name (a mixture's source name), were
    tokenised again into a second store (and a second BPE): its key held the path as spelled, its folder the name.
    (A run of several processes builds under its own name: its processes must agree on the folder.)"""
    write_files(tmp_path / "docs", DOCS)
    _, first = build(text_files(tmp_path / "docs", tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    folder, name = {"relative": ("docs", []), "renamed": (tmp_path / "docs", ["dataset.name=a"])}[spelling]
    d = load_config(text_files(folder, tmp_path / "cache", *name)).dataset
    corpus = load_corpus(d)
    corpus.load = lambda: pytest.fail("the documents were read again")
    second = tokenized_corpus(corpus, ByteTokenizer(), d)
    assert second.root == first.root and store_bytes(second) == store_bytes(first)
    assert [p.name for p in (tmp_path / "cache" / "tokens").iterdir() if p.is_dir()] == [first.root.name]


def test_a_stale_or_foreign_store_is_rebuilt_not_used(tmp_path):
    write_files(tmp_path / "docs", DOCS)
    overrides = text_files(tmp_path / "docs", tmp_path / "cache")
    _, byte_store = build(overrides)
    reference = store_bytes(byte_store)
    bpe = build_tokenizer(
        "bpe",
        bpe_vocab_size=300,
        train_texts=lambda: ["some text " * 50],
        corpus_fingerprint="x",
        cache_dir=str(tmp_path / "cache"),
    )
    _, bpe_store = build(overrides, bpe)
    assert bpe_store.root != byte_store.root and store_bytes(bpe_store) != reference
    # A store whose record names another tokenizer (copied, or half-overwritten) is not trusted: it is rebuilt.
    meta = json.loads((byte_store.root / "store.json").read_text())
    meta["inputs"]["tokenizer"] = "someone-else"
    (byte_store.root / "store.json").write_text(json.dumps(meta))
    (byte_store.root / "train.tokens").write_bytes(b"garbage")
    _, rebuilt = build(overrides)
    assert rebuilt.root == byte_store.root and store_bytes(rebuilt) == reference
    # An edited file changes the corpus's fingerprint: a new store, with the new text.
    (tmp_path / "docs" / "doc000.txt").write_text("changed")
    corpus, changed = build(overrides)
    assert changed.root != byte_store.root


def test_adding_a_file_moves_no_other_document_between_splits(tmp_path):
    write_files(tmp_path / "docs", 100)  # enough that every split holds some, whatever the temporary path

    def split_of_each_text(overrides):
        return {
            t: split for split, ds in load_corpus(load_config(overrides).dataset).datasets.items() for t in ds["text"]
        }

    before = split_of_each_text(text_files(tmp_path / "docs", tmp_path / "cache"))
    write_files(tmp_path / "docs", 1, start=100)
    (tmp_path / "docs" / "aaa-first.txt").write_text("a file sorted before all the others")
    after = split_of_each_text(text_files(tmp_path / "docs", tmp_path / "cache"))
    assert len(after) == len(before) + 2 and len(set(before.values())) == 3
    assert {t: after[t] for t in before} == before


def test_two_processes_build_the_same_bytes_as_one(tmp_path):
    write_files(tmp_path / "docs", 40)
    _, single = build(text_files(tmp_path / "docs", tmp_path / "one", "dataset.docs_per_chunk=3"))
    overrides = text_files(tmp_path / "docs", tmp_path / "two", "dataset.docs_per_chunk=3")
    children = [
        spawn(
            [
                sys.executable,
                "-c",
                SLOW_BUILD.format(root=str(ROOT), delay=0.05, overrides=overrides, index=i, count=2),
            ],
            cwd=tmp_path,
        )
        for i in range(2)
    ]
    assert [c.wait(timeout=120) for c in children] == [0, 0]
    _, double = build(overrides)
    assert double.root.name == single.root.name and store_bytes(double) == store_bytes(single)
    # Splits hash the (temporary) paths, so the chunk count varies; chunk k is process k mod 2's either way.
    shares = double.meta["chunks_built_by_process"]
    assert set(shares) == {"0", "1"} and shares["0"] - shares["1"] in (0, 1) and sum(shares.values()) >= 14


def test_another_process_of_a_run_opens_the_store_another_run_finished_while_it_built(tmp_path, monkeypatch):
    """Process 1 of a 2-process run builds its chunks without the build's lock (process 0 holds it). Another run
    (a sweep's job, 1 process) wanting the same store finished it meanwhile, and its clean-up deleted process 1's
    half-written shard: FileNotFoundError, and the 2-process run went down. Process 1 now opens the finished store."""
    from data import packing

    write_files(tmp_path / "docs", DOCS)
    overrides = text_files(tmp_path / "docs", tmp_path / "cache", "dataset.docs_per_chunk=4")
    monkeypatch.setattr(packing, "ENCODE_BATCH_DOCS", 2)  # a chunk in two batches: its files open between them

    class OtherRunFinishesMidway(ByteTokenizer):
        calls = 0

        def encode_documents(self, texts):
            self.calls += 1
            if self.calls == 2:  # process 1's first chunk (chunk 1) has its files open, half written
                other = spawn(
                    [
                        sys.executable,
                        "-c",
                        SLOW_BUILD.format(root=str(ROOT), delay=0, overrides=overrides, index=0, count=1),
                    ],
                    cwd=tmp_path,
                )
                assert other.wait(timeout=120) == 0
            return super().encode_documents(texts)

    tokenizer = OtherRunFinishesMidway()
    _, store = build(overrides, tokenizer, index=1, count=2)
    assert tokenizer.calls >= 2
    _, alone = build(text_files(tmp_path / "docs", tmp_path / "alone", "dataset.docs_per_chunk=4"))
    assert store_bytes(store) == store_bytes(alone)


def test_two_runs_that_want_the_same_store_at_once_build_it_once(tmp_path):
    """A sweep's jobs start together on one cache: one run builds the store while the other waits for it (one line
    saying so) and then opens it; both succeed, with the bytes one build makes."""
    write_files(tmp_path / "docs", 40)
    overrides = text_files(tmp_path / "docs", tmp_path / "cache", "dataset.docs_per_chunk=3")
    runs = [
        spawn(
            [sys.executable, "-c", SLOW_BUILD.format(root=str(ROOT), delay=0.2, overrides=overrides, index=0, count=1)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [communicate(run, timeout=120) for run in runs]
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    assert sorted("another run is building" in r.stdout for r in results) == [False, True]
    _, reference = build(text_files(tmp_path / "docs", tmp_path / "reference", "dataset.docs_per_chunk=3"))
    _, shared = build(overrides)
    assert store_bytes(shared) == store_bytes(reference)


@pytest.mark.parametrize("source", ["text_files", "streamed"])
def test_a_build_killed_midway_ends_with_the_same_bytes(tmp_path, source):
    if source == "text_files":
        write_files(tmp_path / "docs", 40)
        make = lambda cache: text_files(tmp_path / "docs", cache, "dataset.docs_per_chunk=2")  # noqa: E731
    else:
        write_jsonl(tmp_path / "rows.jsonl", 60)
        make = lambda cache: streamed(tmp_path / "rows.jsonl", cache, "dataset.docs_per_chunk=3")  # noqa: E731
    _, reference = build(make(tmp_path / "reference"))
    child = spawn(
        [
            sys.executable,
            "-c",
            SLOW_BUILD.format(root=str(ROOT), delay=0.3, overrides=make(tmp_path / "cache"), index=0, count=1),
        ],
        cwd=tmp_path,
    )
    stores = tmp_path / "cache" / "tokens"
    deadline = time.monotonic() + 120
    while len(list(stores.glob("*/chunk-*.json"))) < 3:
        assert child.poll() is None and time.monotonic() < deadline, "the build ended before it could be killed"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    (root,) = [p for p in stores.iterdir() if p.is_dir()]  # beside it, its build's lock file
    assert not (root / "store.json").exists()  # nothing a later run would trust
    # what a build killed in its join or mid-write leaves besides (the join's temporaries are as large as their split)
    leftovers = [root / "train.tokens.tmp99999", root / "val.docs.tmp99999", root / "chunk-00001.json.tmp99999"]
    for path in leftovers:
        path.write_bytes(b"\0" * 64)
    counting = CountingByteTokenizer()
    _, resumed = build(make(tmp_path / "cache"), counting)
    assert store_bytes(resumed) == store_bytes(reference)
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in reference.root.iterdir())
    total = sum(resumed.meta["splits"][s]["documents"] for s in resumed.splits)
    assert 0 < counting.documents <= total - 3  # the chunks finished before the kill were not tokenised again


def test_a_streamed_build_stops_after_the_chunk_that_reaches_max_tokens(tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", 200)
    _, whole = build(streamed(tmp_path / "rows.jsonl", tmp_path / "a", "dataset.docs_per_chunk=10"))
    _, capped = build(
        streamed(tmp_path / "rows.jsonl", tmp_path / "b", "dataset.docs_per_chunk=10", "dataset.max_tokens=500")
    )
    total = lambda store: sum(len(store.tokens(s)) for s in store.splits)  # noqa: E731
    assert 500 <= total(capped) < 500 + 10 * 40 and total(whole) > 2 * total(capped)
    for split in whole.splits:  # the capped store is the start of the whole one
        n = len(capped.tokens(split))
        assert capped.tokens(split).tolist() == whole.tokens(split)[:n].tolist()


@pytest.mark.parametrize("layout", [streamed, loaded], ids=["streamed", "loaded whole"])
def test_test_fraction_0_means_no_test_split_streamed_or_not(tmp_path, layout):
    """Streamed, the store holds an empty test split, which was refused as `split 'test' has 0 tokens, fewer than two
    windows`; loaded whole, the source has none. Either way: no test split, and the run goes on."""
    from data import make_data

    write_jsonl(tmp_path / "rows.jsonl", 200)
    cfg = load_config(layout(tmp_path / "rows.jsonl", tmp_path / "cache", "dataset.test_fraction=0"))
    data = make_data(cfg, load_corpus(cfg.dataset), ByteTokenizer(), 32, 0, 1)
    assert data.test is None and list(data.evals) == ["val"]
    assert data.summary.startswith("tokens: train ") and "test" not in data.summary


def test_an_empty_test_split_held_out_at_a_test_fraction_above_0_is_refused(tmp_path):
    """Only test_fraction=0 means no test split: at 0.001 of 200 rows the stream holds out none, and the run that
    asked for a test split is told so instead of training without one."""
    from data import make_data

    write_jsonl(tmp_path / "rows.jsonl", 200)
    cfg = load_config(streamed(tmp_path / "rows.jsonl", tmp_path / "cache", "dataset.test_fraction=0.001"))
    with pytest.raises(DataError, match=r"split 'test' has 0 tokens, fewer than two windows of 32"):
        make_data(cfg, load_corpus(cfg.dataset), ByteTokenizer(), 32, 0, 1)


@pytest.mark.parametrize("source", ["text_files", "hf"])
def test_num_proc_above_1_loads_the_same_store_without_forking(tmp_path, source):
    """dataset.num_proc=2 for text: the same token store as one process, and this process (which runs JAX) is
    never forked (JAX warns at every fork)."""
    if source == "text_files":
        write_files(tmp_path / "docs", 40)
        make = lambda cache, n: text_files(tmp_path / "docs", cache, f"dataset.num_proc={n}")  # noqa: E731
    else:
        write_jsonl(tmp_path / "rows.jsonl", 60)
        make = lambda cache, n: loaded(tmp_path / "rows.jsonl", cache, f"dataset.num_proc={n}")  # noqa: E731
    _, one = build(make(tmp_path / "one", 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, two = build(make(tmp_path / "two", 2))
    assert store_bytes(two) == store_bytes(one) and sum(len(two.tokens(s)) for s in two.splits) > 1000
    assert not [w for w in caught if "fork" in str(w.message)]


@pytest.mark.e2e
def test_a_run_forks_no_process(tmp_path):
    """Big enough splits and dataset.num_proc=2: data is still tokenised without forking the process that runs
    JAX, so Python prints no os.fork() warning."""
    from helpers import run_cli, tiny_overrides

    out = run_cli(
        tiny_overrides(
            str(tmp_path / "cache"),
            "dataset.max_documents=80",
            "dataset.num_proc=2",
            "train.max_steps=2",
            "checkpoint.save=false",
            f"logging.run_dir={tmp_path}/run",
        )
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "step" in out.stdout and "os.fork()" not in out.stdout + out.stderr


def test_a_sources_own_test_split_is_kept_when_validation_is_held_out_of_train(tmp_path):
    """dataset.val_split=null holds validation out of train; a test split the source has (here a local dataset
    folder's test.jsonl, through the Hub loader's path) stays the test split, not replaced by rows of train."""
    folder = tmp_path / "ds"
    folder.mkdir()
    for split, n in (("train", 40), ("test", 7)):
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": f"{split} row {i}"}) + "\n" for i in range(n))
        )
    d = load_config(
        [
            "dataset=hf",
            f"dataset.hf_path={folder}",
            "dataset.tokenizer=byte",
            "dataset.val_split=null",
            "dataset.val_fraction=0.2",  # test_fraction is refused here: the source's own test split tests
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ]
    ).dataset
    splits = {name: list(ds["text"]) for name, ds in load_corpus(d).datasets.items()}
    assert splits["test"] == [f"test row {i}" for i in range(7)]
    assert sorted(splits["train"] + splits["val"]) == sorted(f"train row {i}" for i in range(40))
    assert splits["val"] and all(t.startswith("train row") for t in splits["val"])
