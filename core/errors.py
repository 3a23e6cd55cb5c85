"""The project's error types: expected failures a user can act on.

`main` catches `PipelineError`, prints its message as one line (`say`) and exits with `exit_code`; anything else is
a bug and keeps its traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """An expected failure (bad input, missing data, offline Hub, ...) with a message that says how to fix it."""

    exit_code = 1


class ConfigError(PipelineError):
    """The configuration is invalid: unknown key, wrong type or impossible value. Exit code 2, like a usage error."""

    exit_code = 2


class DataError(PipelineError):
    """A dataset or tokenizer cannot be loaded or built."""


class CheckpointError(PipelineError):
    """A checkpoint cannot be written or read."""


class MissingPackageError(PipelineError):
    """An optional package that a tool needs is not installed. Exit code 2: the command cannot run as given."""

    exit_code = 2


def say(error: PipelineError, prefix: str = "", exit_code: int | None = None) -> int:
    """An expected failure as every command says it: one line on stderr, `error: ...`; returns its exit code (or
    `exit_code`, for a command whose arguments make this kind of failure a usage error)."""
    import sys

    print(f"error: {prefix}{error}", file=sys.stderr, flush=True)
    return error.exit_code if exit_code is None else exit_code


def warn(message: str) -> None:
    """Something the user should know that does not stop the run: one line on stderr, from process 0 only."""
    import sys

    import jax

    if jax.process_index() == 0:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def first_line(e: BaseException, limit: int = 200, text: str | None = None) -> str:
    """What a one-line error quotes of a library's exception: the first line of its message (`text` when the message
    needs trimming first), at most `limit` characters, or the exception's type when the message is empty."""
    text = str(e) if text is None else text
    return text.strip().splitlines()[0][:limit] if text.strip() else type(e).__name__
