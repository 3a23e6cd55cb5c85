"""The whole run's config: the top-level keys, the sections, the checks that span sections, and the values derived
from it where they are used (never written back)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

import jax

from core.checks import either, fail
from data.config import DataConfig, DatasetConfig
from data.corpus import NOTE_SOURCES
from data.task_names import TASK_NAMES
from models import parameter_labels, resolve_attention
from models.fp8 import native_fp8_problem
from models.hf import HF_PREFIX
from optimizers.groups import check_labels_present, matrix_optimizers
from optimizers.muon import cooldown_steps
from optimizers.registry import AVERAGED, LR_USE, OWN_WIDTH_RULE
from optimizers.schedules import warmup_steps
from training.config.loop import CheckpointConfig, LoadMode, LoggingConfig, TrainConfig
from training.config.mixture import check_mixture
from training.config.model import ModelConfig, Position
from training.config.optimizer import OptimizerConfig
from training.config.system import SystemConfig


class Mode(StrEnum):
    train = "train"  # train (and evaluate along the way)
    eval = "eval"  # evaluate a checkpoint on every validation split and the test split; train nothing


class Stage(StrEnum):
    next_token_pretraining = "next_token_pretraining"  # learn every next token
    piano_task = "piano_task"  # records `<TASK> prompt <GENAI> target` of the piano tasks in `tasks`


class LossMasking(StrEnum):
    pretraining = "pretraining"  # every target token but padding counts
    finetuning = "finetuning"  # only the target tokens after <GENAI> count


@dataclass(frozen=True)
class Config:
    mode: Mode = Mode.train  # what the run does
    eval_only: bool = False  # piano-gpt's name for mode=eval, read as it (training/config/legacy.py)
    stage: Stage = Stage.next_token_pretraining  # what the records are
    # null: fresh weights (piano-gpt's `scratch_next_token` is read as null); a checkpoint (or run) dir: its
    # weights, fresh optimizer, step 0; hf:<folder or Hub id>: GPT-2 weights from a transformers folder (e.g. hf:gpt2)
    init_from: Optional[str] = None
    loss_masking: LossMasking = LossMasking.pretraining  # which target tokens the loss counts
    tasks: list[str] = field(default_factory=list)  # piano_task: names of data/task_names.py TASK_NAMES
    task_weights: list[float] = field(default_factory=list)  # how often each task is drawn; empty = equally
    dataset: DatasetConfig = field(default_factory=DatasetConfig)  # documents or pieces, tokenizer, token store
    data: DataConfig = field(default_factory=DataConfig)  # records of notes
    model: ModelConfig = field(default_factory=ModelConfig)  # the network
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)  # optimizer and learning-rate schedule
    train: TrainConfig = field(default_factory=TrainConfig)  # steps, batches, evaluation
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # console, wandb, TensorBoard, statistics
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # saving, resuming, loading weights
    system: SystemConfig = field(default_factory=SystemConfig)  # devices, processes, dtype

    def check(self) -> None:
        """Each section's own values, then this level's."""
        self.model.check()
        self.train.check()
        self.system.check()
        self.optimizer.check()
        self.dataset.check()
        self.data.check()
        if not self.dataset.notes and self.data.notes_per_record != DataConfig.notes_per_record:  # unread by text
            fail(
                "data.notes_per_record",
                f"cuts pieces of notes into records, and dataset={self.dataset.name} is text; drop it, or train on "
                "notes (dataset=music21 or midi_files)",
            )
        self.logging.check()
        self.checkpoint.check()
        for task in self.tasks:
            if task not in TASK_NAMES:
                fail("tasks", f"unknown task {task!r}; choose from {', '.join(TASK_NAMES)}")
        weights = self.task_weights
        if weights and (len(weights) != len(self.tasks) or min(weights) < 0 or sum(weights) <= 0):
            fail("task_weights", f"needs one weight >= 0 per task ({len(self.tasks)}), not all 0; got {list(weights)}")


def check_new_run(cfg: Config) -> None:
    """The checks of values that a run which trained may carry in its config, trained as they were (piecewise
    points past the end, a warm-up longer than the run, a μP base that is not a multiple of the heads): a new run's
    only. compose.finish runs them for a command that resumes nothing, training/checkpoints/resume.plan_run for one
    that asked to resume and found nothing to (checkpoint.load=auto on a fresh run directory): the same command line
    plus checkpoint.load=auto continues a run that trained before a check was added."""
    check_schedule_points(cfg)
    check_own_warmups(cfg)
    check_mup_base(cfg)


def check_schedule_points(cfg: Config) -> None:
    """piecewise_linear's points within the run (the preset's 400 and 800 in a 120-step run were never reached, the lr
    only on its way to the first, unsaid). Not for a saved config: the run it describes trained that way."""
    lr = cfg.optimizer.lr_config
    if lr.name != "piecewise_linear":
        return
    steps = schedule_steps(cfg)
    last = max(lr.boundaries) + warmup_steps(lr, steps)
    if last > steps:
        fail(
            "optimizer.lr_config.boundaries",
            f"the last point, at step {last} (its boundary after the warmup), is past the schedule's {steps} steps, "
            "which never reach it: give boundaries within the run",
        )


def check_own_warmups(cfg: Config) -> None:
    """The warm-ups an optimizer runs inside itself (`sf_warmup`, `momentum_warmup`, `alpha_warmup`, ...: any
    hyper-parameter named `*_warmup`) read as `optimizer.lr_config.warmup` is (optimizers/schedules.py
    own_warmups_in_steps), so they are checked as it is: 0 or more, whole steps from 1 up, and ending within the run
    (sf_warmup=100 in an 8-step run kept the step size under 8% of sf_lr, unsaid). Not for a saved config: the run it
    describes trained that way."""
    own = {f"optimizer.{f.name}": getattr(cfg.optimizer, f.name) for f in dataclasses.fields(cfg.optimizer)}
    for group, values in cfg.optimizer.groups.items():  # a group's own, read the same way (optimizers/groups.py)
        own.update({f"optimizer.groups.{group}.{k}": v for k, v in (values or {}).items()})
    for key, value in own.items():
        if not key.endswith("_warmup") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # prodigy's safeguard_warmup is a switch
        if value < 0:
            fail(key, f"must be >= 0 (steps, or below 1 a fraction of the run); got {value:g}")
        if value >= 1 and value != int(value):
            fail(key, f"1 or more is a number of steps, a whole one (below 1, a fraction of the run); got {value:g}")
        if value > cfg.train.max_steps:
            fail(
                key,
                f"{value:g} steps exceed the run's {cfg.train.max_steps} (train.max_steps), which never ends the "
                "warm-up; lower it, or give it as a fraction of the run (below 1, e.g. 0.1)",
            )


def check_mup_base(cfg: Config) -> None:
    """μP's base model is this one at width model.mup_base_width with the same heads (models/mup.py: the scores'
    factor sqrt(head_dim0 / head_dim) = 1/sqrt(m) holds only then): gpt2-mini's 6 heads at the default 256 (a
    gpt2-micro base of 4 heads x 64) made a base of 42.7-wide heads, and scaled scores whose head size had not
    changed. Not for a saved config: the run it describes trained that way."""
    m = cfg.model
    if m.parametrization != "mup" or m.mup_base_width % m.n_head == 0:
        return
    near = m.n_head * max(1, round(m.mup_base_width / m.n_head))
    fail(
        "model.mup_base_width",
        f"{m.mup_base_width} is not a multiple of model.n_head={m.n_head}: μP's base model is this one at that "
        f"width with the same {m.n_head} heads (widening grows the head size); tune the lr on such a base, e.g. "
        f"model.mup_base_width={near}",
    )


def check_across(cfg: Config) -> None:
    """Values that are wrong only together with another section's."""
    d, lr, c = cfg.dataset, cfg.optimizer.lr_config, cfg.checkpoint
    if d.context_size is not None and not 0 < d.context_size <= cfg.model.context_size:
        fail("dataset.context_size", f"{d.context_size} must be in [1, model.context_size={cfg.model.context_size}]")
    if lr.warmup > schedule_steps(cfg):
        fail(
            "optimizer.lr_config.warmup",
            f"{lr.warmup:g} steps exceed the schedule's {schedule_steps(cfg)}; lower "
            "it, or give it as a fraction of the run (below 1, e.g. 0.1)",
        )
    cooldown, end = getattr(cfg.optimizer, "momentum_cooldown", None), getattr(cfg.optimizer, "momentum_end", None)
    if cooldown is not None or end is not None:  # muon's momentum cool-down, as set, against the run's length
        cooldown_steps(cooldown or 0.0, 0.0 if end is None else end, schedule_steps(cfg))
    check_mixture(d, cfg.loss_masking == LossMasking.finetuning)
    windows = [s.attention_window for s in cfg.train.stages if s.attention_window is not None]
    if windows and cfg.model.attention_window not in (None, windows[-1]):
        fail(
            "model.attention_window",
            f"train.stages name the windows, and the last stage's ({windows[-1]}) is the model's: set it null or "
            f"{windows[-1]}; got {cfg.model.attention_window}",
        )
    for i, stage in enumerate(cfg.train.stages):
        if stage.lr_multiplier != 1.0 and LR_USE.get(cfg.optimizer.name) == "own":
            fail(
                f"train.stages[{i}].lr_multiplier",
                f"{cfg.optimizer.name} sets its own step size, which the run's schedule does not reach; leave it 1.0",
            )
    if cfg.train.yarn and cfg.model.position != Position.rope:
        fail("train.yarn", f"YaRN rescales rotary positions: it needs model.position=rope, not {cfg.model.position}")
    if cfg.optimizer.name == "sophia" and cfg.model.head_loss == "chunked":
        fail(
            "model.head_loss",
            "sophia differentiates the loss twice (Hessian-vector products), which the chunked "
            "head's hand-written backward pass does not support; use model.head_loss=dense",
        )
    m = cfg.model
    if m.parametrization == "mup" and m.n_embd != m.mup_base_width and cfg.optimizer.name in AVERAGED:
        fail(
            "model.parametrization",
            f"μP scales the hidden matrices' steps after {cfg.optimizer.name}, whose evaluation weights are then not "
            "the average of where it went; use model.parametrization=standard or another optimizer",
        )
    if m.parametrization == "mup" and (own := sorted(matrix_optimizers(cfg.optimizer) & set(OWN_WIDTH_RULE))):
        fail(
            "model.parametrization",
            f"μP divides the hidden matrices' steps by the width multiplier, Adam's rule; {own[0]} steps them "
            f"{OWN_WIDTH_RULE[own[0]]}: use model.parametrization=standard, or give the matrices an Adam-style "
            "optimizer (optimizer.groups)",
        )
    if cfg.optimizer.groups:  # groups name labels this model has (from its shapes alone: nothing is allocated)
        check_labels_present(cfg.optimizer, parameter_labels(cfg.model))
    if cfg.stage == Stage.piano_task:
        if not d.notes:
            fail("stage", f"piano_task needs a notes source (dataset={either(NOTE_SOURCES)}), not {d.source}")
        if not cfg.tasks:
            fail(
                "tasks",
                f"stage=piano_task needs at least one task, e.g. tasks=[dynamics]; choose from {', '.join(TASK_NAMES)}",
            )
    elif cfg.tasks:
        fail("tasks", "tasks are for stage=piano_task; set stage=piano_task or tasks=[]")
    if cfg.loss_masking == LossMasking.finetuning and cfg.stage != Stage.piano_task and not d.records:
        fail(
            "loss_masking",
            "finetuning puts the loss after <GENAI>, which only records have: set stage=piano_task "
            "or dataset.prompt_column / dataset.completion_column",
        )
    if evaluating(cfg) and c.load == LoadMode.false and cfg.init_from:
        fail(
            "mode",
            "mode=eval evaluates a run's checkpoint (checkpoint.load=True checkpoint.load_path=<dir>), not init_from's "
            "weights: a run with init_from and train.eval_at_start=true scores those at its step 0",
        )
    if evaluating(cfg) and c.load == LoadMode.false:
        fail("mode", "mode=eval evaluates a checkpoint: add checkpoint.load=True checkpoint.load_path=<dir>")
    if c.load == LoadMode.true and (init_from_dir(cfg) or str(cfg.init_from or "").startswith(HF_PREFIX)):
        fail("init_from", "choose one: checkpoint.load=True resumes a run, init_from=<dir> starts one from weights")


