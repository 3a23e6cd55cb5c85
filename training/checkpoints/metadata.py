"""The JSON item a checkpoint holds beside its arrays (`<step>/meta/`): the step, tokens seen, losses, the whole
config, the tokenizer, the wandb id, the run directory, the time trained and the package versions; enough to resume,
evaluate, sample or audit a run without its logs."""

from __future__ import annotations

import math
import time
from pathlib import Path

import jax

from data.tokenizers import Tokenizer
from training.config import Config


def checkpoint_meta(
    cfg: Config,
    run_dir: Path,
    tokenizer: Tokenizer,
    step: int,
    tokens_seen: int,
    train_loss: float,
    val_loss: float | None,
    best_val_loss: float,
    wandb_id: str | None,
    time_trained_s: float,
    wall_time_s: float,
) -> dict:
    """The JSON item saved beside the arrays: enough to resume, evaluate, sample or audit without the run's logs."""
    from training.config import as_dict

    return {
        "step": step,
        "tokens_seen": tokens_seen,
        "train_loss": _finite_or_none(train_loss),
        "val_loss": _finite_or_none(val_loss),
        "best_val_loss": _finite_or_none(min(best_val_loss, val_loss if val_loss is not None else math.inf)),
        "config": as_dict(cfg),
        "tokenizer": tokenizer.to_json(),
        "wandb_id": wandb_id,
        "run_dir": str(run_dir),
        "process_count": jax.process_count(),  # a launcher's count is in no config key
        "time_trained_s": time_trained_s,
        "wall_time_s": wall_time_s,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": package_versions(),
    }


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def package_versions() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "equinox", "optax", "orbax-checkpoint", "tokenizers", "datasets"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out
