"""Tokenizers round-trip text, rebuild from their JSON description, and fail clearly when GPT-2's files are missing."""

import json

import numpy as np
import pytest

from core.errors import DataError
from data.tokenizers import ByteTokenizer, Gpt2Tokenizer, build_tokenizer, tokenizer_from_json

TEXTS = [
    "def f(x):\n    return x ** 2  # square\n",
    "Unicode: héllo wörld, ✓, 日本語, emoji 🎹\n\ttabs\tand  spaces",
    "a document that mentions <EOS>, <PAD> and <GENAI> as plain text",
    "",
]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    corpus = [t * 20 for t in TEXTS] + [open(json.__file__).read()]
    return build_tokenizer(
        "bpe",
        bpe_vocab_size=400,
        train_texts=lambda: corpus,
        corpus_fingerprint="test",
        cache_dir=str(tmp_path_factory.mktemp("tok")),
    )


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_round_trip_and_json_rebuild(kind, bpe):
    tok = ByteTokenizer() if kind == "byte" else bpe
    rebuilt = tokenizer_from_json(json.loads(json.dumps(tok.to_json())))
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert rebuilt.encode(text) == ids
    assert rebuilt.vocab_size == tok.vocab_size and rebuilt.special_ids == tok.special_ids


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_special_token_names_in_text_stay_text(kind, bpe):
    tok = ByteTokenizer() if kind == "byte" else bpe
    ids = tok.encode("x <EOS> y <GENAI>")
    assert not set(ids) & set(tok.special_ids.values())
    assert tok.decode([tok.eos_id]) == "<EOS>" and tok.decode([tok.genai_id]) == "<GENAI>"


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_token_byte_lengths_add_up_to_the_utf8_length(kind, bpe):
    tok = ByteTokenizer() if kind == "byte" else bpe
    lengths = tok.token_byte_lengths()
    assert lengths.shape == (tok.vocab_size,)
    for text in TEXTS:
        assert int(lengths[np.asarray(tok.encode(text), int)].sum()) == len(text.encode("utf-8"))
    assert all(lengths[i] == 0 for i in tok.special_ids.values())


def test_bpe_compresses_and_is_cached(bpe, tmp_path):
    text = TEXTS[0] * 5
    assert len(bpe.encode(text)) < len(text.encode()) / 2
    cache = tmp_path / "cache"
    first = build_tokenizer(
        "bpe", bpe_vocab_size=300, train_texts=lambda: TEXTS * 10, corpus_fingerprint="c1", cache_dir=str(cache)
    )
    files = list((cache / "tokenizers").iterdir())
    assert len(files) == 1
    second = build_tokenizer(
        "bpe", bpe_vocab_size=300, train_texts=lambda: iter(()), corpus_fingerprint="c1", cache_dir=str(cache)
    )
    assert second.to_json() == first.to_json()  # read back, not retrained on the (empty) texts


def test_gpt2_tokenizer_offline_fails_with_one_actionable_line(monkeypatch, tmp_path):
    """GPT-2's BPE files are not in tiktoken's cache and the network is down: tiktoken's own loading path runs up to
    its download, which fails as it does offline, and the user gets one line saying what to do."""
    import requests
    import tiktoken.registry

    requested = []

    def offline(url, *args, **kwargs):
        requested.append(url)
        raise requests.ConnectionError(f"Failed to resolve host of {url}")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # an empty cache: tiktoken must download
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # nothing loaded earlier in this process
    monkeypatch.setattr(requests, "get", offline)  # tiktoken's download, as it fails without a network
    with pytest.raises(DataError) as error:
        Gpt2Tokenizer()
    message = str(error.value)
    assert requested and requested[0].startswith("https://openaipublic.blob.core.windows.net/gpt-2/")
    assert "\n" not in message
    assert message.startswith("tokenizer gpt2: GPT-2's BPE files could not be fetched (ConnectionError; offline?)")
    assert "dataset.tokenizer=bpe" in message and "TIKTOKEN_CACHE_DIR" in message


def test_gpt2_tokenizer_puts_its_special_tokens_after_gpt2s_ids(monkeypatch):
    """Our part of the gpt2 tokenizer, around a stand-in for GPT-2's BPE (its files cannot be had offline, and
    tiktoken checks a cached copy against their hash, so no fixture can provide them): GPT-2's <|endoftext|> is
    <EOS>, <PAD> and <GENAI> come right after it, text never turns into a special id, and every id's byte length is
    the length of its text."""
    import tiktoken

    ranks = {bytes([b]): b for b in range(256)} | {b"re": 256, b"ret": 257, b"retu": 258, b"return": 259}
    stand_in = tiktoken.Encoding(
        name="gpt2-stand-in",
        pat_str=r"""'s|'t| ?\w+| ?[^\s\w]+|\s+""",
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 260},
    )
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: stand_in)
    tok = Gpt2Tokenizer()
    assert (tok.eos_id, tok.pad_id, tok.genai_id, tok.vocab_size) == (260, 261, 262, 263)
    for text in TEXTS + ["return <|endoftext|> as text"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text and not set(ids) & set(tok.special_ids.values())
        assert int(tok.token_byte_lengths()[np.asarray(ids, int)].sum()) == len(text.encode("utf-8"))
    assert 259 in tok.encode("return x")  # the merges are used
    assert tok.decode([tok.eos_id, tok.pad_id, tok.genai_id]) == "<EOS><PAD><GENAI>"
    assert tokenizer_from_json(tok.to_json()).encode("return") == tok.encode("return")