def check_devices(cfg: Config, num_local_devices: int) -> None:
    """What depends on this process's devices (known only once JAX has started, after jax.distributed)."""
    sy, m = cfg.system, cfg.model
    if sy.num_devices is not None and jax.process_count() > 1:  # started by a launcher: num_processes was null
        fail(
            "system.num_devices",
            f"selects local devices of a single process; this run has {jax.process_count()} processes: leave it null",
        )
    if sy.num_devices is not None and not 0 < sy.num_devices <= num_local_devices:
        fail("system.num_devices", f"{sy.num_devices} must be in [1, {num_local_devices}] on this machine")
    n_dev = sy.num_devices or num_local_devices
    if sy.mesh_model < 1 or n_dev % sy.mesh_model:
        fail("system.mesh_model", f"{sy.mesh_model} must be >= 1 and divide the {n_dev} local devices")
    for key, size in (
        ("model.n_head", m.n_head),
        ("model.n_kv_head", m.n_kv_head or m.n_head),
        ("model.vocab_multiple", m.vocab_multiple),
    ):
        if size % sy.mesh_model:
            fail(
                "system.mesh_model",
                f"{sy.mesh_model} must divide {key}={size}: tensor parallelism splits the heads "
                "and the vocabulary over the `model` axis",
            )
    data_devices = n_dev // sy.mesh_model
    if cfg.train.batch_size % data_devices:
        fail(
            "train.batch_size",
            f"{cfg.train.batch_size} is not divisible by the {data_devices} local devices it is "
            "split over (train.batch_size counts sequences per process)",
        )
    for i, stage in enumerate(cfg.train.stages):
        if stage.batch_size and stage.batch_size % data_devices:
            fail(
                f"train.stages[{i}].batch_size",
                f"{stage.batch_size} is not divisible by the {data_devices} local devices it is split over",
            )
    resolve_attention(m.attention, sy.dtype, sy.deterministic)  # cudnn where it cannot run: said before data is read
    if sy.dtype == "fp8" and not m.fused_qkv:  # an FP8 step kept the one product anyway, without a word
        fail(
            "model.fused_qkv",
            "false splits the QKV product in three, and FP8 scales it as one (one amax, one scale); leave it true "
            "under system.dtype=fp8",
        )
    if sy.dtype == "fp8" and (problem := native_fp8_problem()) is not None:
        if jax.default_backend() == "gpu":
            fail("system.dtype", f"fp8: {problem}; use system.dtype=bfloat16")
        if jax.process_index() == 0:  # CPU: the same rounding in 16-bit matmuls, which tests and checks rely on
            print(
                f"note: system.dtype=fp8: {problem}; the FP8 rounding runs emulated in bfloat16 matmuls "
                "(same numbers, no speed-up)",
                file=sys.stderr,
            )


def evaluating(cfg: Config) -> bool:
    """mode=eval: evaluate a checkpoint, train nothing."""
    return cfg.mode == Mode.eval


def load_mode(cfg: Config) -> LoadMode:
    return cfg.checkpoint.load  # type: ignore[return-value]  # a LoadMode once checked


def init_from_dir(cfg: Config) -> str | None:
    """The checkpoint directory `init_from` names, or None for fresh weights (null)."""
    if cfg.init_from is None or cfg.init_from.startswith(HF_PREFIX):
        return None
    return cfg.init_from


def context_size(cfg: Config) -> int:
    """Tokens per training window (the model sees windows of this length)."""
    return cfg.dataset.context_size or cfg.model.context_size


def schedule_steps(cfg: Config) -> int:
    """Length of the learning-rate schedule in optimizer steps."""
    return cfg.optimizer.lr_config.max_steps or cfg.train.max_steps


def listed_save_steps(cfg: Config) -> list[int]:
    """Steps named in a list `checkpoint.save_steps`: always kept, whatever max_to_keep says."""
    steps = cfg.checkpoint.save_steps
    return list(steps) if isinstance(steps, list) else []
