"""The sections the training loop reads: `train` (steps, batches, evaluation), `logging` and `checkpoint`, and the
checks on their values."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from core.checks import either, fail, refuse_unread, require_non_negative, require_positive


@dataclass(frozen=True)
class StageConfig:
    """One stage of train.stages: from where the stage before ended to `until`, a fraction of the run's steps."""

    until: float = 1.0  # where the stage ends, as a fraction of the run's steps (the lr schedule's); the last: 1.0
    batch_size: Optional[int] = None  # sequences per micro-batch per process; null: train.batch_size
    # sliding-window attention's window in this stage (model.attention_window; the last stage's is the model's own);
    # null: model.attention_window. Either every stage names one or none does
    attention_window: Optional[int] = None
    lr_multiplier: float = 1.0  # the learning rate schedule's value times this, in this stage


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0  # model initialisation, dropout and the data order all follow from it
    batch_size: int = 16  # sequences per micro-batch per process, split over the process's devices
    grad_accum_steps: int = 1  # micro-batches per optimizer step (optax.MultiSteps)
    max_steps: int = 120  # optimizer steps; the default run: minutes on 2 CPU cores (docs/configuration.md)
    max_training_hours: Optional[float] = None  # stop (and checkpoint) after this much wall time
    eval_interval: int = 60  # steps between evaluations (and one at the end)
    eval_iters: int = 8  # batches per validation split per evaluation
    log_interval: int = 10  # steps between log lines
    skip_nonfinite: bool = False  # true: skip updates whose gradient is NaN/Inf; false: stop the run there
    eval_at_start: bool = False  # also evaluate before the first step (e.g. the weights init_from brought)
    z_loss: float = 0.0  # > 0: add z_loss * log(Z)^2 per target token (PaLM's auxiliary loss), logged as z_loss
    # the run in stages (the GPT-2 speedrun's schedule: batches that grow, windows that grow, each stage's lr
    # multiplier), e.g. [{until: 0.33, batch_size: 8, attention_window: 64}, {until: 1.0, attention_window: 128}];
    # [] = one stage, as configured. Each stage's program is compiled at its first step; docs/configuration.md
    stages: list[StageConfig] = field(default_factory=list)
    # with train.stages whose attention windows grow: rescale the rotary positions and attention scores at each
    # growth (YaRN, the speedrun's; it fills model.yarn_windows), so the model keeps reading positions it learned
    yarn: bool = False

    def check(self) -> None:
        require_positive(
            self, "train", "batch_size", "max_steps", "eval_interval", "eval_iters", "log_interval", "grad_accum_steps"
        )
        require_non_negative(self, "train", "z_loss", "seed")  # a seed is a non-negative integer (numpy's PCG64)
        if self.seed >= 2**32:  # JAX's key keeps a seed's low 32 bits: 2**32 + 5 made seed 5's model
            fail("train.seed", f"must be below 2**32 (4294967296); got {self.seed}")
        if self.max_training_hours is not None and self.max_training_hours <= 0:
            fail("train.max_training_hours", f"must be > 0 (or null for no limit); got {self.max_training_hours}")
        self.check_stages()

    def check_stages(self) -> None:
        ends = [s.until for s in self.stages]
        for i, s in enumerate(self.stages):
            where = f"train.stages[{i}]"
            if not 0 < s.until <= 1 or (i and s.until <= ends[i - 1]):
                fail(f"{where}.until", f"must be in (0, 1] and above the stage before's; got {s.until}")
            if s.batch_size is not None and s.batch_size < 1:
                fail(f"{where}.batch_size", f"must be >= 1, or null for train.batch_size; got {s.batch_size}")
            if s.attention_window is not None and s.attention_window < 1:
                fail(f"{where}.attention_window", f"must be >= 1, or null; got {s.attention_window}")
            if s.lr_multiplier <= 0:
                fail(f"{where}.lr_multiplier", f"must be > 0; got {s.lr_multiplier}")
        if ends and ends[-1] != 1:
            fail(f"train.stages[{len(ends) - 1}].until", f"the last stage ends the run: must be 1.0; got {ends[-1]}")
        windows = [s.attention_window for s in self.stages]
        if any(w is not None for w in windows) and None in windows:
            fail(
                f"train.stages[{windows.index(None)}].attention_window",
                "every stage names its window when one does (the last stage's is the model's own)",
            )
        if self.yarn and (None in windows or not windows or windows != sorted(windows)):
            fail("train.yarn", f"rescales at each growth of the stages' windows: they must grow; got {windows}")


