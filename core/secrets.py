"""API keys (WANDB_API_KEY, HF_TOKEN) from the environment or a `.env` file in the working directory.

They are read, never written: not into configs, checkpoints, logs or the environment of child processes.
"""

from __future__ import annotations

import os

from dotenv import dotenv_values


def secret(name: str, env_file: str = ".env") -> str | None:
    value = os.environ.get(name)
    if value:
        return value
    if os.path.isfile(env_file):
        return dotenv_values(env_file).get(name) or None
    return None
