"""The user's files (`dataset.files`): the paths its patterns name, and what identifies their contents unread.

Text sources (data/sources.py) and MIDI sources (data/note_sources.py) both read them.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from core.errors import DataError


def expand_files(patterns: list[str]) -> list[str]:
    """`dataset.files`: paths, directories (every file under them) or globs (a directory they match: every file under
    it too) -> sorted file paths."""
    paths: list[str] = []
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        named = [expanded] if os.path.isdir(expanded) else sorted(glob.glob(expanded, recursive=True))
        matches = [m for n in named for m in ([str(p) for p in Path(n).rglob("*")] if os.path.isdir(n) else [n])]
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise DataError(f"dataset.files: {pattern!r} matches no file")
        paths.extend(matches)
    return sorted(set(paths))


def file_stamps(paths: list[str]) -> list:
    """What identifies files' contents without reading them: path, size and modification time."""
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append((path, st.st_size, st.st_mtime_ns))
    return stamps
