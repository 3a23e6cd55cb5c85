"""The suite's warm Python (tests/warm_python.py): a command it forks behaves as the same command in a fresh
interpreter: output, exit code, process group, signals, environment; what a fork cannot give runs fresh."""

import os
import signal
import subprocess
import sys

import pytest
import warm_python

from helpers import ROOT, communicate, spawn, tiny_overrides

TRAIN_JAX = str(ROOT / "train_jax.py")


@pytest.fixture(autouse=True)
def warm(monkeypatch):
    """These tests are about the warm Python: on, whatever WARM_PYTHON says for the rest of the suite."""
    monkeypatch.setenv("WARM_PYTHON", "1")


def both(command: list[str], **env) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """`command` in a fresh interpreter and forked by the warm Python."""
    runs = []
    for fresh in (True, False):
        proc = spawn(command, env=env, fresh=fresh, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert isinstance(proc, subprocess.Popen if fresh else warm_python.Forked)
        runs.append(communicate(proc, 120))
    return runs[0], runs[1]


@pytest.mark.parametrize(
    "command",
    [
        [TRAIN_JAX, "--cfg", "job", "model=gpt2-tiny", "train.batch_size=3"],
        [TRAIN_JAX, "model=gpt2-tiny", "train.batch_size=banana"],
        ["-m", "scripts.tools.compare_runs", "/nonexistent/sweep"],
        ["-m", "scripts.tools.no_such_tool"],
        ["-c", "import sys, train_jax; print(__name__, sys.argv, repr(sys.path[0])); sys.exit(3)", "a", "b=1"],
        ["-c", "import json\n\ndef f():\n    return json.loads('{')\n\nf()"],
    ],
    ids=["cfg", "bad-config", "tool", "no-module", "code", "code-raises"],
)
def test_a_forked_command_prints_and_exits_as_a_fresh_one(command):
    fresh, forked = both([sys.executable, *command])
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.stdout or fresh.stderr


def test_a_forked_command_reads_its_own_environment_when_jax_starts():
    proc = spawn(
        [sys.executable, TRAIN_JAX, "model=gpt2-tiny", "system.num_devices=16", "logging.wandb=disabled"],
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
        stderr=subprocess.PIPE,
        text=True,
    )
    assert isinstance(proc, warm_python.Forked)
    done = communicate(proc, 120)
    assert done.returncode == 2 and "system.num_devices: 16 must be in [1, 2]" in done.stderr, done.stderr


def test_a_forked_command_leads_its_own_group_and_dies_by_its_signal(data_cache, tmp_path):
    command = [sys.executable, TRAIN_JAX, *tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run")]
    proc = spawn(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert isinstance(proc, warm_python.Forked)
    assert os.getpgid(proc.pid) == proc.pid  # already when spawn returns, as with Popen(start_new_session=True)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


def test_what_a_fork_cannot_give_runs_fresh():
    cfg = [sys.executable, TRAIN_JAX, "--cfg", "job"]
    assert isinstance(spawn(cfg, env={"WANDB_MODE": "offline"}, stdout=subprocess.DEVNULL), warm_python.Forked)
    for env in ({"JAX_ENABLE_X64": "1"}, {"HF_HUB_OFFLINE": None}, {"PYTHONHASHSEED": "3"}):
        assert isinstance(spawn(cfg, env=env, stdout=subprocess.DEVNULL), subprocess.Popen), env
    assert isinstance(spawn(cfg, stdout=subprocess.DEVNULL, preexec_fn=lambda: None), subprocess.Popen)
    assert isinstance(spawn([sys.executable, "-c", "pass", "-m", "x"], stdout=subprocess.DEVNULL), warm_python.Forked)
    # `python -m` and `-c` import from the working directory first, which may hold another copy of the project
    assert isinstance(spawn([sys.executable, "-m", "scripts.tools.sample"], cwd=ROOT), subprocess.Popen)
    assert isinstance(spawn([sys.executable, "-c", "pass"], cwd=ROOT), subprocess.Popen)


def test_a_change_in_the_workers_own_environment_starts_a_new_warm_python(monkeypatch):
    """An import in the test's process may set a variable that is read at import (TF_CPP_MIN_LOG_LEVEL, say): every
    later command carries it, so the warm Python starts again with it instead of leaving them all to fresh ones."""
    for level in ("2", "3"):  # the first starts a warm Python (or finds one) with its environment
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
        proc = spawn([sys.executable, TRAIN_JAX, "--cfg", "job"], stdout=subprocess.DEVNULL)
        assert isinstance(proc, warm_python.Forked)
        assert communicate(proc, 120).returncode == 0
