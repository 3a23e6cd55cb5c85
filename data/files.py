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
    return sorted(named_files(patterns))


def named_files(patterns: list[str]) -> dict[str, str]:
    """Each file the patterns find -> its name below the directory its pattern starts from (a named directory; a
    glob's part before its first wildcard; a named file's folder), the same however that directory is spelled
    (absolute, relative, `./`, `~`): what a file's split is drawn from. A file two patterns find (however they spell
    it, through links too) is read once, as the first names it: it was read twice, and could fall in two splits. A
    directory's hidden files and folders (`.git`, a `.cache` of token stores) are not its documents; a pattern that
    names one is followed."""
    names: dict[str, str] = {}
    seen: set[str] = set()  # the files found, by their real paths
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if os.path.isdir(expanded):
            base, named = expanded, [expanded]
        else:
            parts = Path(expanded).parts
            fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts) - 1)
            base, named = str(Path(*parts[:fixed])) if fixed else ".", sorted(glob.glob(expanded, recursive=True))
        matches = [m for n in named for m in (_visible_files(n) if os.path.isdir(n) else [n])]
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise DataError(f"dataset.files: {pattern!r} matches no file")
        for m in matches:
            if (real := os.path.realpath(m)) not in seen:
                seen.add(real)
                names[m] = Path(os.path.relpath(m, base)).as_posix()
    return names


def _visible_files(directory: str) -> list[str]:
    """Every path under `directory` but those below a name that starts with a dot."""
    root = Path(directory)
    return [str(p) for p in root.rglob("*") if not any(part.startswith(".") for part in p.relative_to(root).parts)]


def file_stamps(paths: list[str]) -> list:
    """What identifies files' contents without reading them: path, size and modification time. The path is made
    absolute: a relative spelling of the same files is the same corpus, whose token store, BPE and Arrow copy are not
    built again. Links are not resolved: hosts that reach shared files through different links must still agree."""
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append((os.path.abspath(path), st.st_size, st.st_mtime_ns))
    return stamps
