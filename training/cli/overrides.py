"""Command-line arguments as Hydra overrides, also in two forms trainit's README prints and its users paste:

    checkpoint.save_steps=[100, 1000, 10000]    unquoted, the shell splits it into `...=[100,` `1000,` `10000]`:
                                                an argument whose brackets do not close is joined (with a space)
                                                to the ones after it up to the one that closes them
    checkpoint.overwrite_config: False          YAML's `key: value`, two arguments: read as key=False

Anything else passes unchanged; an argument whose brackets never close stays as it is, so Hydra's parser names it.
"""

from __future__ import annotations

import re

OPENING, CLOSING = "[{(", "]})"
# A config key (with Hydra's + / ++ / ~ prefixes) followed by a colon: the first half of a YAML-style `key: value`.
YAML_KEY = re.compile(r"[+~]{0,2}[A-Za-z_][\w./@-]*:")


def as_overrides(argv: list[str]) -> list[str]:
    args = _rejoin_split_brackets(argv)
    out: list[str] = []
    i = 0
    while i < len(args):
        if YAML_KEY.fullmatch(args[i]) and i + 1 < len(args):
            out.append(f"{args[i][:-1]}={args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out


def _rejoin_split_brackets(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        joined, j = argv[i], i
        while _depth(joined) > 0 and j + 1 < len(argv):
            j += 1
            joined = f"{joined} {argv[j]}"
        if _depth(joined) == 0 and j > i:
            out.append(joined)
            i = j + 1
        else:
            out.append(argv[i])
            i += 1
    return out


def _depth(text: str) -> int:
    """How many brackets `text` leaves open (quoted text aside); negative when it closes more than it opens."""
    depth, quote = 0, None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in OPENING:
            depth += 1
        elif char in CLOSING:
            depth -= 1
    return depth
