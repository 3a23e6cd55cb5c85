"""Where a run writes, and what it starts from: fresh, resumed (`checkpoint.load=True`, or `auto` when the run's save
path holds a checkpoint) or from weights (`init_from`).

Resuming without `checkpoint.overwrite_config` runs the saved config.yaml; only the keys that describe this
invocation rather than the experiment come from the command line (`RESUME_KEYS`). A resumed run continues in its old
run directory (metrics.jsonl, TensorBoard and wandb continue the same curves) and writes its checkpoints beside the
ones it was loaded from. A resumed run takes the newest checkpoint that restores: when the latest is damaged,
`checkpoint.load=auto` falls back to an older one with a warning, and `checkpoint.load=True` stops with a line that
names it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np
from omegaconf import OmegaConf

from core.errors import CheckpointError, ConfigError, warn
from models.hf import HF_PREFIX, check_hf_config, load_hf_model, resolve_hf
from optimizers import continue_schedule_at
from training.checkpoints.checkpointer import PARTS, Checkpointer
from training.checkpoints.fit import check_same_accumulation, check_same_model, check_same_stages, eval_as_logged
from training.checkpoints.locate import KEYS, checkpoints_folder_of, find_checkpoint_dir, holds_checkpoints, run_dir_of
from training.checkpoints.storage import check_no_foreign_file, check_writable
from training.config import (
    Config,
    LoadMode,
    as_dict,
    check_new_run,
    evaluating,
    finish,
    init_from_dir,
    layout,
    load_mode,
)
from training.config.legacy import upgrade_saved
from training.step.state import TrainState

# Keys that describe this invocation (hardware, time budget, what to load, how to print): a resumed run takes them
# from the command line even when the saved config wins.
RESUME_KEYS = (
    "checkpoint",
    "system",
    "mode",
    "eval_only",
    "train.max_training_hours",
    "logging.run_dir",
    "logging.progress",
    "logging.wandb",
)
# Of those, what the experiment computes in, and where it is tracked (a run kept out of wandb stays out, one in it
# goes on in the same mode): the saved value stays unless the command line names the key.
SAVED_UNLESS_NAMED = ("system.dtype", "system.fp8_amax_history", "system.fp8_margin", "logging.wandb")
# Of those, how the steps are laid out and compiled: taken from the command line (a checkpoint of 8 GPUs resumes on
# one), and said in one line where that differs from the run's and the command did not name it, since the run then
# continues, but not bit for bit.
LAYOUT_KEYS = ("system.num_devices", "system.sharding", "system.mesh_model", "system.deterministic", "system.xla_flags")


@dataclass
class Source:
    """A checkpoint to start from: the reader, the step, and its metadata; or (`hf_folder`) a transformers GPT-2
    folder, whose metadata holds only the tokenizer it was trained with."""

    reader: Checkpointer | None
    step: int
    meta: dict
    hf_folder: Path | None = None
    passed_over: list[tuple[int, str]] = field(default_factory=list)  # newer steps not taken, and why
    load_file: str = "latest"

    @property
    def where(self) -> str:
        return f"hf:{self.hf_folder}" if self.hf_folder else f"{self.reader.directory} step {self.step}"


@dataclass
class RunPlan:
    cfg: Config  # the config this run uses
    run_dir: Path
    save_path: Path
    resume: Source | None  # full state (checkpoint.load=True)
    init_from: Source | None  # weights only (init_from=<dir>)
    ignored_overrides: list[str]
    # checkpoint.load=auto found no checkpoint, and run_dir holds a run that trained (killed before its first save, or
    # one that saved none): this run starts afresh there, that run's logs set aside first (set_aside_logs)
    restarts_trained_run: bool = False
    # a resumed run given another logging.run_dir than the resumed run's: it saves there, and logs as a run of its own
    branch_of: Path | None = None


def open_source(path: str, load_file: str, keys: tuple[str, str] = KEYS) -> Source:
    """The checkpoint `load_file` names; for `latest`, the newest whose metadata reads (what was passed over is
    recorded, and restore_state decides whether falling back is allowed). `keys`: what names them in messages."""
    reader = Checkpointer(find_checkpoint_dir(path, keys), read_only=True)
    step = reader.resolve(load_file, keys)
    passed_over: list[tuple[int, str]] = []
    for candidate in [step] + (older_steps(reader, step) if load_file == "latest" else []):
        try:
            return Source(reader, candidate, reader.read_meta(candidate), passed_over=passed_over, load_file=load_file)
        except CheckpointError as e:
            passed_over.append((candidate, str(e)))
    raise CheckpointError(
        passed_over[0][1] + ("; no older checkpoint's metadata reads either" if len(passed_over) > 1 else "")
    )


def older_steps(reader: Checkpointer, step: int) -> list[int]:
    return [s for s in reversed(reader.steps()) if s < step]


def auto_resume_path(cfg: Config) -> str | None:
    """checkpoint.load=auto: this run's own save path (checkpoint.save_path, or <logging.run_dir>/checkpoints) when
    it holds a complete checkpoint, so that the same command rerun continues the run, also one that started from
    another run's checkpoint; else checkpoint.load_path, which must then hold one (unless it is this run's own path:
    a run that has not saved yet starts fresh); else None, a fresh start. Evaluating (mode=eval), load_path first."""
    c = cfg.checkpoint
    run_dir = cfg.logging.run_dir
    own = own_save_path(cfg)
    if evaluating(cfg) and c.load_path:
        return c.load_path  # what to evaluate, named
    if own is not None and _holds_steps(own):
        return own
    if c.load_path and not _same_place(c.load_path, own, run_dir):
        return c.load_path  # open_source says in one line what is missing there
    return None


def own_save_path(cfg: Config) -> str | None:
    """Where this run saves, where the command names it (checkpoint.save_path, or <logging.run_dir>/checkpoints)."""
    run_dir = cfg.logging.run_dir
    return cfg.checkpoint.save_path or (str(Path(run_dir) / layout.CHECKPOINTS) if run_dir else None)


def _holds_steps(path: str) -> bool:
    return Path(path).expanduser().is_dir() and holds_checkpoints(find_checkpoint_dir(path))


def _same_place(path: str, *places: str | None) -> bool:
    where = Path(path).expanduser().absolute()
    return any(p is not None and where == Path(p).expanduser().absolute() for p in places)


def plan_run(cfg: Config, overrides: list[str], stamp: int) -> RunPlan:
    """`stamp`: a start time shared by all processes, so they agree on a fresh run's directory name."""
    resume = init_from = None
    ignored: list[str] = []
    mode = load_mode(cfg)
    resume_path = (
        cfg.checkpoint.load_path if mode == LoadMode.true else auto_resume_path(cfg) if mode == LoadMode.auto else None
    )
    if mode == LoadMode.auto and resume_path is None and evaluating(cfg):
        raise CheckpointError(
            "checkpoint.load=auto: no checkpoint to evaluate in checkpoint.load_path, "
            "checkpoint.save_path or <logging.run_dir>/checkpoints"
        )
    load_file = cfg.checkpoint.load_file
    if mode == LoadMode.auto and resume_path is not None and not evaluating(cfg):
        if _same_place(resume_path, own_save_path(cfg)):
            # a rerun continues its own checkpoints where it stopped: load_file names what it started from (a
            # fine-tune's `best` of the pretrained run), and took the fine-tune back to its own best step
            load_file = "latest"
    if resume_path is not None:
        resume = open_source(resume_path, load_file)
        if not cfg.checkpoint.overwrite_config:
            cfg, ignored = _saved_config_wins(cfg, resume, overrides)
        check_same_model(cfg, resume.meta, f"{resume.reader.directory}/{resume.step}")
        check_same_accumulation(cfg, resume.meta)
        if cfg.checkpoint.overwrite_config and not evaluating(cfg):
            check_same_stages(cfg, resume.meta, resume.step)
        if evaluating(cfg) and not cfg.checkpoint.overwrite_config:  # the saved config's batches, as logged
            cfg = eval_as_logged(cfg, resume.meta, jax.process_count(), jax.local_device_count())
    elif str(cfg.init_from or "").startswith(HF_PREFIX):
        init_from = open_hf_source(cfg)
    elif init_from_dir(cfg):
        init_from = open_source(init_from_dir(cfg), cfg.checkpoint.load_file, ("init_from", KEYS[1]))
        check_same_model(cfg, init_from.meta, f"{init_from.reader.directory}/{init_from.step}")
    if resume is None and mode != LoadMode.false:  # asked to resume, and nothing to: a new run after all
        check_new_run(cfg)

    branch_of = None  # the run a resumed run leaves for another logging.run_dir
    if resume is not None:
        resumed_run = run_dir_of(resume.reader.directory, resume.meta).expanduser()
        run_dir = Path(cfg.logging.run_dir or resumed_run).expanduser()
        # in its own run directory a run continues beside the checkpoint it resumed; in another, it is a branch,
        # which saves in its own directory: saving beside that checkpoint, its retention deleted the run's steps
        if run_dir.absolute() != resumed_run.absolute():
            branch_of = resumed_run
        save_path = Path(
            cfg.checkpoint.save_path or (run_dir / layout.CHECKPOINTS if branch_of else resume.reader.directory)
        ).expanduser()
    else:
        name = cfg.logging.name or f"{cfg.model.name}-{cfg.dataset.name}"
        run_dir = Path(cfg.logging.run_dir or f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(stamp))}")
        run_dir = run_dir.expanduser()  # `~/runs/x` is the home's, as a shell would read it unquoted
        save_path = Path(cfg.checkpoint.save_path or run_dir / layout.CHECKPOINTS).expanduser()
    check_writable("logging.run_dir", run_dir)
    if not evaluating(cfg) and cfg.checkpoint.save:
        check_writable("checkpoint.save_path", save_path)
    # a prebuilt store may be read-only; a cache that is not there yet must be made
    check_writable(
        "dataset.cache_dir", cfg.dataset.cache_dir, probe=not Path(cfg.dataset.cache_dir).expanduser().exists()
    )
    restarts = resume is None and not evaluating(cfg) and has_trained(run_dir)
    if restarts and mode == LoadMode.false:
        raise ConfigError(  # its metrics, config and summary would be mixed with this run's or overwritten
            f"logging.run_dir: {run_dir} already holds a run that trained ({layout.METRICS}); choose another "
            f"directory, or continue that run with checkpoint.load=True checkpoint.load_path={run_dir}"
        )
    if branch_of is not None and not evaluating(cfg) and has_trained(run_dir):
        if mode != LoadMode.auto:
            raise ConfigError(  # its metrics, config and summary would be mixed with this run's or overwritten
                f"logging.run_dir: {run_dir} already holds a run that trained ({layout.METRICS}); choose another "
                f"directory for this branch of {branch_of}, or rerun with checkpoint.load=auto (it continues that "
                "run's own checkpoints; with none, it starts the branch again, that run's logs set aside)"
            )
        restarts = True  # a branch killed before its first checkpoint: auto starts it again from the same one
    saving = not evaluating(cfg) and cfg.checkpoint.save
    # among a run's steps, this run's logs would be read as a step (beside them) or deleted with one (inside one);
    # a run that saved beside its own logs (checkpoint.save_path=<its run dir>) continues there, wherever it saves now
    folder = checkpoints_folder_of(run_dir)
    own = resume is not None and branch_of is None and folder == run_dir.resolve()
    if folder is not None and folder != save_path.resolve() and not own:
        continues = ""
        if folder == run_dir.resolve() and layout.is_run_dir(run_dir):
            saved_to = _saved_save_path(run_dir) or run_dir
            continues = f", or continue the run that saved there with checkpoint.save_path={saved_to} (its save path)"
        raise ConfigError(
            f"logging.run_dir: {run_dir} {_in_folder(run_dir, folder)}, where this run's logs would be read as a "
            f"step or deleted with one; choose a directory outside it{continues}"
        )
    folder = checkpoints_folder_of(save_path) if saving else None
    if folder is not None and folder != save_path.resolve():
        raise ConfigError(
            f"checkpoint.save_path: {save_path} {_in_folder(save_path, folder)} (inside or beside its steps); "
            "choose a path outside it"
        )
    if not evaluating(cfg) and not restarts and (resume is None or branch_of is not None):
        check_no_foreign_file("logging.run_dir", run_dir, (layout.CONFIG, layout.SUMMARY))
        if saving:
            check_no_foreign_file("checkpoint.save_path", save_path, (layout.CONFIG,))
    if saving and save_path.absolute() != run_dir.absolute() and layout.is_run_dir(save_path):
        raise ConfigError(  # the checkpoints' config.yaml would replace that run's
            f"checkpoint.save_path: {save_path} is a run's directory ({layout.METRICS}), whose config.yaml the "
            "checkpoints' would replace; choose another path"
        )
    resuming_here = resume is not None and save_path.absolute() == resume.reader.directory
    if saving and not resuming_here and holds_checkpoints(save_path):
        raise CheckpointError(
            f"checkpoint.save_path: {save_path} already holds another run's checkpoints; choose another "
            f"path, or resume that run with checkpoint.load=True checkpoint.load_path={save_path}"
        )
    return RunPlan(cfg, run_dir.absolute(), save_path.absolute(), resume, init_from, ignored, restarts, branch_of)


