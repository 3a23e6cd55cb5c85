"""The console: a run's lines on stdout, or a tqdm progress bar that the lines print above (`logging.progress`), and
how a training step, an evaluation, a duration and the run's opening lines read there."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optax
    from jax.sharding import Mesh

    from data import Data
    from data.tokenizers import Tokenizer
    from models.gpt import GPT
    from training.checkpoints.resume import RunPlan
    from training.config import Config


class Console:
    def __init__(self, progress: str, total_steps: int, start_step: int) -> None:
        self.bar = None
        if progress == "bar" or (progress == "auto" and sys.stdout.isatty()):
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, leave=True)

    def info(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def advance(self, steps: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(steps)

    def train(self, step: int, m: dict[str, float]) -> None:
        """A training step's line, or (with the bar) its loss and throughput beside the bar."""
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {m['loss']:.4f} | {_measured(m['tokens_per_s'], ',.0f')} tok/s")
        else:
            self.info(train_line(step, m))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train_line(step: int, m: dict[str, float]) -> str:
    line = (
        f"step {step:>6} | loss {m['loss']:.4f} | lr {m['lr']:.2e} | grad {m['grad_norm']:.3f} | "
        f"{_measured(m['tokens_per_s'], ',.0f')} tok/s | {_measured(m['ms_per_step'], '.0f')} ms/step | "
        f"MFU {'n/a' if m.get('mfu') is None else format(m['mfu'], '.1%')} | "
        f"{format_duration(m['elapsed_s'])} elapsed | {format_duration(m['remaining_s'])} remaining"
    )
    if "z_loss" in m:
        line += f" | z-loss {m['z_loss']:.2e}"
    if m.get("loss_scale", 1.0) != 1.0 or m.get("skipped_steps", 0):
        line += f" | loss scale {m['loss_scale']:g}, {m['skipped_steps']} skipped"
    if "fp8_clipped" in m:  # system.dtype=fp8: tensors that outgrew their scale's range in the interval's steps
        kinds = ", ".join(f"{k.removeprefix('fp8_clipped/')} {v}" for k, v in m.items() if k.startswith("fp8_clipped/"))
        line += f" | fp8 clipped {m['fp8_clipped']} ({kinds}), amax {m['fp8_amax_over_range']:.2f}x range"
    reported = [
        f"{k.removeprefix('optimizer/')} {v:.3g}" for k, v in m.items() if k.startswith("optimizer/") and v is not None
    ]
    if reported:  # what the optimizer measures of itself (optimizers/reporting.py)
        line += " | " + ", ".join(reported)
    return line


def _measured(value: float, spec: str) -> str:
    """A rate the clock measured, or `-` where it has none: the interval of the first step, which compiled, is not
    timed (the same NaN metrics.jsonl keeps)."""
    return format(value, spec) if math.isfinite(value) else "-"


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-:--:--"  # not known yet
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eval_summary(results: dict[str, dict[str, float]]) -> str:
    return " | ".join(
        f"{split} loss {r['loss']:.4f} ppl {r['perplexity']:.2f}"
        + (f" bpb {r['bits_per_byte']:.3f}" if "bits_per_byte" in r else "")
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


def describe_run(
    cfg: Config, plan: RunPlan, mesh: Mesh, data: Data, model: GPT, tokenizer: Tokenizer, schedule: optax.Schedule
) -> list[str]:
    """The lines a run starts with: where it writes, on what, with which data, model, batch and optimizer."""
    import jax

    from models.gpt import count_params
    from optimizers.schedules import warmup_steps
    from training.config import context_size, schedule_steps
    from training.config.stages import plan_stages

    devices = list(mesh.devices.flat)
    kinds = ", ".join(sorted({d.device_kind for d in devices}))
    stages = plan_stages(cfg)
    first_stage_lr = stages[0].lr_multiplier  # train.stages' multiplier, which the train step applies
    t, m, o = cfg.train, cfg.model, cfg.optimizer
    start = ""
    if plan.resume is not None:
        start = f" | resuming {plan.resume.reader.directory} at step {plan.resume.step}"
        if plan.resume.step >= t.max_steps:  # a finished run: it trains nothing and reports its checkpoint
            start += (
                " = train.max_steps: nothing left to train (a longer run: checkpoint.overwrite_config=True "
                "train.max_steps=N)"
            )
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
        f"batch      {data.train.global_batch} sequences/step = {data.train.batch_size} per process x "
        f"{t.grad_accum_steps} micro-batches x {jax.process_count()} process(es), "
        f"{data.train.batch_size * jax.process_count() // mesh.shape['data']} per device | "
        f"{data.train.global_batch * context_size(cfg):,} tokens/step",
        f"optimizer  {o.name}, {o.lr_config.name} lr {o.lr_config.lr:g} (warmup "
        f"{warmup_steps(o.lr_config, schedule_steps(cfg))}, "
        f"first step {float(schedule(0)) * first_stage_lr:.3g}) over {schedule_steps(cfg)} steps, clip {o.grad_clip:g}",
    ]
    if t.stages:
        lines.append("stages     " + " | ".join(stage_line(s) for s in stages))
    if note := ignored_note(plan):
        lines.append(note)
    return lines


def ignored_note(plan: RunPlan) -> str | None:
    """The overrides a resumed or evaluated checkpoint's saved config left unused, as one line; None when none."""
    if not plan.ignored_overrides:
        return None
    return (
        f"note       ignored {' '.join(plan.ignored_overrides)}: the saved config wins "
        "(checkpoint.overwrite_config=True applies them)"
    )


def stage_line(stage) -> str:
    """One stage of train.stages, for the start of the log: where it starts, its batch, window and lr multiplier."""
    window = "" if stage.attention_window is None else f", window {stage.attention_window}"
    return f"from step {stage.first_step}: {stage.batch_size} per process{window}, lr x {stage.lr_multiplier:g}"
