"""mode=eval's results file: `<run>/eval-step<N>.json`, with the settings it was scored under. An evaluation under
other settings (checkpoint.overwrite_config: another dataset, eval_iters, batch) never replaces it: it goes to
`eval-step<N>-<settings hash>.json`; the same evaluation run again replaces its own file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jax

from core.files import write_atomic
from training.config import Config, context_size, layout


def eval_settings(cfg: Config, tokenizer_kind: str, results: dict[str, Any]) -> dict[str, Any]:
    """What the scores depend on besides the weights."""
    return {
        "dataset": cfg.dataset.name,
        "tokenizer": tokenizer_kind,
        "context": context_size(cfg),
        "sequences_per_batch": cfg.train.batch_size * jax.process_count(),
        "eval_iters": cfg.train.eval_iters,
        "splits": sorted(results),
        "stage": str(cfg.stage),  # a note model's task and its loss mask, records' length
        "tasks": list(cfg.tasks),
        "loss_masking": str(cfg.loss_masking),
        "notes_per_record": cfg.data.notes_per_record,
        "dtype": cfg.system.dtype,
    }


def result_path(run_dir: Path, step: int, settings: dict[str, Any]) -> Path:
    first = run_dir / layout.eval_result(step)
    if not first.exists() or _settings_in(first) == settings:
        return first
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return first.with_name(f"{first.stem}-{digest}{first.suffix}")


def _settings_in(path: Path) -> Any:
    try:
        return json.loads(path.read_text()).get("settings")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None  # unreadable, or written before results held their settings: kept, never replaced


def write_eval_result(run_dir: Path, record: dict[str, Any], settings: dict[str, Any]) -> Path:
    """`record` ({"step", "checkpoint", "results"}) with its settings, written whole (a reader never sees half)."""
    out = result_path(run_dir, int(record["step"]), settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps({**record, "settings": settings}, indent=2).encode())
    return out