def _saved_save_path(run_dir: Path) -> str | None:
    """The save path the run in `run_dir` last wrote to (its config.yaml's): where it continues, also after it moved
    its saving away from its run directory."""
    try:
        return OmegaConf.select(OmegaConf.load(run_dir / layout.CONFIG), "checkpoint.save_path")
    except Exception:  # no config.yaml, or one cut short: the run directory itself is the guess
        return None


def _in_folder(path: Path, folder: Path) -> str:
    where = "is" if path.resolve() == folder else f"is in {folder},"
    return f"{where} a run's checkpoints folder"


def has_trained(run_dir: Path) -> bool:
    """A run has logged a training step in `run_dir` (one that failed before its first step left nothing to keep)."""
    if not layout.is_run_dir(run_dir):
        return False
    with open(run_dir / layout.METRICS) as rows:
        return any('"train"' in row and _split(row) == "train" for row in rows)


def _split(row: str) -> str | None:
    """A metrics.jsonl line's split; None for a line a killed process cut off."""
    try:
        return json.loads(row).get("split")
    except (json.JSONDecodeError, AttributeError):
        return None


def set_aside_logs(run_dir: Path) -> Path:
    """A run that trained in `run_dir` and left no checkpoint, which checkpoint.load=auto starts again from step 0:
    its logs move to `run_dir/abandoned-<time>/` (kept, never deleted), so that this run's are not mixed with them."""
    aside = run_dir / f"{layout.ABANDONED}{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    for name in (layout.METRICS, layout.SUMMARY, layout.CONFIG, layout.PLOTS, layout.TENSORBOARD):
        if (run_dir / name).exists():
            (run_dir / name).rename(aside / name)
    warn(
        f"checkpoint.load=auto: {run_dir} holds a run that trained and left no checkpoint; this run starts at step 0, "
        f"that run's logs kept in {aside}"
    )
    return aside


