"""Token shards in llm.c's format (data/token_shards.py, dataset=fineweb10b), on shards these tests write: the header
checked, the splits read in place across shard boundaries, val cut to its tokens, and a run trained on them."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from core.errors import ConfigError, DataError
from data.config import TokenShardsConfig
from data.corpus import token_shards_corpus
from data.token_shards import HEADER_BYTES, MAGIC, ShardedTokens, read_shard, write_shard
from helpers import build, script_in_process, tiny_overrides

EOS = 256  # the byte tokenizer's <EOS>: it leads every document here, as GPT-2's 50256 does in FineWeb10B


def documents(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """About `tokens` ids of documents (lowercase letters and spaces: real bytes), each led by EOS."""
    out = []
    while sum(map(len, out)) < tokens:
        out.append(np.concatenate([[EOS], rng.integers(97, 123, int(rng.integers(20, 200)))]))
    return np.concatenate(out)[:tokens]


def write_fineweb_like(folder, sizes=(3000, 2500), val=1500, seed=0) -> dict[str, list[np.ndarray]]:
    """Training shards 1.. and validation shard 0, named as kjj0/fineweb10B-gpt2 names them."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    train = [documents(rng, n) for n in sizes]
    for i, tokens in enumerate(train, start=1):
        write_shard(folder / f"fineweb_train_{i:06d}.bin", tokens)
    val_tokens = documents(rng, val)
    write_shard(folder / "fineweb_val_000000.bin", val_tokens)
    return {"train": train, "val": [val_tokens]}


def test_a_shard_is_its_header_then_its_tokens_in_uint16(tmp_path):
    tokens = np.array([EOS, 1, 2, 65535], np.int64)
    write_shard(tmp_path / "s.bin", tokens)
    raw = (tmp_path / "s.bin").read_bytes()
    assert len(raw) == HEADER_BYTES + 2 * len(tokens)
    assert list(np.frombuffer(raw[:12], np.int32)) == [MAGIC, 1, 4] and not any(raw[12:HEADER_BYTES])
    read = read_shard(tmp_path / "s.bin")
    assert read.dtype == np.uint16 and list(read) == list(tokens)


def test_a_damaged_shard_is_one_line_naming_the_file(tmp_path):
    write_shard(tmp_path / "cut.bin", np.arange(100))
    (tmp_path / "cut.bin").write_bytes((tmp_path / "cut.bin").read_bytes()[:-10])
    with pytest.raises(DataError, match=r"cut.bin: its header says 100 tokens, the file holds 95: cut short"):
        read_shard(tmp_path / "cut.bin")
    (tmp_path / "text.bin").write_text("not a shard")
    with pytest.raises(DataError, match=r"text.bin: not a shard of llm.c's format"):
        read_shard(tmp_path / "text.bin")
    header = np.zeros(256, np.int32)
    header[:3] = (MAGIC, 2, 0)
    (tmp_path / "v2.bin").write_bytes(header.tobytes())
    with pytest.raises(DataError, match=r"v2.bin: version 2, this reader knows version 1"):
        read_shard(tmp_path / "v2.bin")


def test_slices_across_shards_equal_the_concatenation(tmp_path):
    shards = write_fineweb_like(tmp_path)["train"]
    whole = np.concatenate(shards)
    tokens = ShardedTokens([read_shard(tmp_path / f"fineweb_train_{i:06d}.bin") for i in (1, 2)])
    assert len(tokens) == len(whole) and tokens.shape == whole.shape and tokens.dtype == np.uint16
    rng = np.random.default_rng(1)
    for a, b in [(0, 10), (2990, 3010), (2999, 3000), (3000, 3001), (0, len(whole)), *rng.integers(0, 5500, (20, 2))]:
        a, b = sorted((int(a), int(b)))
        np.testing.assert_array_equal(tokens[a:b], whole[a:b])
    for a, b in [(1234, 1234), (len(whole), len(whole) + 5), (9, 3)]:  # empty, as NumPy's are (was a ValueError)
        assert tokens[a:b].shape == (0,) and tokens[a:b].dtype == np.uint16
    limited = ShardedTokens(tokens.shards, limit=3100)
    assert len(limited) == 3100 and len(limited[2900:4000]) == 200  # a limit cuts the split
    a, b = (np.arange(n, dtype=np.uint16) for n in (100, 100))  # an empty shard between two: a slice across it
    np.testing.assert_array_equal(ShardedTokens([a, a[:0], b])[90:110], np.concatenate([a, b])[90:110])


def shard_overrides(data_cache, *more: str) -> list[str]:
    """The tiny run on dataset=fineweb10b: without tiny_overrides' max_documents, which token shards refuse."""
    return tiny_overrides(data_cache, "dataset=fineweb10b", "dataset.max_documents=null", *more)


