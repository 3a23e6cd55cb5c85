"""What a run tells people: console lines or a progress bar, `metrics.jsonl`, TensorBoard and wandb.

Only process 0 talks; every other process gets a logger whose methods do nothing. All files go under the run
directory: metrics.jsonl (one JSON object per log or eval event), tensorboard/, wandb/.
"""

from __future__ import annotations

import json
import math
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from core.errors import ConfigError, PipelineError, first_line, warn
from core.secrets import secret

if TYPE_CHECKING:
    import optax
    from jax.sharding import Mesh

    from data import Data
    from data.tokenizers import Tokenizer
    from models.gpt import GPT
    from training.checkpoints.resume import RunPlan
    from training.config import Config

WANDB_CONNECT_TIMEOUT_S = 5  # online: how long the server has to take a connection before wandb.init is tried
WANDB_INIT_TIMEOUT_S = 30  # and wandb.init to start the run (its default is 90 s, retried)


def format_duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eval_summary(results: dict[str, dict[str, float]]) -> str:
    return " | ".join(
        f"{split} loss {r['loss']:.4f} ppl {r['perplexity']:.2f}" + (f" bpb {r['bits_per_byte']:.3f}"
                                                                   if "bits_per_byte" in r else "")
        for split, r in results.items()
    )


def eval_table(results: dict[str, dict[str, float]]) -> str:
    """Rows of loss per token, perplexity, nats and bits per byte (text only), and tokens, one per split."""
    per_byte = all("bits_per_byte" in r for r in results.values())
    width = max([10, *(len(s) for s in results)])
    head = f"{'split':<{width}} {'loss/token':>10} {'perplexity':>11}"
    lines = [head + (f" {'nats/byte':>10} {'bits/byte':>10}" if per_byte else "") + f" {'tokens':>10}"]
    for split, r in results.items():
        row = f"{split:<{width}} {r['loss']:>10.4f} {r['perplexity']:>11.3f}"
        if per_byte:
            row += f" {r['nats_per_byte']:>10.4f} {r['bits_per_byte']:>10.4f}"
        lines.append(row + f" {int(r['tokens']):>10,}")
    return "\n".join(lines)