def _saved_config_wins(cfg: Config, source: Source, overrides: list[str]) -> tuple[Config, list[str]]:
    """The saved config with this invocation's RESUME_KEYS, checked as a command line's would be, and the overrides
    it leaves unused."""
    config_file = source.reader.directory / layout.CONFIG
    try:
        saved = upgrade_saved(
            OmegaConf.load(config_file) if config_file.exists() else OmegaConf.create(source.meta["config"])
        )
    except Exception as e:
        raise CheckpointError(f"checkpoint {config_file}: unreadable ({type(e).__name__}); corrupt?") from None
    given = OmegaConf.create(as_dict(cfg))
    named = {item.split("=", 1)[0].lstrip("+~") for item in overrides}
    kept = {key: OmegaConf.select(saved, key) for key in SAVED_UNLESS_NAMED if key not in named}
    trained = {key: _plain(OmegaConf.select(saved, key)) for key in LAYOUT_KEYS if key not in named}
    now = {key: _plain(OmegaConf.select(given, key)) for key in trained}
    if moved := [key for key in trained if trained[key] != now[key]]:
        warn(
            f"the run trained with {' '.join(f'{k}={trained[k]}' for k in moved)}, which this command leaves at "
            f"{' '.join(f'{k}={now[k]}' for k in moved)} (a resume takes system.* from its command line): it "
            "continues, but not bit for bit; name them to keep the run's"
        )
    for key in RESUME_KEYS:
        OmegaConf.update(saved, key, OmegaConf.select(given, key), merge=False)
    for key, value in kept.items():
        if value is not None:
            OmegaConf.update(saved, key, value, merge=False)
    try:
        resumed = finish(saved, jax.local_device_count(), saved=True)
    except ConfigError as e:
        raise ConfigError(
            f"{e}, in the saved {config_file} (checkpoint.overwrite_config=True runs this command "
            "line's config instead)"
        ) from None
    runs = OmegaConf.create(as_dict(resumed))
    ignored = {}  # by key: a key given twice took its last value, which is the one set aside
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if "=" in item and "/" not in key and not any(key == k or key.startswith(k + ".") for k in RESUME_KEYS):
            if OmegaConf.select(given, key) != OmegaConf.select(runs, key):
                ignored.pop(key, None)
                ignored[key] = item
    return resumed, list(ignored.values())


