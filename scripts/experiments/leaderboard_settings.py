"""What one optimizer leaderboard is: the overrides every run of a board shares (on the CPU or a GPU, on GPT-2 or the
speedrun's optimization track's model), each optimizer's tuning plan (its step size's key, its most sensitive other
knob and how that knob steps), the seeds, and the records a tuned optimizer leaves in the board's folder
(`<out>/<name>.winner.json`), every one of which must be of the same board."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from core.errors import PipelineError

ROOT = Path(__file__).resolve().parents[2]

# The board's runs: gpt2-micro on pystdlib, context 128, batch 8 (1,024 tokens a step), no checkpoints; the budget
# (steps) is a flag, each preset's own schedule (its warmup and floor are fractions of the run). Evaluations every
# quarter of the run give the curves.
CPU_RUN = [
    "model=gpt2-micro",
    "dataset.context_size=128",
    "train.batch_size=8",
    "train.eval_iters=4",
    "checkpoint.save=false",
    "logging.wandb=disabled",
    "logging.plot=false",
    "logging.tensorboard=false",
    "logging.progress=lines",
]
GPU_RUN = [
    "model=gpt2-mini",
    "train.batch_size=32",
    "train.eval_iters=20",
    "checkpoint.save=false",
    "logging.wandb=disabled",
    "logging.plot=false",
    "logging.progress=lines",
    "system.dtype=bfloat16",
]
# --track optimization: the speedrun's optimization track's fixed model (conf/model/opt-track.yaml) instead of GPT-2,
# at the board's size: opt-track-micro (gpt2-micro's size) on the CPU, opt-track itself (context 1,024) with --gpu.
TRACK_MODELS = {"gpt2": ("gpt2-micro", "gpt2-mini"), "optimization": ("opt-track-micro", "opt-track")}
# val loss per token: a grid's edge point better than its neighbour by less is a flat grid, not an optimum past it
FLAT = 0.002
SEEDS = (0, 1)  # the grids run the first; the winner runs every one
LR = "optimizer.lr_config.lr"


@dataclass(frozen=True)
class Plan:
    """How an optimizer is tuned: the key of its step size, then its most sensitive other knob, stepped as `scale`
    says: "log" (x2), "beta" (1 - value x2: a momentum or averaging constant), or "choice" (`choices`: the preset's
    value, which the step grid's best already ran, against the others)."""

    step: str
    knob: str | None = None
    scale: str = "log"
    choices: tuple = ()


PLANS = {
    "adamw": Plan(LR, "optimizer.beta2", "beta"),
    "adam": Plan(LR, "optimizer.beta2", "beta"),
    "nadam": Plan(LR, "optimizer.beta2", "beta"),
    "nadamw": Plan(LR, "optimizer.beta2", "beta"),
    "sgdm": Plan(LR, "optimizer.momentum", "beta"),
    "rmsprop": Plan(LR, "optimizer.decay", "beta"),
    "lion": Plan(LR, "optimizer.beta2", "beta"),
    "signum": Plan(LR, "optimizer.momentum", "beta"),
    "muon": Plan(LR, "optimizer.groups.adam.lr_multiplier"),  # the embedding's and vectors' AdamW lr : Muon's
    "adafactor": Plan(LR, "optimizer.decay_rate", "beta"),
    "ademamix": Plan(LR, "optimizer.alpha"),
    "mars": Plan(LR, "optimizer.gamma"),
    "adam_mini": Plan(LR, "optimizer.beta2", "beta"),
    "scion": Plan(LR, "optimizer.momentum", "beta"),  # its authors advise 0.5 for short runs
    # the vocabulary's side of the embedding preconditioned (10000 >= 4,096) or not (2048), as at GPT-2's 50k
    "soap": Plan(LR, "optimizer.max_precond_dim", "choice", (10000, 2048)),
    "schedule_free_adamw": Plan("optimizer.sf_lr", "optimizer.beta1", "beta"),
    "schedule_free_sgd": Plan("optimizer.sf_lr", "optimizer.momentum", "beta"),
    "sophia": Plan(LR, "optimizer.gamma"),
    "kron": Plan(LR, "optimizer.max_size_triangular", "choice", (8192, 2048)),  # triangular or diagonal vocabulary
    "prodigy": Plan(LR, "optimizer.d0"),  # lr multiplies Prodigy's estimate d (d_coef does the same); d0 starts d
    "dadapt_adamw": Plan(LR, "optimizer.d0"),
    "cocob": Plan("optimizer.alpha"),  # no step size: alpha caps the early bets
}


def text(value: float) -> str:
    return f"{value:.6g}"


def loss_of(job: dict | None) -> float:
    return job["val_loss"] if job and job.get("status") == "completed" and math.isfinite(job["val_loss"]) else math.inf


def preset_centres(names: list[str]) -> dict[str, tuple]:
    """Each preset's step size and knob, as `python train_jax.py optimizer=<name>` composes them."""
    from omegaconf import OmegaConf

    from training.config.compose import compose_config

    centres = {}
    for name in names:
        cfg, plan = compose_config([f"optimizer={name}"]), PLANS[name]
        centres[name] = (OmegaConf.select(cfg, plan.step), plan.knob and OmegaConf.select(cfg, plan.knob))
    return centres


def board_run(track: str, gpu: bool) -> list[str]:
    """The overrides every run of the board shares: the CPU's or the GPU's, on the track's model."""
    model = f"model={TRACK_MODELS[track][int(gpu)]}"
    return [model if o.startswith("model=") else o for o in (GPU_RUN if gpu else CPU_RUN)]


def board_kind(board: dict) -> tuple[str, bool]:
    """(track, gpu) of a board's records: which of board_run's models its runs trained."""
    model = board_model(board)
    return next(
        ((track, bool(gpu)) for track, models in TRACK_MODELS.items() for gpu, m in enumerate(models) if m == model),
        ("gpt2", False),  # a board tuned with its own model=...: GPT-2's, on the CPU's settings
    )


def board_model(board: dict) -> str | None:
    """The model a board's runs trained: its overrides' last `model=` (Hydra's reading: a later one wins)."""
    return next((o.split("=", 1)[1] for o in reversed(board["run"]) if o.startswith("model=")), None)


def docs_name(track: str, gpu: bool) -> str:
    """docs/<name>.md and .png of a board: the CPU's GPT-2 board, the optimization track's, each GPU board apart."""
    return "optimizer_leaderboard" + ("" if track == "gpt2" else f"_{track}_track") + ("_gpu" if gpu else "")


def board_settings(run: list[str], steps: int, tokens_per_step: int) -> dict:
    """What makes two records of one board: the overrides every run shares, the steps and the tokens a step."""
    return {"run": run, "steps": steps, "tokens_per_step": tokens_per_step}


def tokens_per_step(run: list[str]) -> int:
    """The tokens a step of a run with these overrides trains on: its context x batch x accumulation, as composed
    (an extra `train.batch_size=...` included)."""
    from training import config as config_lib

    cfg = config_lib.load_config(run)
    return config_lib.context_size(cfg) * cfg.train.batch_size * cfg.train.grad_accum_steps


def read_records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.winner.json"))]


def check_boards(records: list[dict], out: Path, board: dict | None = None) -> dict:
    """The one board every record in `out` was tuned on (and `board`, when given: this invocation's); else a
    PipelineError naming what differs, so that no table ranks runs of other budgets or models together."""
    boards = [(r["optimizer"], r.get("board")) for r in records]
    if board is not None:
        boards.append(("this command", board))
    unknown = [name for name, b in boards if b is None]
    if unknown:
        raise PipelineError(
            f"{out}: {', '.join(unknown)} tuned before boards recorded their settings: tune it again in a new --out"
        )
    if not boards:  # --summarize or --presets on a folder no tuning wrote into
        raise PipelineError(f"{out}: holds no tuned optimizer's record (<name>.winner.json); tune with --out {out}")
    first_name, first = boards[0]
    for name, b in boards[1:]:
        if b != first:
            differs = [f"{k} {b[k]:,} against {first[k]:,}" for k in ("steps", "tokens_per_step") if b[k] != first[k]]
            if b["run"] != first["run"]:
                ours, theirs = ([o for o in x["run"] if o not in y["run"]] for x, y in ((b, first), (first, b)))
                differs.append(f"overrides {' '.join(ours) or '(none)'} against {' '.join(theirs) or '(none)'}")
            raise PipelineError(
                f"{out}: {name} and {first_name} are of different boards ({'; '.join(differs)}); choose another "
                "--out for another board"
            )
    return first