class RunLogger:
    def __init__(self, cfg: Config, run_dir: Path, total_steps: int, start_step: int, active: bool,
                 wandb_id: str | None = None) -> None:
        self.active = active
        self.run_dir = run_dir
        self.wandb_run = None
        self.tb = None
        self.bar = None
        if not active:
            return
        self.metrics_file = open(run_dir / "metrics.jsonl", "a", buffering=1)
        mode = cfg.logging.progress
        if mode == "bar" or (mode == "auto" and sys.stdout.isatty()):
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, leave=True)
        if cfg.logging.tensorboard:
            self.tb = summary_writer()(logdir=str(run_dir / "tensorboard"))
        if cfg.logging.wandb != "disabled":
            self.wandb_run = _start_wandb(cfg, run_dir, wandb_id)

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def info(self, line: str) -> None:
        if not self.active:
            return
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def advance(self, steps: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(steps)

    def train(self, step: int, m: dict[str, float]) -> None:
        """`m`: loss, lr, grad_norm, tokens_per_s, ms_per_step, mfu, tokens_seen, elapsed_s, remaining_s (and z_loss,
        loss_scale, skipped_steps, statistics when present)."""
        if not self.active:
            return
        self._record(step, "train", m)
        line = (
            f"step {step:>6} | loss {m['loss']:.4f} | lr {m['lr']:.2e} | grad {m['grad_norm']:.3f} | "
            f"{m['tokens_per_s']:,.0f} tok/s | {m['ms_per_step']:.0f} ms/step | "
            f"MFU {'n/a' if m.get('mfu') is None else format(m['mfu'], '.1%')} | "
            f"{format_duration(m['elapsed_s'])} elapsed | {format_duration(m['remaining_s'])} remaining"
        )
        if "z_loss" in m:
            line += f" | z-loss {m['z_loss']:.2e}"
        if m.get("loss_scale", 1.0) != 1.0 or m.get("skipped_steps", 0):
            line += f" | loss scale {m['loss_scale']:g}, {m['skipped_steps']} skipped"
        reported = [f"{k.removeprefix('optimizer/')} {v:.3g}" for k, v in m.items()
                    if k.startswith("optimizer/") and v is not None]
        if reported:  # what the optimizer measures of itself (optimizers/reporting.py)
            line += " | " + ", ".join(reported)
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {m['loss']:.4f} | {m['tokens_per_s']:,.0f} tok/s")
        else:
            self.info(line)

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
        row = {"step": step, "split": split, "time": time.time(), **{k: _plain(v) for k, v in values.items()}}
        self.metrics_file.write(json.dumps(row) + "\n")
        # TensorBoard warns on every NaN (the first interval has no rate yet); metrics.jsonl keeps them as strings
        numbers = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
        if self.tb is not None:
            for k, v in numbers.items():
                self.tb.add_scalar(f"{split}/{k}", v, step)
        if self.wandb_run is not None:
            self.wandb_run.log({f"{split}/{k}": v for k, v in numbers.items()}, step=step)

    def close(self, hparams: dict[str, Any] | None = None, final: dict[str, float] | None = None) -> None:
        if not self.active:
            return
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            if hparams is not None and final:
                self.tb.add_hparams({k: _hparam(v) for k, v in hparams.items()},
                                    {f"hparam/{k}": v for k, v in final.items()}, name="hparams")
            self.tb.close()
        if self.wandb_run is not None:
            if final:
                self.wandb_run.summary.update(final)
            self.wandb_run.finish()
        self.metrics_file.close()


def _start_wandb(cfg: Config, run_dir: Path, run_id: str | None):
    """wandb in the configured mode. Online, a server that cannot be reached or refuses the key is known within
    WANDB_CONNECT_TIMEOUT_S + WANDB_INIT_TIMEOUT_S (wandb alone would retry for minutes and end in its own multi-line
    error): then one line, or (logging.wandb_fallback=offline) a warning and an offline run."""
    import wandb

    mode = cfg.logging.wandb
    api_key = secret("WANDB_API_KEY")
    if mode == "online" and not api_key:
        raise ConfigError(
            "config: logging.wandb=online needs WANDB_API_KEY in the environment or in .env; "
            "or use logging.wandb=offline (sync later with `wandb sync`)"
        )
    # Its notices (e.g. which credentials it uses) are not ours to print; its settings name the server (WANDB_BASE_URL).
    session = wandb.setup(settings=wandb.Settings(silent=True))
    if mode == "online":
        base_url = session.settings.base_url
        problem = _unreachable(base_url)
        if problem is None:
            try:
                return _init_wandb(cfg, run_dir, run_id, "online", api_key)
            except wandb.errors.Error as e:
                problem = f"the wandb server at {base_url} refused: {first_line(e)}"
        if cfg.logging.wandb_fallback != "offline":
            raise PipelineError(f"logging.wandb=online: {problem}; check WANDB_API_KEY and the network, or use "
                                "logging.wandb=offline, or logging.wandb_fallback=offline to log offline and `wandb "
                                "sync` later")
        warn(f"logging.wandb=online: {problem}; logging offline instead (logging.wandb_fallback=offline): upload "
             f"later with `wandb sync {run_dir / 'wandb'}/offline-run-*`")
    return _init_wandb(cfg, run_dir, run_id, "offline" if mode == "online" else mode, None)


def _init_wandb(cfg: Config, run_dir: Path, run_id: str | None, mode: str, api_key: str | None):
    import wandb

    from training.config import as_dict

    settings = wandb.Settings(api_key=api_key, silent=True, console="off", disable_git=True,
                              x_save_requirements=False, init_timeout=WANDB_INIT_TIMEOUT_S)
    return wandb.init(
        project=cfg.logging.wandb_project,
        entity=cfg.logging.wandb_entity,
        name=run_dir.name,
        id=run_id,
        resume="allow" if run_id else None,
        dir=str(run_dir),
        mode=mode,
        config=as_dict(cfg),
        settings=settings,
    )


def _unreachable(url: str) -> str | None:
    """Why the server at `url` takes no connection (no network, wrong address, refused), or None when it does."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=WANDB_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return f"cannot reach the wandb server at {url} ({e.strerror or type(e).__name__})"
    return None


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _hparam(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool)) else str(v)


def describe_run(cfg: Config, plan: RunPlan, mesh: Mesh, data: Data, model: GPT, tokenizer: Tokenizer,
                 schedule: optax.Schedule) -> list[str]:
    """The lines a run starts with: where it writes, on what, with which data, model, batch and optimizer."""
    import jax

    from models.gpt import count_params
    from training.config import context_size, schedule_steps

    devices = list(mesh.devices.flat)
    kinds = ", ".join(sorted({d.device_kind for d in devices}))
    local = sum(1 for d in devices if d.process_index == jax.process_index())
    t, m, o = cfg.train, cfg.model, cfg.optimizer
    start = ""
    if plan.resume is not None:
        start = f" | resuming {plan.resume.reader.directory} at step {plan.resume.step}"
    elif plan.init_from is not None:
        start = f" | weights from {plan.init_from.where}"
    lines = [
        f"run        {plan.run_dir}{start}",
        f"devices    {len(devices)} x {kinds} in {jax.process_count()} process(es) | mesh data={mesh.shape['data']} "
        f"x model={mesh.shape['model']} | "
        f"sharding {cfg.system.sharding} | compute {cfg.system.dtype}",
        f"data       {cfg.dataset.name} {data.summary} | tokenizer {tokenizer.kind}, {tokenizer.vocab_size} ids",
        f"model      {m.name}: {m.n_layer} layers, {m.n_head} heads, width {m.n_embd}, context {m.context_size} | "
        f"{count_params(model) / 1e6:.2f}M parameters | attention {model.cfg.attention}",
        f"batch      {data.train.global_batch} sequences/step = {t.batch_size} per process x {t.grad_accum_steps} "
        f"micro-batches x {jax.process_count()} process(es), {t.batch_size // local} per device | "
        f"{data.train.global_batch * context_size(cfg):,} tokens/step",
        f"optimizer  {o.name}, {o.lr_config.name} lr {o.lr_config.lr:g} (warmup {o.lr_config.warmup}, "
        f"first step {float(schedule(0)):.3g}) over {schedule_steps(cfg)} steps, clip {o.grad_clip:g}",
    ]
    if plan.ignored_overrides:
        lines.append(f"note       ignored {' '.join(plan.ignored_overrides)}: the saved config wins "
                     "(checkpoint.overwrite_config=True applies them)")
    return lines


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