def _plain(value: Any) -> Any:
    """A config value as YAML would write it (null, a list), for a one-line message."""
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else value


def open_hf_source(cfg: Config) -> Source:
    """`init_from=hf:<folder or Hub id>`: GPT-2 weights. A folder exported by this project names its tokenizer;
    other GPT-2 checkpoints use GPT-2's own (dataset.tokenizer=gpt2)."""
    folder = resolve_hf(cfg.init_from[len(HF_PREFIX) :], cfg.dataset.cache_dir)
    check_hf_config(folder, cfg.model)
    ours = folder / "gpt_jax_tokenizer.json"
    tokenizer = json.loads(ours.read_text()) if ours.exists() else {"kind": "gpt2"}
    return Source(None, 0, {"tokenizer": tokenizer}, hf_folder=folder)


def carried_over(meta: dict | None, key: str, default: Any) -> Any:
    return default if meta is None else meta.get(key, default)


def restore_state(state: TrainState, plan: RunPlan) -> TrainState:
    """The fresh `state` with what the plan loads: everything (resume), all but the optimizer state (resume with
    checkpoint.overwrite_optimizer=True: a fresh optimizer whose lr schedule continues at the restored step), or the
    weights alone (init_from: the schedule starts at 0). A resume takes the newest checkpoint that restores, and
    `plan.resume` becomes that one."""
    if plan.resume is not None:
        restored, plan.resume = _newest_that_restores(
            plan.resume, lambda source: _resume(state, source, plan.cfg), fallback=load_mode(plan.cfg) == LoadMode.auto
        )
        return restored
    if plan.init_from is not None and plan.init_from.hf_folder is not None:
        key = jax.random.fold_in(state.key, 0x4846)  # rows for ids the checkpoint lacks
        model = load_hf_model(plan.init_from.hf_folder, state.model, key)
        model = jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), model, state.model)
        return eqx.tree_at(lambda s: s.model, state, model)
    if plan.init_from is not None:
        return plan.init_from.reader.restore(plan.init_from.step, state, ("model",))
    return state