class WandbMode(StrEnum):
    online = "online"  # log to the wandb server (needs WANDB_API_KEY)
    offline = "offline"  # log to files under the run directory; `wandb sync` uploads them later
    disabled = "disabled"  # no wandb at all


class WandbFallback(StrEnum):
    """logging.wandb=online, when the server cannot be reached or refuses the key (known within 35 s)."""

    fail = "fail"  # one line, before training
    offline = "offline"  # a warning, then log offline; `wandb sync` uploads the run later


class Progress(StrEnum):
    auto = "auto"  # a bar on a terminal, lines otherwise
    bar = "bar"  # a progress bar
    lines = "lines"  # a log line every logging interval


@dataclass(frozen=True)
class LoggingConfig:
    run_dir: Optional[str] = None  # null = runs/<name>-<timestamp>
    name: Optional[str] = None  # null = <model.name>-<dataset.name>
    wandb: WandbMode = WandbMode.offline  # where wandb logs go
    wandb_fallback: WandbFallback = WandbFallback.fail  # online, with no reachable server or a refused key
    wandb_project: str = "gpt-jax"  # wandb project the run is logged under
    wandb_entity: Optional[str] = None  # wandb user or team; null = the API key's default
    tensorboard: bool = True  # also write TensorBoard event files in the run directory
    progress: Progress = Progress.auto  # how progress is shown on the console
    # plots.png at the end: loss, lr and tokens/s per step (scripts.tools.plot_runs draws it later, too)
    plot: bool = True
    # > 0: every this many steps, the largest and smallest Hessian eigenvalues of the eval loss on the first
    # validation batch, by Lanczos (training/analysis/curvature.py), logged as `sharpness` and `hessian_min` (split
    # `curvature`); scripts/tools/hessian.py plots the sharpness against 2/lr; 0 = off
    hessian_every: int = 0
    hessian_iters: int = 20  # hessian_every: Lanczos steps (Hessian-vector products, each ~2-3 backward passes)
    # training statistics, all off by default (training/step/stats.py says what each computes and what it costs):
    # gradient / parameter / update norms (global, per layer), <g_t, update_t>
    log_callback_data: bool = False
    store_last_grads: bool = False  # keep g_{t-1}: cos(g_t, g_{t-1})
    store_past_grads: bool = False  # keep the sum of past gradients: cos(g_t, their mean)
    store_last_params: bool = False  # keep x_{t-1}: the last step's length
    compute_last_loss: bool = False  # f(x_t) - f(x_{t-1}) on the same batch (needs store_last_params)
    compute_last_grads: bool = False  # |g_t - grad f(x_{t-1})| on the same batch (needs store_last_params)
    running_stats_window: int = 0  # > 0: also each statistic's mean over this many steps
    # every step, per parameter group: <g, last update>, <g, update> and their running sums (kept in the state),
    # cosines of successive updates and parameters, l2/l1/linf norms (training/step/geometry.py), as
    # geometry/<group>/...
    update_geometry: bool = False

    def check(self) -> None:
        for key in ("compute_last_loss", "compute_last_grads"):
            if getattr(self, key) and not self.store_last_params:
                fail(f"logging.{key}", "needs the previous parameters: add logging.store_last_params=true")
        require_non_negative(self, "logging", "running_stats_window", "hessian_every")
        require_positive(self, "logging", "hessian_iters")
        knobs = ("log_callback_data", "store_last_grads", "store_past_grads", "store_last_params")
        if self.running_stats_window > 0 and not any(getattr(self, k) for k in knobs):
            fail(
                "logging.running_stats_window",
                "averages statistics, but no statistics knob is on (e.g. logging.log_callback_data=true)",
            )


