"""What a run tells people, through its sinks: the console (console.py: lines or a progress bar), metrics.jsonl
(metrics_file.py), TensorBoard (tensorboard_sink.py) and wandb (wandb_sink.py).

Only process 0 talks; every other process gets a logger whose methods do nothing. All files go under the run
directory: metrics.jsonl (one JSON object per log or eval event), tensorboard/, wandb/ (wandb's service keeps its
own debug logs in its cache, ~/.cache/wandb/logs or $WANDB_CACHE_DIR). Every event goes to metrics.jsonl as it is;
TensorBoard and wandb get its finite numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.reporting.console import Console, eval_summary
from training.reporting.metrics_file import MetricsFile
from training.reporting.tensorboard_sink import TensorBoard
from training.reporting.wandb_sink import Wandb

if TYPE_CHECKING:
    from training.config import Config


class RunLogger:
    def __init__(
        self, cfg: Config, run_dir: Path, total_steps: int, start_step: int, active: bool, wandb_id: str | None = None
    ) -> None:
        self.active = active
        self.run_dir = run_dir
        self.wandb: Wandb | None = None
        self.sinks: list[TensorBoard | Wandb] = []  # the sinks of numbers beside metrics.jsonl
        if not active:
            return
        self.metrics = MetricsFile(run_dir, start_step)
        self.console = Console(cfg.logging.progress, total_steps, start_step)
        if cfg.logging.tensorboard:
            self.sinks.append(TensorBoard(run_dir, start_step))
        if cfg.logging.wandb != "disabled":
            self.wandb = Wandb(cfg, run_dir, wandb_id)
            self.sinks.append(self.wandb)

    @property
    def wandb_id(self) -> str | None:
        return self.wandb.id if self.wandb is not None else None

    def info(self, line: str) -> None:
        if self.active:
            self.console.info(line)

    def advance(self, steps: int = 1) -> None:
        if self.active:
            self.console.advance(steps)

    def train(self, step: int, m: dict[str, float]) -> None:
        """`m`: loss, lr, grad_norm, tokens_per_s, ms_per_step, mfu, tokens_seen, elapsed_s, remaining_s (and z_loss,
        loss_scale, skipped_steps, statistics when present)."""
        if not self.active:
            return
        self._record(step, "train", m)
        self.console.train(step, m)

    def eval(self, step: int, results: dict[str, dict[str, float]]) -> None:
        if not self.active:
            return
        for split, r in results.items():
            self._record(step, split, r)
        self.info(f"eval {step:>6} | {eval_summary(results)}")

    def scalars(self, step: int, split: str, values: dict[str, float], line: str) -> None:
        """Measurements of their own kind under `split` (curvature's `sharpness`, ...), and their console line."""
        if not self.active:
            return
        self._record(step, split, values)
        self.info(line)

    def _record(self, step: int, split: str, values: dict[str, float]) -> None:
        self.metrics.log(step, split, values)
        # TensorBoard warns on every NaN (the first interval has no rate yet); metrics.jsonl keeps them as strings
        numbers = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
        for sink in self.sinks:
            sink.log(step, split, numbers)

    def close(self, hparams: dict[str, Any] | None = None, final: dict[str, float] | None = None) -> None:
        if not self.active:
            return
        self.console.close()
        for sink in self.sinks:
            sink.close(hparams, final)
        self.metrics.close()
        self.active = False  # closed once: a run that failed while it finished is not closed again
