"""The project's error types: expected failures a user can act on.

`main` catches `PipelineError`, prints its message as one line and exits with `exit_code`; anything else is a bug
and keeps its traceback.
"""


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


def warn(message: str) -> None:
    """Something the user should know that does not stop the run: one line on stderr, from process 0 only."""
    import sys

    import jax

    if jax.process_index() == 0:
        print(f"warning: {message}", file=sys.stderr, flush=True)