class LoadMode(StrEnum):
    """What `checkpoint.load` asks for."""

    true = "true"  # resume from load_path
    false = "false"  # start fresh
    # resume from this run's save path when it holds a checkpoint (the same command rerun after a kill continues),
    # else from load_path when given, else start fresh
    auto = "auto"


@dataclass(frozen=True)
class CheckpointConfig:
    save: bool = True  # write checkpoints (at evaluations, the end, the time limit, a signal, and save_steps)
    save_path: Optional[str] = None  # null = <run_dir>/checkpoints
    save_steps: Any = None  # int = every N steps, list = at these steps, null = only latest/best/final
    # steps this invocation trains, counted from where it starts (trainit: the steps of one checkpointed run), then it
    # evaluates and checkpoints like a finished run; null = up to train.max_steps, which the schedule still spans
    num_steps: Optional[int] = None
    max_to_keep: Optional[int] = 3  # the most recent checkpoints kept, the best besides; null = all
    # true: resume from load_path; false: start fresh; auto: resume from this run's save path (save_path, or
    # <logging.run_dir>/checkpoints) when it holds a checkpoint, so the same command rerun after a kill continues;
    # else from load_path when given (it must hold one); else start fresh. A latest checkpoint that does not restore
    # falls back, with a warning, to the newest one that does (true only names it)
    load: str = LoadMode.false
    load_path: Optional[str] = None  # the checkpoint directory to load, or the run directory that holds it
    load_file: str = "latest"  # latest | best | <step> (trainit's iter_<step>.ckpt is read as <step>: legacy.py)
    overwrite_config: bool = False  # resuming, false: the saved config.yaml runs; true: this command line's config
    overwrite_optimizer: bool = False  # true: a fresh optimizer state; the lr schedule continues at the restored step

    def __post_init__(self) -> None:
        """`load` as a LoadMode. The schema types it `str`: Hydra and YAML read true / false (trainit's
        `checkpoint.load=True`) as booleans, which OmegaConf 2.3's enum nodes refuse (it has no unions) and its string
        nodes keep as 'True' / 'False'."""
        if str(self.load).lower() in LoadMode.__members__:
            object.__setattr__(self, "load", LoadMode(str(self.load).lower()))

    def check(self) -> None:
        steps = self.save_steps
        if steps is not None:
            whole = lambda n: isinstance(n, int) and not isinstance(n, bool) and n > 0  # noqa: E731  (true is no step)
            ok = whole(steps) or (isinstance(steps, list) and all(whole(s) for s in steps))
            if not ok:
                fail("checkpoint.save_steps", f"must be a positive int, a list of positive ints, or null; got {steps}")
        if self.num_steps is not None and self.num_steps < 1:
            fail("checkpoint.num_steps", f"must be >= 1 (or null for up to train.max_steps); got {self.num_steps}")
        if self.max_to_keep is not None and self.max_to_keep < 1:
            fail("checkpoint.max_to_keep", f"must be >= 1 (or null to keep all); got {self.max_to_keep}")
        if not isinstance(self.load, LoadMode):
            fail("checkpoint.load", f"must be {either(LoadMode)}; got {self.load!r}")
        if self.load == LoadMode.true and not self.load_path:
            fail(
                "checkpoint.load_path",
                "checkpoint.load=True needs checkpoint.load_path=<checkpoint dir> "
                "(checkpoint.load=auto finds this run's own)",
            )
        if self.load_file not in ("latest", "best") and load_file_step(self.load_file) is None:
            fail(
                "checkpoint.load_file",
                f"must be latest, best, a step number or iter_<step>.ckpt; got {self.load_file!r}",
            )
        resuming = (self.load != LoadMode.false, "a resume (checkpoint.load=false)", "checkpoint.load=True (or auto)")
        refuse_unread(
            self,
            "checkpoint",
            {
                "load_path": resuming,
                "overwrite_config": resuming,
                "overwrite_optimizer": resuming,
            },
        )


def load_file_step(load_file: str) -> int | None:
    """The step `checkpoint.load_file` names (a step number); None for anything else."""
    return int(load_file) if re.fullmatch(r"\d+", str(load_file)) else None
