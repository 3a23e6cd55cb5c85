"""scripts/benchmarks/bench_peer.py: what it refuses, in one line, before it starts anything; and our side's worker.
nanoGPT's side needs the user's nanoGPT checkout (never shipped here) and a GPU, so no test runs it."""

from __future__ import annotations

import io
import json
import math
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import communicate, script_in_process, spawn

MODULE = "scripts.benchmarks.bench_peer"


def nanogpt_lookalike(tmp_path: Path) -> Path:
    """A folder that passes the path check (it has a model.py); nothing ever imports it."""
    (tmp_path / "nanoGPT").mkdir()
    (tmp_path / "nanoGPT" / "model.py").write_text("")
    return tmp_path / "nanoGPT"


def no_gpu_path(tmp_path: Path, nvidia_smi: str | None) -> str:
    """A PATH with only a stand-in nvidia-smi (a shell script), or none."""
    folder = tmp_path / "bin"
    folder.mkdir()
    if nvidia_smi is not None:
        (folder / "nvidia-smi").write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        (folder / "nvidia-smi").chmod(0o755)
    return str(folder)


def refused(args: list[str], monkeypatch, capsys) -> str:
    """The script's one stderr line, after it exits 2 having printed nothing else."""
    result = script_in_process("scripts.benchmarks.bench_peer", args, monkeypatch, capsys)
    assert result.returncode == 2 and result.stdout == "", result
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
    return result.stderr


def test_without_a_nanogpt_path_it_names_the_flag(monkeypatch, capsys):
    assert "--nanogpt PATH is required" in refused(["--model", "gpt2", "--batch", "8"], monkeypatch, capsys)


def test_a_path_without_model_py_is_named(tmp_path, monkeypatch, capsys):
    line = refused(["--nanogpt", str(tmp_path)], monkeypatch, capsys)
    assert f"--nanogpt {tmp_path}: no model.py there" in line


def test_bad_options_are_one_line(tmp_path, monkeypatch, capsys):
    path = str(nanogpt_lookalike(tmp_path))
    assert "--model gpt3: no such preset" in refused(["--nanogpt", path, "--model", "gpt3"], monkeypatch, capsys)
    assert "--steps must be at least 1" in refused(["--nanogpt", path, "--steps", "0"], monkeypatch, capsys)
    assert "--vocab must be at least 1" in refused(["--nanogpt", path, "--vocab", "0"], monkeypatch, capsys)
    assert "unrecognized arguments: --bogus" in refused(["--nanogpt", path, "--bogus"], monkeypatch, capsys)


@pytest.mark.parametrize(
    "nvidia_smi, visible, says",
    [
        (None, None, "nvidia-smi is not on PATH"),
        ("exit 9", None, "`nvidia-smi -L` lists none (exit 9)"),
        ("echo 'No devices were found'", None, "`nvidia-smi -L` lists none (exit 0)"),
        ("echo 'GPU 0: NVIDIA H100 (UUID: GPU-0)'", "", "CUDA_VISIBLE_DEVICES hides every GPU"),
    ],
)
def test_without_a_gpu_it_says_so_before_starting_a_worker(tmp_path, monkeypatch, capsys, nvidia_smi, visible, says):
    monkeypatch.setenv("PATH", no_gpu_path(tmp_path, nvidia_smi))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    line = refused(["--nanogpt", str(nanogpt_lookalike(tmp_path))], monkeypatch, capsys)
    assert line.startswith("error: no ") and says in line


def test_the_parent_imports_neither_jax_nor_torch(tmp_path):
    """Either library, started in the parent, could take the GPU the workers are timed on."""
    check = (
        "import runpy, sys\n"
        f"sys.argv = [{MODULE!r}, '--nanogpt', {str(nanogpt_lookalike(tmp_path))!r}]\n"
        "try:\n"
        f"    runpy.run_module({MODULE!r}, run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    print(e.code, sorted(m for m in ('jax', 'torch', 'numpy') if m in sys.modules))\n"
    )
    proc = spawn(
        [sys.executable, "-c", check],
        env={"PATH": no_gpu_path(tmp_path, None)},
        fresh=True,  # what the parent imports: a fork of the warm Python has imported jax already
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = communicate(proc, timeout=60)
    assert result.stdout.split("\n")[0] == "2 []", result
    assert "no NVIDIA GPU" in result.stderr


def test_our_worker_answers_each_command_with_a_json_line():
    """The worker's protocol on the CPU, in this process: ready (with the shape nanoGPT's side is built to), the
    times of `run N`, an error for anything else; `quit` ends it."""
    bench_peer = runpy.run_module(MODULE)
    args = bench_peer["parse"](
        [
            "--worker",
            "ours",
            "--device",
            "cpu",
            "--model",
            "gpt2-tiny",
            "--batch",
            "2",
            "--context",
            "16",
            "--warmup",
            "1",
        ]
    )
    replies = io.StringIO()
    bench_peer["ours"](args, io.StringIO("run 2\nwalk 2\nquit\nrun 1\n"), replies)
    ready, ran, error = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert ready["ready"] and ready["compile_s"] > 0 and ready["dtype"] == "float32"
    assert {k: ready["shape"][k] for k in ("n_layer", "n_embd", "context", "vocab", "tokens", "batch")} == {
        "n_layer": 2,
        "n_embd": 64,
        "context": 16,
        "vocab": 50304,
        "tokens": 50257,
        "batch": 2,
    }
    assert len(ran["times"]) == 2 and all(t > 0 for t in ran["times"])
    assert abs(ran["loss"] - math.log(50257)) < 1.0  # random tokens, a fresh model
    assert error == {"error": "unknown command 'walk 2'"}