def check_data_position(plan: RunPlan, samples_before: Callable[[int], int], context: int) -> None:
    """A resumed run reads each step's batch where the run's batches put it (data/batches.py: a pure function of
    the step and this run's batch, processes and accumulation), so it continues the checkpoint's data order only if
    its steps before the checkpoint's take the tokens that run's took: else it trains again on data it saw, or skips
    some. `samples_before(step)`: this run's training sequences in its first `step` steps, of `context` tokens."""
    if plan.resume is None or (saved := plan.resume.meta.get("tokens_seen")) is None:
        return
    step = plan.resume.step
    if step == 0 or (here := samples_before(step) * context) == saved:
        return
    raise ConfigError(
        f"config: train.batch_size: the checkpoint's {step} steps trained on {saved:,} tokens, where this run's "
        f"batches ({jax.process_count()} process(es) x train.batch_size x train.grad_accum_steps) take {here:,}: a "
        "resumed run continues the data order only at the checkpoint's sequences per step; set train.batch_size "
        "(per process) to give them, with checkpoint.overwrite_config=True, or grow the batch with train.stages"
    )


def starts_fresh_optimizer(cfg: Config, meta: dict) -> bool:
    """checkpoint.overwrite_optimizer starts a fresh optimizer state at the checkpoint the run switches from. A
    checkpoint saved under that same switch (its config asks for it too, with this optimizer section) holds the fresh
    optimizer's state already: the same command rerun after a kill (checkpoint.load=auto) continues it, where it had
    started it afresh again at every rerun."""
    if not cfg.checkpoint.overwrite_optimizer:
        return False
    saved = meta.get("config") or {}
    mine = json.loads(json.dumps(as_dict(cfg)["optimizer"]))  # as the metadata's JSON holds it
    return not (saved.get("checkpoint", {}).get("overwrite_optimizer") and saved.get("optimizer") == mine)


def _resume(state: TrainState, source: Source, cfg: Config) -> TrainState:
    if starts_fresh_optimizer(cfg, source.meta):
        restored = source.reader.restore(source.step, state, ("model", "progress"))
        # Fresh moments, but the lr schedule continues where the run was: at the updates it had applied.
        lr_step = restored.step - restored.loss_scale.skipped
        return eqx.tree_at(lambda s: s.opt_state, restored, continue_schedule_at(restored.opt_state, lr_step))
    return source.reader.restore(source.step, state, PARTS)


def _newest_that_restores(
    source: Source, restore: Callable[[Source], TrainState], fallback: bool
) -> tuple[TrainState, Source]:
    """`restore(source)`, or (load_file=latest) that of the newest older checkpoint that restores: taken with a
    warning when `fallback`, else named in the error. A damaged checkpoint is never taken silently."""
    failures = list(source.passed_over)
    candidates = [source.step] + (older_steps(source.reader, source.step) if source.load_file == "latest" else [])
    for step in candidates:
        try:
            candidate = source if step == source.step else Source(source.reader, step, source.reader.read_meta(step))
            restored = restore(candidate)
        except CheckpointError as e:
            failures.append((step, str(e)))
            continue
        if not failures:
            return restored, candidate
        if fallback:
            warn(f"{failures[0][1]}; resuming from step {step}, the newest checkpoint that restores")
            return restored, dataclasses.replace(candidate, passed_over=failures)
        raise CheckpointError(
            f"{failures[0][1]}; the newest checkpoint that restores is step {step}: resume it with "
            f"checkpoint.load_file={step} (or checkpoint.load=auto)"
        )
    raise CheckpointError(failures[0][1] + ("; no other checkpoint there restores either" if len(failures) > 1 else ""))


def shared_timestamp(now: float) -> int:
    """Process 0's clock, so that every process names a fresh run directory the same."""
    stamp = np.int64(now)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        stamp = multihost_utils.broadcast_one_to_all(stamp)
    return int(stamp)
