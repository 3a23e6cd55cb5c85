"""Shared pieces for tests: a tiny config on a small real corpus, and the pipeline's parts built from it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import warm_python

import train_jax
from training import config as config_lib
from training.checkpoints.resume import Source
from training.distributed.sharding import put_batch
from training.pipeline import build as pipeline_build

ROOT = Path(__file__).resolve().parent.parent


def xla_flags_without_device_count() -> str:
    """The suite's XLA_FLAGS (tests/conftest.py) for a process whose devices come from
    system.cpu_devices_per_process."""
    return " ".join(
        f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")
    )


def tiny_overrides(cache_dir: str, *extra: str) -> list[str]:
    """gpt2-tiny, bytes, a few dozen stdlib files per split, one device, no wandb, no plot: seconds per run."""
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
        "logging.plot=false",  # matplotlib's import and drawing: 2.4 s of each run (tests/test_end_to_end.py plots)
        f"system.compilation_cache_dir={COMPILE_CACHE or f'{cache_dir}/jax'}",
        *extra,
    ]


class Parts:
    """training/pipeline/build.py's pipeline, with a step helper that feeds the batch of a given step."""

    def __init__(self, cfg: Any, pipeline: pipeline_build.Pipeline) -> None:
        self.cfg = cfg
        self.__dict__.update(vars(pipeline))

    def step(self, step: int):
        self.state, metrics = self.train_step(self.state, put_batch(self.data.train.batch(step), self.mesh), step)
        return metrics


def build(overrides: list[str], source: Source | None = None) -> Parts:
    cfg = config_lib.load_config(overrides, jax.local_device_count())
    return Parts(cfg, pipeline_build.build(cfg, source))


# Compiled executables, shared by the suite's workers and their processes (set per session by conftest.py).
COMPILE_CACHE: str | None = None
_WARM = warm_python.WarmPython()  # this worker's, started at its first command that can be forked
# Where a test's subprocesses run unless it says otherwise (set per session by conftest.py): relative defaults such as
# `.cache/jax` or `runs/` land there, never in the checkout.
SCRATCH_CWD: Path | None = None
_started: list[subprocess.Popen | warm_python.Forked] = []  # what tests started, killed with its group at the end


def spawn(
    command: list[str], env: dict | None = None, cwd: Path | None = None, fresh: bool = False, **popen
) -> subprocess.Popen | warm_python.Forked:
    """Start `command` in its own process group (so that it and anything it starts can be killed together), with the
    checkout on PYTHONPATH and `env` over this environment (None unsets a variable); `kill_started()` ends it, at
    the latest when the test ends or times out. A `python train_jax.py`, `python -m scripts...` or `python -c ...`
    command is forked from the worker's warm Python (tests/warm_python.py) where a fork runs it as a fresh interpreter
    would, unless `fresh` (a command that checks what a fresh interpreter imports) or WARM_PYTHON=0."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    base_env = {**os.environ, "PYTHONPATH": path}
    full_env = {k: v for k, v in {**base_env, **(env or {})}.items() if v is not None}
    cwd = cwd or SCRATCH_CWD or ROOT
    proc = None
    if not fresh and os.environ.get("WARM_PYTHON", "1") != "0":
        proc = _WARM.spawn(command, full_env, base_env, cwd, **popen)
    if proc is None:
        proc = subprocess.Popen(command, env=full_env, cwd=cwd, start_new_session=True, **popen)
    _started.append(proc)
    return proc


def kill_started() -> None:
    """Kill the process group of every process started with `spawn` (those still running, and whatever they left)."""
    while _started:
        proc = _started.pop()
        for kill in (os.killpg, os.kill):  # the group; the process itself if it has left its group
            try:
                kill(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def communicate(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Wait for `proc` and collect its output; past `timeout`, kill its group and raise."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(map(str, proc.args))} ran past {timeout} s; killed.\n{(err or '')[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_cli(
    args: list[str],
    timeout: float = 300,
    env: dict | None = None,
    cwd: Path | None = None,
    module: str = "train_jax",
    preexec_fn: Any = None,
) -> subprocess.CompletedProcess:
    """`python -m <module> args...` in a fresh Python process, as a user would run train_jax.py or a tool in
    scripts/ (`preexec_fn`: set limits in the child)."""
    command = [str(ROOT / "train_jax.py")] if module == "train_jax" else ["-m", module]
    proc = spawn(
        [sys.executable, *command, *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    return communicate(proc, timeout)


def run_in_process(args: list[str], capsys: Any) -> subprocess.CompletedProcess:
    """`train_jax.command_line(args)` in this process, with its exit code and what it printed, shaped like `run_cli`'s
    result: for a command that fails before it trains, trains nothing or continues a few steps, where a new
    interpreter would add its 2-3 s of imports. Output written below Python (XLA's, absl's) does not reach `capsys`:
    keep each family's first case in `run_cli`."""
    code = train_jax.command_line(args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["train_jax.py", *args], code, out, err)


def run_command(args: list[str], capsys: Any, own_process: bool, **cli: Any) -> subprocess.CompletedProcess:
    """`train_jax.py args` in a process of its own (`run_cli`, given `cli`) or in this one (`run_in_process`): the
    cases of one kind of bad input share their assertions, and each kind keeps a case in a real process."""
    return run_cli(args, **cli) if own_process else run_in_process(args, capsys)


def script_in_process(module: str, args: list[str], monkeypatch: Any, capsys: Any) -> subprocess.CompletedProcess:
    """`python -m <module> args...` (a tool in scripts/) in this process (`__main__`, with its own sys.argv), shaped
    like `run_cli`'s result: where a new interpreter would add its 2-3 s of imports (the same caveat as
    `run_in_process` for output written below Python)."""
    import runpy

    monkeypatch.setattr(sys, "argv", [module, *args])  # runpy puts the module's file first, as `python -m` does
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)  # as the interpreter does
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", module, *args], code, out, err)


def repo_copy(dest: Path) -> Path:
    """A copy of the checkout's files (tracked, and untracked ones git does not ignore) at `dest`: for tests that add
    files to the project as a user would, which must never write into the checkout."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # a file deleted in the working tree is still listed until the change is staged
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def read_metrics(run_dir: Path, split: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if split is None or r["split"] == split]


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """train_jax.py in the background (stdout and stderr piped), for tests that signal or kill it."""
    return spawn(
        [sys.executable, str(ROOT / "train_jax.py"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "metrics.jsonl").exists() and any(r["step"] >= step for r in read_metrics(run_dir, "train")):
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    raise TimeoutError(f"no step {step} within {timeout} s")
