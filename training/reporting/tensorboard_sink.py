"""TensorBoard (`logging.tensorboard`): each number as `<split>/<name>` under <run_dir>/tensorboard, and the run's
hyperparameters with its final figures in the HParams tab."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from training.config import layout


class TensorBoard:
    def __init__(self, run_dir: Path, start_step: int = 0) -> None:
        """A resumed run (from `start_step`) first writes TensorBoard's restart marker: the steps after it that an
        earlier process logged before it died (as metrics.jsonl sets them aside) are dropped when TensorBoard reads
        the folder, instead of drawn twice. Its file is named after the step too: an event file's name holds the
        second it was opened, which an earlier process may have had."""
        resumed = {"purge_step": start_step + 1, "filename_suffix": f".from-step-{start_step}"} if start_step else {}
        self.writer = summary_writer()(logdir=str(run_dir / layout.TENSORBOARD), **resumed)

    def log(self, step: int, split: str, numbers: dict[str, float]) -> None:
        for k, v in numbers.items():
            self.writer.add_scalar(f"{split}/{k}", v, step)

    def close(self, hparams: dict[str, Any] | None, final: dict[str, float] | None) -> None:
        if hparams is not None and final:
            self.writer.add_hparams(
                {k: _hparam(v) for k, v in hparams.items()},
                {f"hparam/{k}": v for k, v in final.items()},
                name="hparams",
            )
        self.writer.close()


def _hparam(v: object) -> int | float | str | bool:
    return v if isinstance(v, (int, float, str, bool)) else str(v)


def summary_writer() -> type:
    """tensorboardX's SummaryWriter, imported without torch. tensorboardX imports torch when it is installed (2.5 s
    at every start on 2 CPU cores) only to accept torch tensors, and the run logs plain numbers; torch is hidden for
    the import and stays importable afterwards."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter
