"""Tokenizers: `byte`, `bpe` (byte-level BPE trained on the training split) and `gpt2` (GPT-2's 50,257 tokens).

Every tokenizer has the special tokens `<EOS>` (between documents), `<PAD>` (never in the loss) and `<GENAI>`
(fine-tuning: the loss starts after it). `encode` never turns text into special ids, so a document that happens to
contain the string "<EOS>" round-trips as text. Each tokenizer serialises to a JSON-able description that rebuilds
it (`to_json` / `tokenizer_from_json`), which checkpoints store instead of a pickle.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from core.errors import DataError
from core.files import wait_for, write_atomic
from data.notes_tokenizer import NotesTokenizer
from data.tokenizer_base import SPECIAL_TOKENS, Tokenizer


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes 0..255, then the special tokens: 259 ids."""

    kind = "byte"

    def __init__(self) -> None:
        self.eos_id, self.pad_id, self.genai_id = 256, 257, 258
        self.vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter((len(b) + 1 for b in encoded), np.int64, len(encoded))
        flat = np.frombuffer(b"\0".join(encoded) + b"\0", np.uint8).astype(np.uint16)
        flat[np.cumsum(lengths) - 1] = self.eos_id  # the separators' places
        return flat, lengths

    def decode(self, ids: Iterable[int]) -> str:
        out, pending = [], bytearray()
        names = {v: k for k, v in self.special_ids.items()}
        for i in ids:
            i = int(i)
            if i < 256:
                pending.append(i)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            out.append(names.get(i, ""))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, np.int32)
        lengths[:256] = 1
        return lengths

    def to_json(self) -> dict:
        return {"kind": "byte"}


class BpeTokenizer(Tokenizer):
    """Byte-level BPE (Hugging Face `tokenizers`); ids 0..2 are the special tokens."""

    kind = "bpe"

    def __init__(self, hf_json: str) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._hf_json = hf_json
        self._tok = HFTokenizer.from_str(hf_json)
        self._tok.encode_special_tokens = True  # "<EOS>" inside a document is text, not the EOS id
        self.eos_id, self.pad_id, self.genai_id = (self._tok.token_to_id(t) for t in SPECIAL_TOKENS)
        self.vocab_size = self._tok.get_vocab_size()

    @staticmethod
    def train(texts: Iterator[str], vocab_size: int) -> BpeTokenizer:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        return BpeTokenizer(tok.to_str())

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # The fast variant skips the character offsets, which nothing here reads: twice the tokens/s on 2 cores.
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, np.int32)
        specials = set(self.special_ids.values())
        for token, i in self._tok.get_vocab().items():
            # ByteLevel maps each byte to one printable character, so characters = bytes.
            lengths[i] = 0 if i in specials else len(token)
        return lengths

    def to_json(self) -> dict:
        return {"kind": "bpe", "hf_tokenizer": self._hf_json}


class Gpt2Tokenizer(Tokenizer):
    """GPT-2's BPE via tiktoken. `<|endoftext|>` (50256) is `<EOS>`; `<PAD>` and `<GENAI>` are added after it."""

    kind = "gpt2"

    def __init__(self) -> None:
        import tiktoken

        try:
            base = tiktoken.get_encoding("gpt2")
        except Exception as e:  # tiktoken downloads its files on first use and raises requests/OS errors offline
            raise DataError(
                "tokenizer gpt2: GPT-2's BPE files could not be fetched "
                f"({type(e).__name__}; offline?). Copy tiktoken's cache from a machine online and set "
                "TIKTOKEN_CACHE_DIR to it, or use dataset.tokenizer=bpe (trained on your data) or "
                "dataset.tokenizer=byte"
            ) from None
        self.eos_id = base.eot_token
        self.pad_id, self.genai_id = self.eos_id + 1, self.eos_id + 2
        self._enc = tiktoken.Encoding(
            name="gpt2_with_genai",
            pat_str=base._pat_str,
            mergeable_ranks=base._mergeable_ranks,
            special_tokens={"<|endoftext|>": self.eos_id, "<PAD>": self.pad_id, "<GENAI>": self.genai_id},
        )
        self.vocab_size = self.genai_id + 1

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(texts)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        names = {self.eos_id: "<EOS>", self.pad_id: "<PAD>", self.genai_id: "<GENAI>"}
        out, run = [], []
        for i in ids:
            if i in names:
                out.append(self._enc.decode(run))
                out.append(names[i])
                run = []
            else:
                run.append(i)
        out.append(self._enc.decode(run))
        return "".join(out)

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, np.int32)
        for i in range(self.eos_id):
            lengths[i] = len(self._enc.decode_single_token_bytes(i))
        return lengths

    def to_json(self) -> dict:
        return {"kind": "gpt2"}


def tokenizer_from_json(desc: dict) -> Tokenizer:
    kind = desc.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BpeTokenizer(desc["hf_tokenizer"])
    if kind == "gpt2":
        return Gpt2Tokenizer()
    if kind == "notes":
        return NotesTokenizer.from_json(desc)
    raise DataError(f"tokenizer description has unknown kind {kind!r} (expected byte, bpe, gpt2 or notes)")


def build_tokenizer(
    kind: str,
    *,
    bpe_vocab_size: int,
    train_texts: Callable[[], Iterable[str]],
    corpus_fingerprint: str,
    cache_dir: str,
    process_index: int = 0,
    wait_s: float = 3600,
) -> Tokenizer:
    """The tokenizer named by `dataset.tokenizer`. A BPE is trained on `train_texts()` once per corpus and vocab
    size, by process 0, and read back from `<cache_dir>/tokenizers/` by every later run and the other processes."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "gpt2":
        return Gpt2Tokenizer()
    key = hashlib.sha256(f"bpe-v1|{corpus_fingerprint}|{bpe_vocab_size}".encode()).hexdigest()[:16]
    path = Path(cache_dir) / "tokenizers" / f"bpe-{bpe_vocab_size}-{key}.json"
    if process_index != 0:
        wait_for(
            lambda: path if path.exists() else None,
            wait_s,
            f"tokenizer bpe: waited {wait_s:.0f} s for "
            f"process 0 to write {path} (is dataset.cache_dir on a filesystem all processes share?)",
        )
    if path.exists():
        return tokenizer_from_json(json.loads(path.read_text()))
    tokenizer = BpeTokenizer.train(iter(train_texts()), bpe_vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(tokenizer.to_json()))  # a concurrent reader sees the whole file or none
    return tokenizer
