"""The interface every tokenizer implements (text tokenizers in data/tokenizers.py, notes in data/notes_tokenizer.py).

Every tokenizer has the special tokens `<EOS>` (between documents), `<PAD>` (never in the loss) and `<GENAI>`
(fine-tuning: the loss starts after it), and serialises to a JSON-able description that rebuilds it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable

import numpy as np

SPECIAL_TOKENS = ("<EOS>", "<PAD>", "<GENAI>")


class Tokenizer(ABC):
    kind: str
    vocab_size: int
    eos_id: int
    pad_id: int
    genai_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Documents -> (their ids, each document followed by <EOS>, concatenated; each one's length with <EOS>)."""
        encoded = self.encode_batch(texts)
        lengths = np.fromiter((len(ids) + 1 for ids in encoded), np.int64, len(encoded))
        flat = np.fromiter(
            itertools.chain.from_iterable(ids + [self.eos_id] for ids in encoded), np.int64, int(lengths.sum())
        )
        return flat, lengths

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; special tokens appear by name, e.g. "<EOS>"."""

    @abstractmethod
    def token_byte_lengths(self) -> np.ndarray:
        """[vocab_size] int array: UTF-8 bytes of text each id stands for (0 for special tokens).

        Dividing a summed loss by the summed byte lengths of the targets gives a per-byte loss that compares across
        tokenizers.
        """

    @abstractmethod
    def to_json(self) -> dict: ...

    def fingerprint(self) -> str:
        """Short stable hash of the description; keys caches of tokenised data."""
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def special_ids(self) -> dict[str, int]:
        return {"<EOS>": self.eos_id, "<PAD>": self.pad_id, "<GENAI>": self.genai_id}
