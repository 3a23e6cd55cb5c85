"""Shared pieces for tests: a tiny config on a small real corpus, and the pipeline's parts built from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax

import train_jax
from training import config as config_lib
from training.run import Source
from training.sharding import put_batch

ROOT = Path(__file__).resolve().parent.parent


def tiny_overrides(cache_dir: str, *extra: str) -> list[str]:
    """gpt2-tiny, bytes, a few dozen stdlib files per split, one device, no wandb: seconds per run."""
    return [
        "model=gpt2-tiny",
        "dataset.tokenizer=byte",
        "dataset.max_documents=24",
        "dataset.num_proc=1",
        f"dataset.cache_dir={cache_dir}",
        "train.batch_size=8",
        "train.max_steps=8",
        "train.eval_interval=4",
        "train.eval_iters=2",
        "train.log_interval=1",
        "optimizer.lr_config.warmup=2",
        "system.num_devices=1",
        "logging.wandb=disabled",
        "logging.progress=lines",
        f"system.compilation_cache_dir={cache_dir}/jax",
        *extra,
    ]


class Parts:
    """train_jax.build's pipeline, with a step helper that feeds the batch of a given step."""

    def __init__(self, cfg: Any, pipeline: train_jax.Pipeline) -> None:
        self.cfg = cfg
        self.__dict__.update(vars(pipeline))

    def step(self, step: int):
        self.state, metrics = self.train_step(self.state, put_batch(self.data.train.batch(step), self.mesh))
        return metrics


def build(overrides: list[str], source: Source | None = None) -> Parts:
    cfg = config_lib.load_config(overrides)
    config_lib.validate(cfg, jax.local_device_count())
    return Parts(cfg, train_jax.build(cfg, source))


def run_cli(args: list[str], timeout: float = 300, env: dict | None = None, cwd: Path = ROOT,
            script: str = "train_jax.py", preexec_fn: Any = None) -> subprocess.CompletedProcess:
    """Run a project script in a fresh Python process, as a user would (`preexec_fn`: set limits in the child)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd, preexec_fn=preexec_fn)


def read_metrics(run_dir: Path, split: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if split is None or r["split"] == split]


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """train_jax.py in the background (stdout and stderr piped), for tests that signal or kill it."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, str(ROOT / "train_jax.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env, cwd=ROOT)


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "metrics.jsonl").exists() and any(r["step"] >= step for r in read_metrics(run_dir, "train")):
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    raise TimeoutError(f"no step {step} within {timeout} s")
