"""trainit's README commands, pasted as its users paste them, on a tiny model: saving at listed steps (an unquoted list
with spaces), loading `iter_100.ckpt` with `key: value` arguments, checkpointed run segments (`checkpoint.num_steps`),
changing hyper-parameters on resume, and `log_data=false` in scripts/train_lm.sh."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import chex
import optax
import pytest

from helpers import ROOT, build, communicate, read_metrics, repo_copy, run_cli, run_in_process, spawn, tiny_overrides
from training.checkpoints.checkpointer import Checkpointer
from training.checkpoints.resume import open_source, plan_run, restore_state
from training.config import load_config

pytestmark = pytest.mark.e2e

# trainit's README, "Training Checkpoints", as printed there.
SAVE_COMMAND = """python train_jax.py \\
    checkpoint.save=True \\
    checkpoint.save_path=CHECKPOINT \\
    checkpoint.save_steps=[100, 1000, 10000] \\
    checkpoint.num_steps=null"""
# Its loading command as printed, less three line continuations it lacks (without them a shell runs four commands).
LOAD_COMMAND = """python train_jax.py \\
    checkpoint.load=True \\
    checkpoint.load_path=CHECKPOINT \\
    checkpoint.load_file=iter_100.ckpt \\
    checkpoint.overwrite_config: False \\
    checkpoint.overwrite_optimizer: False"""
STEPS = 104


def tiny(data_cache, *extra):
    # 2 sequences a step: 104 steps of 8 would cost three times as much, for nothing these tests check
    return tiny_overrides(
        data_cache,
        f"train.max_steps={STEPS}",
        "train.eval_interval=52",
        "train.log_interval=4",
        "train.batch_size=2",
        *extra,
    )


def in_shell(command, extra, cwd):
    """`command` run by bash in `cwd`, as a user's shell splits it, with `extra` arguments after it."""
    line = command.replace("python train_jax.py", f"{shlex.quote(sys.executable)} {ROOT / 'train_jax.py'}", 1)
    proc = spawn(
        ["bash", "-c", f"{line} {shlex.join(extra)}"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return communicate(proc, timeout=300)


def ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def train_losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory, data_cache):
    """The save command: 104 steps into ./CHECKPOINT, step 100 kept because the list names it."""
    cwd = tmp_path_factory.mktemp("trainit")
    result = ok(in_shell(SAVE_COMMAND, tiny(data_cache, f"logging.run_dir={cwd}/run"), cwd))
    return cwd, result


def test_the_save_command_saves_at_the_listed_steps(saved):
    cwd, result = saved
    assert (cwd / "CHECKPOINT" / "100").is_dir() and (cwd / "CHECKPOINT" / str(STEPS)).is_dir()
    assert json.loads((cwd / "run" / "summary.json").read_text())["checkpoints"]["steps"] == [52, 100, STEPS]
    assert load_config(["checkpoint.save_steps=[100, 1000, 10000]"]).checkpoint.save_steps == [100, 1000, 10000]


def test_the_load_command_resumes_iter_100_under_the_saved_config(saved, data_cache):
    """overwrite_config False: the saved config wins (the command line's train.max_steps=8 is ignored, and named);
    overwrite_optimizer False: the optimizer state continues, so steps 101-104 repeat the first run's bit for bit."""
    cwd, _ = saved
    result = ok(in_shell(LOAD_COMMAND, tiny_overrides(data_cache, f"logging.run_dir={cwd}/again"), cwd))
    assert f"resuming {cwd}/CHECKPOINT at step 100" in result.stdout
    assert "ignored" in result.stdout and "train.max_steps=8" in result.stdout
    first, again = train_losses(cwd / "run"), train_losses(cwd / "again")
    assert sorted(again) == [STEPS] and again[STEPS] == first[STEPS]  # one log interval: steps 101-104
    assert read_metrics(cwd / "again", "val")[-1]["loss"] == read_metrics(cwd / "run", "val")[-1]["loss"]


def test_new_hyper_parameters_keep_the_optimizer_state(saved, data_cache):
    """trainit: to change the lr or momentum, keep overwrite_optimizer=False and turn on overwrite_config: the
    restored optimizer state continues (its moments and its step), and the new schedule applies from that step."""
    cwd, _ = saved
    overrides = tiny(
        data_cache,
        "checkpoint.load=True",
        f"checkpoint.load_path={cwd}/CHECKPOINT",
        "checkpoint.load_file=iter_100.ckpt",
        "checkpoint.overwrite_config=True",
        "optimizer.lr_config.lr=1e-4",
        "optimizer.lr_config.min_lr_ratio=0.1",
        "optimizer.beta1=0.5",
    )
    parts = build(overrides)
    plan = plan_run(load_config(overrides), overrides, 0)
    state = restore_state(parts.state, plan)
    checkpointed = open_source(f"{cwd}/CHECKPOINT", "100").reader.restore(100, parts.state)
    chex.assert_trees_all_equal(state.opt_state, checkpointed.opt_state)
    assert int(optax.tree.get(state.opt_state, "lr_step")) == 100 and plan.cfg.optimizer.beta1 == 0.5
    parts.state = state
    applied = float(parts.step(100)["lr"])
    assert applied == pytest.approx(float(parts.schedule(100))) and 1e-5 <= applied < 2e-5  # the new cosine's tail


@pytest.mark.gpu
@pytest.mark.deterministic
def test_num_steps_trains_segments_that_add_up_to_the_uninterrupted_run(finished, data_cache, tmp_path):
    """checkpoint.num_steps: each invocation trains that many steps from where it starts, evaluates and checkpoints
    at its end, and the next continues; the schedule spans train.max_steps, so the losses match a run never split.
    Both invocations are the same command with `checkpoint.load=auto`: the first finds no run and starts fresh, the
    second continues where the first stopped (every step logged once)."""
    split = tmp_path / "split"
    command = tiny_overrides(data_cache, f"logging.run_dir={split}", "checkpoint.load=auto", "checkpoint.num_steps=5")
    first = ok(run_cli(command))
    assert "resuming" not in first.stdout
    assert "segment    checkpoint.num_steps=5: steps 1 to 5 of train.max_steps=8" in first.stdout
    assert "trained checkpoint.num_steps=5 steps, to step 5 of train.max_steps=8" in first.stdout
    assert f"checkpoint saved to {split / 'checkpoints'}, the same command continues" in first.stdout
    assert json.loads((split / "summary.json").read_text())["stopped"] == "checkpoint.num_steps"
    assert max(train_losses(split)) == 5 and (split / "checkpoints" / "5").is_dir()
    first_trained = json.loads((split / "summary.json").read_text())["time_trained_s"]
    second = ok(run_cli(command))
    assert f"resuming {split}/checkpoints at step 5" in second.stdout
    summary = json.loads((split / "summary.json").read_text())
    assert summary["stopped"] == "max_steps"  # 5 more would pass step 8
    assert summary["time_trained_s"] > first_trained  # both segments' training time
    assert [r["step"] for r in read_metrics(split, "train")] == list(range(1, 9))
    # elapsed_s is the run's clock: it began again at 0 with the second segment (time to a target loss read from it
    # undercounted a resumed run)
    elapsed = {r["step"]: r["elapsed_s"] for r in read_metrics(split, "train")}
    first_wall = Checkpointer(split / "checkpoints", read_only=True).read_meta(5)["wall_time_s"]
    assert elapsed[5] <= first_wall < elapsed[6] < elapsed[8] <= summary["wall_time_s"] + 0.05
    want, got = train_losses(finished), train_losses(split)  # `finished`: the same run, never split
    assert [got[s] for s in range(1, 9)] == [want[s] for s in range(1, 9)]


def test_a_segment_names_the_command_that_continues_it_and_that_command_does(data_cache, tmp_path, capsys, monkeypatch):
    """The line said `checkpoint.load=True continues`, which then asked for checkpoint.load_path."""
    command = tiny_overrides(data_cache, f"logging.run_dir={tmp_path}", "checkpoint.num_steps=4")
    first = run_in_process(command, capsys)
    said = f"checkpoint saved to {tmp_path / 'checkpoints'}, the same command with checkpoint.load=auto continues"
    assert first.returncode == 0 and said in first.stdout
    assert run_in_process([*command, "checkpoint.load=auto"], capsys).returncode == 0
    assert sorted({r["step"] for r in read_metrics(tmp_path, "train")}) == list(range(1, 9))
    # a command that names no run directory gets runs/<name>-<time>: the same command again would start another
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    command = tiny_overrides(data_cache, "checkpoint.num_steps=4")
    first = run_in_process(command, capsys)
    (run_dir,) = (tmp_path / "elsewhere" / "runs").iterdir()
    said = f"the same command with logging.run_dir={run_dir} checkpoint.load=auto continues"
    assert first.returncode == 0 and said in first.stdout
    assert run_in_process([*command, f"logging.run_dir={run_dir}", "checkpoint.load=auto"], capsys).returncode == 0
    assert sorted({r["step"] for r in read_metrics(run_dir, "train")}) == list(range(1, 9))


@pytest.mark.parametrize("log_data,logged", [("false", False), ("true", True)])
def test_train_lm_sh_takes_log_data(log_data, logged, data_cache, tmp_path):
    """`bash scripts/train_lm.sh log_data=false` (trainit's switch) logs no training statistics; log_data=true logs
    the norms. The script runs whole (training, then sampling) in a copy of the project, on the tiny model."""
    project = repo_copy(tmp_path / "project")
    python = Path(sys.executable)
    env = {"PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}", "PYTHON": str(python), "PYTHONPATH": None}
    proc = spawn(
        [
            "bash",
            str(project / "scripts" / "train_lm.sh"),
            f"log_data={log_data}",
            *tiny_overrides(data_cache, "model=gpt2-tiny"),
        ],
        env=env,
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = ok(communicate(proc, timeout=280))
    run_dir = next((project / "runs").iterdir())
    rows = read_metrics(run_dir, "train")
    assert max(r["step"] for r in rows) == 8 and "training took" in result.stdout
    assert all(("param_norm" in r) == logged for r in rows)


def test_train_lm_sh_refuses_another_log_data(tmp_path):
    project = repo_copy(tmp_path)  # the script works in its own checkout: a copy, should it go on to train
    proc = spawn(
        ["bash", str(project / "scripts" / "train_lm.sh"), "log_data=maybe"],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = communicate(proc, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: log_data: must be true or false; got 'maybe'"