def test_a_run_trains_on_the_shards_and_evaluates_val_from_its_start(tmp_path, data_cache):
    written = write_fineweb_like(tmp_path / "fineweb")
    parts = build(
        shard_overrides(
            data_cache,
            f"dataset.folder={tmp_path / 'fineweb'}",
            "dataset.tokenizer=byte",
            "dataset.val_tokens=1024",
            "train.batch_size=4",
        )
    )
    train, val = parts.data.train, parts.data.evals["val"]
    assert list(parts.data.evals) == ["val"] and parts.data.test is None
    context = parts.cfg.model.context_size
    # val: windows from the start of the val shard, cut after val_tokens targets (one token more, as the speedrun)
    windows = val.splits[0]
    assert 1024 % context == 0 and len(windows.tokens) == 1025 and windows.num_fixed == 1024 // context
    np.testing.assert_array_equal(windows.rows(np.array([0]))[0], written["val"][0][: context + 1])
    np.testing.assert_array_equal(next(iter(val))["inputs"][0], written["val"][0][:context])
    # train: every row is a window of the two training shards, joined
    whole = np.concatenate(written["train"])
    batch = train.batch(0)
    for row, target in zip(batch["inputs"][0], batch["targets"][0], strict=True):
        starts = [i for i in range(len(whole) - context) if np.array_equal(whole[i : i + context], row)]
        assert starts and np.array_equal(whole[starts[0] + 1 : starts[0] + context + 1], target)
    losses = [float(parts.step(step)["loss"]) for step in range(4)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_missing_shards_a_foreign_tokenizer_and_bpe_are_one_line(tmp_path, data_cache):
    with pytest.raises(
        DataError, match=r"does not exist; get the shards with `python -m scripts.tools.download_fineweb"
    ):
        build(shard_overrides(data_cache, f"dataset.folder={tmp_path / 'none'}"))
    folder = tmp_path / "gpt2"
    folder.mkdir()
    write_shard(folder / "fineweb_train_000001.bin", np.full(2000, 50256))  # GPT-2's ids, read with the byte tokenizer
    write_shard(folder / "fineweb_val_000000.bin", np.full(2000, 50256))
    with pytest.raises(DataError, match=r"holds id 50256, past the tokenizer's 259 ids"):
        build(shard_overrides(data_cache, f"dataset.folder={folder}", "dataset.tokenizer=byte"))
    # a foreign shard behind a good one: only the first was looked at, and the run met it as a NaN loss
    write_shard(folder / "fineweb_train_000001.bin", np.full(2000, 97))
    write_shard(folder / "fineweb_val_000000.bin", np.full(2000, 97))
    write_shard(folder / "fineweb_train_000002.bin", np.full(2000, 50256))
    with pytest.raises(DataError, match=r"token shard .*fineweb_train_000002.bin: holds id 50256, past the"):
        build(shard_overrides(data_cache, f"dataset.folder={folder}", "dataset.tokenizer=byte"))
    with pytest.raises(ConfigError, match=r"dataset.tokenizer: token shards are tokenised already"):
        build(shard_overrides(data_cache, "dataset.tokenizer=bpe"))


def test_a_shard_matched_by_both_splits_is_refused_in_one_line(tmp_path):
    """A training glob wide enough to take the validation shard (`*.bin`) made validation score trained-on data."""
    write_fineweb_like(tmp_path)
    d = TokenShardsConfig(name="fineweb10b", folder=str(tmp_path), tokenizer="byte")
    assert token_shards_corpus(d).files["train"] == [str(tmp_path / f"fineweb_train_00000{i}.bin") for i in (1, 2)]
    with pytest.raises(
        DataError,
        match=r"^dataset fineweb10b: dataset.train_files=\*.bin and dataset.val_files=fineweb_val_\*.bin both match "
        r"fineweb_val_000000.bin: validation would score data the model trains on; narrow one of the two patterns$",
    ):
        token_shards_corpus(dataclasses.replace(d, train_files="*.bin"))


@pytest.mark.parametrize(
    "override, message",
    [  # keys that cut documents into splits, which shard files do not have: they were ignored without a word
        (
            "dataset.max_documents=100",
            "dataset.max_documents: token shards are not read by document: cap the training "
            "tokens with dataset.max_train_shards",
        ),
        (
            "dataset.val_fraction=0.2",
            "dataset.val_fraction: token shards are not read by document: validation is dataset.val_files",
        ),
        ("dataset.test_fraction=0", "dataset.test_fraction: token shards are not read by document: they have no test"),
    ],
)
def test_document_keys_that_token_shards_do_not_read_are_refused(data_cache, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build(shard_overrides(data_cache, override))


def test_the_download_says_in_one_line_that_the_hub_cannot_be_reached(tmp_path, monkeypatch, capsys):
    write_shard(tmp_path / "fineweb_val_000000.bin", np.arange(10))  # present: not fetched again
    result = script_in_process(
        "scripts.tools.download_fineweb", ["--shards", "2", "--folder", str(tmp_path)], monkeypatch, capsys
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: download_fineweb: the Hugging Face Hub cannot be reached (offline, or HF_HUB_OFFLINE=1); 2 shards "
        f"of kjj0/fineweb10B-gpt2 are missing from {tmp_path}: run this where there is a network and copy the folder"
    ]
    shard = tmp_path / "fineweb_val_000000.bin"  # a folder below a file: said before the Hub is asked
    result = script_in_process("scripts.tools.download_fineweb", ["--folder", str(shard / "more")], monkeypatch, capsys)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: --folder: {shard / 'more'}: {shard} is a file, not a directory; choose a directory"
    ], result.stderr


class FakeHub:
    """A Hub on this machine (loopback): kjj0/fineweb10B-gpt2's resolve endpoint, answering HEAD and GET as the Hub
    does (X-Repo-Commit, ETag, Content-Length), so the real huggingface_hub.hf_hub_download runs against it, etags
    and local-folder metadata included. `files`: name -> (bytes, etag); `failing`: every request answers 500."""

    def __init__(self, files: dict[str, tuple[bytes, str]]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        hub = self
        self.files, self.failing, self.gets = files, False, []

        class Handler(BaseHTTPRequestHandler):
            def answer(self, body: bool) -> None:
                name = self.path.rsplit("/", 1)[-1]
                if hub.failing or name not in hub.files or "/datasets/kjj0/fineweb10B-gpt2/resolve/" not in self.path:
                    self.send_response(500 if hub.failing else 404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data, etag = hub.files[name]
                self.send_response(200)
                self.send_header("X-Repo-Commit", "0123456789abcdef0123456789abcdef01234567")
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    hub.gets.append(name)
                    self.wfile.write(data)

            def do_HEAD(self) -> None:
                self.answer(body=False)

            def do_GET(self) -> None:
                self.answer(body=True)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_hub(monkeypatch):
    """huggingface_hub pointed at a FakeHub and out of offline mode (for this test only); the downloader's probe of
    huggingface.co answers yes."""
    import huggingface_hub.constants as constants

    hub = FakeHub({})
    monkeypatch.setattr("core.hub.hub_reachable", lambda *args, **kwargs: True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    yield hub
    hub.close()


def shard_bytes(path, tokens) -> bytes:
    write_shard(path, tokens)
    data = path.read_bytes()
    path.unlink()
    return data


def test_a_download_cut_short_is_one_line_and_a_rerun_fetches_it_again(tmp_path, monkeypatch, capsys, fake_hub):
    folder = tmp_path / "shards"
    val, train = "fineweb_val_000000.bin", "fineweb_train_000001.bin"
    whole = {
        name: shard_bytes(tmp_path / name, np.arange(i * 100, i * 100 + 300)) for i, name in enumerate([val, train])
    }
    fake_hub.files = {val: (whole[val], "v1"), train: (whole[train][:-10], "t1")}  # the training shard arrives cut

    def download():
        return script_in_process(
            "scripts.tools.download_fineweb", ["--shards", "1", "--folder", str(folder)], monkeypatch, capsys
        )

    result = download()  # the check after the download: one line, not a traceback
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: download_fineweb: token shard {folder / train}: its header says 300 tokens, the file holds 295: "
        "cut short by a download? fetch it again"
    ]
    # Fetched again, as it says: the file there is not whole, and huggingface_hub's saved etag for it matches the
    # Hub's (the Hub's file was whole; the transfer was cut), which without force_download returns it unchanged.
    fake_hub.files[train] = (whole[train], "t1")
    fake_hub.gets.clear()
    result = download()
    assert result.returncode == 0, result.stderr
    assert fake_hub.gets == [train]  # the whole validation shard is not fetched again
    np.testing.assert_array_equal(read_shard(folder / train), np.arange(100, 400))
    # Cut again, with a Hub that does not answer: huggingface_hub would hand back the local file; one line instead.
    (folder / train).write_bytes(whole[train][:-10])
    fake_hub.failing = True
    result = download()
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert (
        line.startswith(f"error: download_fineweb: {train} of kjj0/fineweb10B-gpt2: ")
        and "'500 Internal Server Error'" in line
    ), line


@pytest.mark.parametrize("message", ["", "\n", "Connection reset\nby peer"])
def test_a_download_error_is_one_line_whatever_its_message(tmp_path, monkeypatch, capsys, message):
    """Some connection errors have no message at all; the line then names the error's type. (A stand-in for
    hf_hub_download: no server on this machine makes httpx raise an error without a message.)"""
    import huggingface_hub

    def hf_hub_download(*args, **kwargs):
        raise ConnectionError(message)

    monkeypatch.setattr("core.hub.hub_reachable", lambda *args, **kwargs: True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    result = script_in_process(
        "scripts.tools.download_fineweb", ["--shards", "1", "--folder", str(tmp_path)], monkeypatch, capsys
    )
    assert result.returncode == 1
    first = message.strip().splitlines()[0] if message.strip() else ""
    assert result.stderr.strip().splitlines() == [
        "error: download_fineweb: fineweb_val_000000.bin of kjj0/fineweb10B-gpt2: ConnectionError"
        + (f": {first}" if first else "")
    ]
