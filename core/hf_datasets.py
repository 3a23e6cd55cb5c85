"""The Hugging Face `datasets` library, imported when a corpus is first read, and quiet.

Importing it takes 1.2 s on 2 CPU cores (it brings pandas and pyarrow), which is most of a short run's start-up; a run
whose token store exists never reads a corpus, so every module of data/ asks for it here, inside the function that
reads, instead of importing it at the top.
"""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def hf_datasets() -> ModuleType:
    """`datasets`, without progress bars or library logging below errors (the project reports what it does)."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets
