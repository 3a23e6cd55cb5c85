"""A random permutation of [0, n) evaluated one index at a time, in constant memory.

An epoch visits every training window once in a random order. Materialising that order (`rng.permutation(n)`) costs
8 bytes per window: 125 MB for the 15.6M windows of a 1B-token split at context 64, 2.3 GB for FineWeb-Edu's 10B
tokens at context 1024 ... per process. Instead, position i of the epoch is mapped to its window by a keyed Feistel
network, a bijection on [0, 4^h) with 4^h >= n, with "cycle walking": an image that lands at or past n is mapped
again until it falls inside [0, n), which keeps the map a bijection on [0, n) (each cycle of the 4^h-permutation
passes through [0, n) in the same order). At most 4^h < 4n, so fewer than 4 walks are expected per index.

The keys come from (seed, epoch), so the order is a pure function of them, like everything a batch depends on.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6  # a Feistel network of >= 4 rounds with independent round keys is a good pseudorandom permutation
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # splitmix64's finaliser constants


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every output bit depends on every input bit."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class IndexShuffle:
    """`shuffle[i]` (i an int or an integer array) is where position i of a random order of [0, n) points."""

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        """`rng` draws the round keys: the order is a function of its state."""
        if n < 1:
            raise ValueError(f"cannot permute {n} items")
        self.n = n
        self.half_bits = max(1, (int(n - 1).bit_length() + 1) // 2)  # 2 * half_bits >= bits of n - 1
        self.mask = np.uint64((1 << self.half_bits) - 1)
        self.keys = rng.integers(0, 2**63, size=ROUNDS, dtype=np.uint64)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self.half_bits)
        left, right = x >> h, x & self.mask
        with np.errstate(over="ignore"):  # the mixing multiplies modulo 2^64 on purpose
            for key in self.keys:
                left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << h) | right

    def __getitem__(self, i: int | np.ndarray) -> int | np.ndarray:
        x = np.asarray(i, dtype=np.uint64)
        if np.any(x >= np.uint64(self.n)):
            raise IndexError(f"position out of range for a permutation of {self.n}")
        x = self._feistel(x)
        while np.any(outside := x >= np.uint64(self.n)):  # cycle walking (see the module docstring)
            x = np.where(outside, self._feistel(x), x)
        return int(x) if x.ndim == 0 else x.astype(np.int64)
