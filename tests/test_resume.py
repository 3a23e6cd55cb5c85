"""Stopping and resuming through the command line, in real subprocesses (commands that train nothing, fail before
training or continue a few steps on one device run `train_jax.command_line` in the test's process).

A run stopped at any step k (SIGTERM, kill -9, or a shorter max_steps) and resumed with `checkpoint.load=True`
produces the same losses, step by step and bit for bit, as the run that was never stopped.
"""

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

from core.errors import ConfigError
from helpers import (
    ROOT,
    build,
    communicate,
    read_metrics,
    run_cli,
    run_command,
    run_in_process,
    script_in_process,
    spawn,
    start,
    tiny_overrides,
    wait_for_step,
)
from optimizers import continue_schedule_at
from training.checkpoints.checkpointer import Checkpointer
from training.checkpoints.resume import open_source, plan_run, restore_state
from training.config import load_config
from training.pipeline.build import Pipeline
from training.reporting.logs import RunLogger

pytestmark = pytest.mark.e2e
STEPS = 40


def losses(run_dir, split="train"):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir, split)}


def config(data_cache, run_dir, *extra):
    return tiny_overrides(
        data_cache,
        f"logging.run_dir={run_dir}",
        f"train.max_steps={STEPS}",
        "train.eval_interval=10",
        "optimizer.lr_config.lr=3e-3",
        *extra,
    )


def ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_cache):
    """The reference: 40 steps, never stopped."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    ok(run_cli(config(data_cache, run_dir)))
    return run_dir


def resume_args(data_cache, run_dir, *extra):
    return tiny_overrides(data_cache, "checkpoint.load=True", f"checkpoint.load_path={run_dir}", *extra)


def resume(data_cache, run_dir, *extra):
    return run_cli(resume_args(data_cache, run_dir, *extra))


def assert_same_losses_bitwise(run_dir, reference, last=STEPS):
    """The reference's train losses up to step `last`, and its val loss there, bit for bit."""
    got, want = losses(run_dir), {s: loss for s, loss in losses(reference).items() if s <= last}
    assert set(want) <= set(got)
    # floats compared exactly: one config, so one compiled step, fed the same batches from the restored bits
    assert [got[s] for s in sorted(want)] == [want[s] for s in sorted(want)]
    assert losses(run_dir, "val")[last] == losses(reference, "val")[last]


def test_sigterm_checkpoints_exits_0_and_resumes_bitwise(straight, data_cache, tmp_path):
    """The stopped run logs to wandb (offline) and TensorBoard; both continue after the resume: the same wandb run id,
    and one TensorBoard curve."""
    run_dir = tmp_path / "run"
    proc = start(config(data_cache, run_dir, "logging.wandb=offline"))
    wait_for_step(run_dir, 3, proc)
    proc.send_signal(signal.SIGTERM)
    signalled = time.time()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert time.time() - signalled < 15
    stopped = int(out.split("stopped at step ")[1].split(" ")[0])
    assert "(SIGTERM); checkpoint saved to" in out and stopped < STEPS
    assert (run_dir / "checkpoints" / str(stopped)).is_dir()

    result = ok(resume(data_cache, run_dir, "logging.wandb=offline"))
    assert f"resuming {run_dir}/checkpoints at step {stopped}" in result.stdout
    assert_same_losses_bitwise(run_dir, straight)
    meta = json.loads((run_dir / "checkpoints" / str(STEPS) / "meta" / "metadata").read_text())
    assert meta["tokens_seen"] == STEPS * 8 * 64  # the counter continued across the restart
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))  # offline-run-<time>-<id>: one per process
    assert len(runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in runs}) == 1
    # TensorBoard: one curve across the restart (every step once, in order, the uninterrupted run's values).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), purge_orphaned_data=False)
    events.Reload()
    train = events.Scalars("train/loss")
    assert [e.step for e in train] == list(range(1, STEPS + 1))
    # TensorBoard stores the logged loss as float32: <= 6e-8 relative off the log's float64; 1e-6
    assert [e.value for e in train] == pytest.approx([losses(straight)[s] for s in range(1, STEPS + 1)], rel=1e-6)
    assert [e.step for e in events.Scalars("val/loss")] == [10, 20, 30, 40]


def test_sigint_stops_like_sigterm(data_cache, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(config(data_cache, run_dir))
    wait_for_step(run_dir, 3, proc)
    proc.send_signal(signal.SIGINT)
    result = communicate(proc, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    stopped = int(re.search(r"stopped at step (\d+) \(SIGINT\); checkpoint saved to", result.stdout).group(1))
    assert stopped < STEPS and (run_dir / "checkpoints" / str(stopped)).is_dir()


# What the loop does while a checkpoint is written (here: hangs), with the run's own signal handling.
HANGING_SAVE = """
import sys, time
sys.path.insert(0, {root!r})
from training.loop.signals import StopRequest
stop = StopRequest()
print("training", flush=True)
while not stop:
    time.sleep(0.01)
print("stopping after", stop.signal_name, flush=True)
time.sleep(120)
"""


def test_a_second_ctrl_c_aborts_at_once():
    """When the checkpoint after a first Ctrl-C is what hangs, a second one ends the process at once."""
    proc = spawn(
        [sys.executable, "-c", HANGING_SAVE.format(root=str(ROOT))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "training\n"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline() == "stopping after SIGINT\n"
    proc.send_signal(signal.SIGINT)
    result = communicate(proc, timeout=10)
    assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr


def test_the_second_ctrl_cs_interrupt_leaves_at_once_without_waiting_for_the_checkpoint(monkeypatch, capsys):
    """The second Ctrl-C's KeyboardInterrupt came out of the wait for the hanging save, and the session's exit then
    waited for the checkpointer again (its close), and the interpreter's exit for Orbax's writer threads: a third
    was needed. The process now leaves at once, exit 130; another error still waits for the save."""
    import os

    from training.loop.session import TrainingSession
    from training.loop.signals import StopRequest

    class Hanging:
        waited = 0

        def close(self):
            self.waited += 1

    def leave(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", leave)
    for error, waits in ((KeyboardInterrupt(), 0), (RuntimeError("a bug"), 1)):
        session = object.__new__(TrainingSession)  # what its exit reads
        session.prefetcher, session.lock, session.signals, session.checkpointer = None, None, StopRequest(), Hanging()
        if waits:
            session.__exit__(type(error), error, None)
        else:
            with pytest.raises(SystemExit) as left:
                session.__exit__(type(error), error, None)
            assert left.value.code == 130
            assert capsys.readouterr().err == (
                "error: interrupted again: leaving without waiting for the checkpoint being written (the last "
                "complete one stays)\n"
            )
            session.signals.uninstall()
        assert session.checkpointer.waited == waits


def test_kill_9_then_the_same_command_with_load_auto_continues_bitwise(straight, data_cache, tmp_path):
    """The preemptible-cluster case (SLURM --requeue): the job is killed without warning and the very same command
    runs again; `checkpoint.load=auto` finds the run's last complete checkpoint and continues bit for bit."""
    run_dir, steps = tmp_path / "run", STEPS // 2
    # The first half of the reference's schedule, with a checkpoint at every step (each costs more than its step)
    command = config(
        data_cache,
        run_dir,
        f"train.max_steps={steps}",
        f"optimizer.lr_config.max_steps={STEPS}",
        "checkpoint.save_steps=1",
        "checkpoint.max_to_keep=2",
        "checkpoint.load=auto",
    )
    proc = start(command)
    wait_for_step(run_dir, 8, proc)
    proc.kill()  # SIGKILL: no handler runs, an async save may be half-written
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL  # killed while it trained, not after it had finished
    killed_at = max(losses(run_dir))
    assert killed_at < steps
    result = ok(run_cli(command))
    resumed_at = int(re.search(r"resuming \S+ at step (\d+)", result.stdout).group(1))
    assert resumed_at <= killed_at  # the last complete checkpoint, then the rest trained again
    assert sorted(losses(run_dir)) == list(range(1, steps + 1))
    assert_same_losses_bitwise(run_dir, straight, last=steps)


def stopped_at(run_dir, step, dest):
    """A copy of a finished run as if it had stopped after saving `step`: later checkpoints and rows removed."""
    subprocess.run(["cp", "-r", str(run_dir), str(dest)], check=True)
    for checkpoint in (dest / "checkpoints").iterdir():
        if checkpoint.name.isdigit() and int(checkpoint.name) > step:
            subprocess.run(["rm", "-r", str(checkpoint)], check=True)
    rows = [r for r in read_metrics(dest) if r["step"] <= step]
    (dest / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


def test_resume_on_8_devices_is_bitwise_and_restores_onto_1_device(data_cache, tmp_path, capsys):
    eight = ("system.num_devices=8", "optimizer.lr_config.max_steps=12", "train.max_steps=12", "train.eval_interval=6")
    reference = tmp_path / "reference"
    ok(run_cli(config(data_cache, reference, *eight)))  # checkpoints at 6 and 12
    want = losses(reference)

    # Same layout: the second half is bit-identical to the uninterrupted run.
    same = stopped_at(reference, 6, tmp_path / "same")
    result = ok(resume(data_cache, same, "system.num_devices=8"))  # system.* is this machine's, not the saved run's
    assert f"resuming {same}/checkpoints at step 6" in result.stdout and "8 x cpu" in result.stdout
    got = losses(same)
    assert sorted(got) == list(range(1, 13)) and [got[s] for s in range(7, 13)] == [want[s] for s in range(7, 13)]

    # Saved with 8 devices, continued on 1: the same curve up to float reduction order.
    one = stopped_at(reference, 6, tmp_path / "one")
    result = ok(
        run_in_process(
            resume_args(
                data_cache,
                one,
                "checkpoint.overwrite_config=True",
                *eight,
                "system.num_devices=1",
                "optimizer.lr_config.lr=3e-3",
            ),
            capsys,
        )
    )
    assert f"resuming {one}/checkpoints at step 6" in result.stdout and "1 x cpu" in result.stdout
    got = losses(one)
    # two programs (8 devices, 1) for 6 adamw steps: sums in other orders, a few ulp of losses ~5 (~1e-6), which
    # Adam's m/sqrt(v) grows in small gradients; 1e-4 as tests/test_scale_out.py
    assert sorted(got) == list(range(1, 13)) and max(abs(got[s] - want[s]) for s in range(7, 13)) < 1e-4


def test_load_auto_in_a_run_dir_that_trained_without_a_checkpoint_sets_its_logs_aside(data_cache, tmp_path, capsys):
    """checkpoint.load=auto with no checkpoint starts afresh: in a run directory that holds a run that trained and
    saved none (killed before its first save, or checkpoint.save=false), that run's logs move to abandoned-<time>/,
    kept; they were appended to (metrics.jsonl) and overwritten (config.yaml), and summary.json spoke of the old run."""
    run_dir = tmp_path / "run"
    first = tiny_overrides(data_cache, f"logging.run_dir={run_dir}", "train.max_steps=4", "checkpoint.save=false")
    ok(run_in_process(first, capsys))
    before = {name: (run_dir / name).read_bytes() for name in ("metrics.jsonl", "summary.json", "config.yaml")}
    args = tiny_overrides(data_cache, f"logging.run_dir={run_dir}", "train.max_steps=2", "checkpoint.load=auto")
    result = ok(run_in_process(args, capsys))
    (aside,) = run_dir.glob("abandoned-*")
    assert f"checkpoint.load=auto: {run_dir} holds a run that trained and left no checkpoint" in result.stderr
    assert {name: (aside / name).read_bytes() for name in before} == before
    steps = [json.loads(row)["step"] for row in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 2 and steps == sorted(steps)  # this run's rows only
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2


def test_time_trained_and_wall_time_count_a_run_and_a_finished_run_adds_none(data_cache, tmp_path, monkeypatch, capsys):
    """time_trained_s (checkpoint metadata, summary.json) is what the steps took: an evaluation adds none of it (each
    is made SLOW here), nor does a run resumed at its end, which trains nothing (its logs made SLOW to close).
    wall_time_s is the run's, every segment's together: that rerun adds nothing to it either."""
    slow = 2.0

    def slowed(method):
        def run(*args, **kwargs):
            time.sleep(slow)
            return method(*args, **kwargs)

        return run

    monkeypatch.setattr(Pipeline, "evaluate", slowed(Pipeline.evaluate))
    run_dir = tmp_path / "run"
    args = tiny_overrides(data_cache, f"logging.run_dir={run_dir}", "train.max_steps=4", "train.eval_interval=2")
    ok(run_in_process(args, capsys))
    checkpoints = Checkpointer(run_dir / "checkpoints", read_only=True)
    trained = {step: checkpoints.read_meta(step)["time_trained_s"] for step in (2, 4)}
    assert trained[4] - trained[2] < slow  # steps 3 and 4 (compiled already), not the evaluation at step 4
    # wall_time_s: the run's, set-up and evaluations included, carried in the checkpoints
    wall = {step: checkpoints.read_meta(step)["wall_time_s"] for step in (2, 4)}
    assert wall[2] > trained[2] + slow and wall[4] > wall[2] + slow
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["wall_time_s"] >= round(wall[4], 1)
    # the summary, written after the last checkpoint, counts what came after it (here made 100 s): a rerun that
    # trains nothing keeps it (it wrote the checkpoint's figure instead, lowering it)
    (run_dir / "summary.json").write_text(json.dumps({**summary, "wall_time_s": summary["wall_time_s"] + 100}))

    monkeypatch.setattr(RunLogger, "close", slowed(RunLogger.close))
    result = ok(run_in_process(resume_args(data_cache, run_dir, "train.max_steps=4"), capsys))
    assert "nothing left to train" in result.stdout
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["time_trained_s"] == round(trained[4], 1)
    assert again["wall_time_s"] == summary["wall_time_s"] + 100  # nor is it this invocation's set-up and slow close


def test_saved_config_wins_unless_overwrite_config(straight, data_cache, tmp_path, capsys):
    subprocess.run(["cp", "-r", str(straight), str(tmp_path / "a")], check=True)
    # nothing to train (the saved max_steps was reached): in this process
    result = ok(
        run_in_process(
            resume_args(data_cache, tmp_path / "a", "optimizer.lr_config.lr=1.0", "train.max_steps=44"), capsys
        )
    )
    note = next(line for line in result.stdout.splitlines() if line.startswith("note       ignored"))
    assert "optimizer.lr_config.lr=1.0" in note and "train.max_steps=44" in note and "the saved config wins" in note
    assert note.count("train.max_steps=") == 1  # the value that ran: the command's earlier ones were listed too
    assert f"run        {tmp_path / 'a'}" in result.stdout  # a copied run continues where it now lives
    assert max(losses(tmp_path / "a")) == STEPS  # nothing to do: the saved max_steps (40) was reached

    result = ok(
        resume(
            data_cache,
            tmp_path / "a",
            "checkpoint.overwrite_config=True",
            "train.max_steps=44",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.lr=1e-4",
            "optimizer.lr_config.warmup=0",
            "train.eval_interval=10",
        )
    )
    rows = {r["step"]: r for r in read_metrics(tmp_path / "a", "train")}
    assert max(rows) == 44 and rows[44]["lr"] == pytest.approx(1e-4)  # float32 1e-4: within 1e-6 of float64's


def test_a_saved_config_that_no_longer_passes_its_checks_is_one_line(straight, data_cache, tmp_path, capsys):
    """Resuming runs the saved config.yaml: a value there that fails the checks (edited by hand, or written by a
    version with other rules) exits 2 with one line naming the key and the file, and touches nothing."""
    subprocess.run(["cp", "-r", str(straight), str(tmp_path / "a")], check=True)
    saved = tmp_path / "a" / "checkpoints" / "config.yaml"
    saved.write_text(saved.read_text().replace("  batch_size: 8\n", "  batch_size: -8\n", 1))
    before = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    result = run_in_process(resume_args(data_cache, tmp_path / "a"), capsys)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "train.batch_size" in line and f"in the saved {saved}" in line
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == before


def test_a_saved_config_resumes_with_values_a_new_run_is_refused_that_trained_as_they_were(
    finished, data_cache, tmp_path
):
    """A run that trained with the piecewise_linear preset's points past its end, or an inf clipping norm, before those
    were refused: it resumes (and evaluates) as it trained, where the new checks stopped it."""
    import yaml

    from core.errors import ConfigError

    shutil.copytree(finished, tmp_path / "a")
    saved = tmp_path / "a" / "checkpoints" / "config.yaml"
    config = yaml.safe_load(saved.read_text())
    config["optimizer"]["lr_config"].update(name="piecewise_linear", boundaries=[400, 800], boundary_lrs=[5e-4, 1e-4])
    config["optimizer"]["grad_clip"] = float("inf")
    saved.write_text(yaml.safe_dump(config))
    overrides = resume_args(data_cache, tmp_path / "a")
    plan = plan_run(load_config(overrides), overrides, 0)
    assert plan.cfg.optimizer.lr_config.boundaries == [400, 800] and plan.cfg.optimizer.grad_clip == float("inf")
    with pytest.raises(ConfigError, match=r"^config: optimizer\.lr_config\.boundaries: the last point"):
        load_config(tiny_overrides(data_cache, "optimizer/lr_config=piecewise_linear"))  # a new run: refused
    load_config([*overrides, "optimizer/lr_config=piecewise_linear"])  # a resume's command: plan_run decides


def test_overwrite_optimizer_starts_a_fresh_optimizer(straight, data_cache, tmp_path, capsys):
    subprocess.run(["cp", "-r", str(straight), str(tmp_path / "a")], check=True)
    switch = (
        "checkpoint.overwrite_config=True",
        "optimizer=sgdm",
        "optimizer.lr_config.lr=0.05",
        "train.max_steps=44",
        "train.eval_interval=10",
    )
    result = run_in_process(resume_args(data_cache, tmp_path / "a", *switch), capsys)  # fails before it trains
    assert result.returncode == 1
    assert "its opt_state does not restore" in result.stderr and "checkpoint.overwrite_optimizer=True" in result.stderr
    ok(resume(data_cache, tmp_path / "a", *switch, "checkpoint.overwrite_optimizer=True"))
    assert max(losses(tmp_path / "a")) == 44

    # What the run starts from, with the same optimizer (where a restored optimizer state would go unnoticed): the
    # checkpoint's parameters, step and key, and a fresh optimizer state whose schedule continues at the step.
    overrides = tiny_overrides(
        data_cache, "checkpoint.load=True", f"checkpoint.load_path={straight}", "checkpoint.overwrite_optimizer=True"
    )
    parts = build(overrides)
    state = restore_state(parts.state, plan_run(load_config(overrides), overrides, 0))
    saved = open_source(str(straight), "latest").reader.restore(STEPS, parts.state)
    chex.assert_trees_all_equal(
        (eqx.filter(state.model, eqx.is_array), state.step, state.key),
        (eqx.filter(saved.model, eqx.is_array), saved.step, saved.key),
    )
    chex.assert_trees_all_equal(state.opt_state, continue_schedule_at(parts.state.opt_state, STEPS))
    assert max(float(jnp.abs(mu).max()) for mu in jax.tree.leaves(optax.tree.get(saved.opt_state, "mu"))) > 0

    # The switch's command again, on a checkpoint the switched run saved (a rerun after a kill): that run's own
    # optimizer state continues (it was started afresh at every rerun, and the losses left the uninterrupted run's)
    again = tiny_overrides(
        data_cache,
        *switch,
        "checkpoint.load=True",
        f"checkpoint.load_path={tmp_path / 'a'}",
        "checkpoint.overwrite_optimizer=True",
    )
    parts = build(again)
    state = restore_state(parts.state, plan_run(load_config(again), again, 0))
    saved = open_source(str(tmp_path / "a"), "latest").reader.restore(44, parts.state)
    chex.assert_trees_all_equal(state.opt_state, saved.opt_state)
    assert max(float(jnp.abs(m).max()) for m in jax.tree.leaves(saved.opt_state)) > 0


def test_mode_eval_matches_the_training_time_evaluation(straight, data_cache, capsys):
    args = resume_args(data_cache, straight, "mode=eval", "checkpoint.load_file=latest", "train.eval_iters=6")
    result = ok(run_in_process(args, capsys))
    note = next(line for line in result.stdout.splitlines() if line.startswith("note       ignored"))
    assert "train.eval_iters=6" in note.split(":")[0] and "the saved config wins" in note  # it evaluated the saved
    report = json.loads((straight / f"eval-step{STEPS}.json").read_text())
    trained = {r["split"]: r for r in read_metrics(straight) if r["step"] == STEPS and r["split"] != "train"}
    for split, row in trained.items():
        assert report["results"][split]["loss"] == row["loss"]  # exactly: one eval step, the same weights and batches
    assert "test" in report["results"] and "test " in result.stdout
    # another evaluation's settings (overwrite_config: fewer batches) never replace it: a file of its own
    first = (straight / f"eval-step{STEPS}.json").read_bytes()
    other = ok(run_in_process([*args, "checkpoint.overwrite_config=True", "train.eval_iters=1"], capsys))
    written = Path(other.stdout.strip().splitlines()[-1].removeprefix("written to "))
    assert written.parent == straight and re.fullmatch(rf"eval-step{STEPS}-[0-9a-f]{{8}}\.json", written.name)
    assert json.loads(written.read_text())["settings"]["eval_iters"] == 1
    assert (straight / f"eval-step{STEPS}.json").read_bytes() == first


def test_best_checkpoint_can_be_named(straight, data_cache, tmp_path, monkeypatch, capsys):
    """A run whose last evaluation is not its best: `--which best` and checkpoint.load_file=best take the best."""
    run_dir = tmp_path / "a"
    subprocess.run(["cp", "-r", str(straight), str(run_dir)], check=True)
    ok(
        resume(
            data_cache,
            run_dir,
            "checkpoint.overwrite_config=True",
            "train.max_steps=44",
            "train.eval_interval=10",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.lr=0.03",
            "optimizer.lr_config.warmup=0",
        )
    )
    vals = losses(run_dir, "val")
    best_step = min(vals, key=vals.get)
    assert max(vals) == 44 and best_step != 44  # the last evaluation, after steps at a far too high lr, is worse
    result = ok(
        script_in_process(
            "scripts.tools.sample", [str(run_dir), "--which", "best", "--max-new-tokens", "5"], monkeypatch, capsys
        )
    )
    assert f"step {best_step}," in result.stdout
    assert open_source(str(run_dir), "best").step == best_step  # what checkpoint.load_file=best loads


def test_a_resume_from_an_older_step_sets_the_later_checkpoints_aside_and_saves_its_own(
    finished, data_cache, tmp_path, capsys
):
    """Resuming a run in its own save path from step 4 when it holds step 8 (checkpoint.load_file=<step> or best, or
    past a damaged newest step) trains steps 5-8 again: the old step 8 is renamed out of the way, kept, and the run
    saves its own step 8, which the next resume then takes."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    new_lr = "optimizer.lr_config.lr=1e-4"
    args = resume_args(data_cache, run_dir, "checkpoint.load_file=4", "checkpoint.overwrite_config=True", new_lr)
    result = ok(run_in_process(args, capsys))
    assert f"resuming {run_dir}/checkpoints at step 4" in result.stdout
    (aside,) = (run_dir / "checkpoints").glob("8.superseded-*")
    assert f"warning: checkpoint: step 8 is past the resumed step 4; kept as {aside}" in result.stderr

    def lr_saved(directory, step):
        meta = Checkpointer(directory, read_only=True).read_meta(step)
        return meta["config"]["optimizer"]["lr_config"]["lr"]

    assert lr_saved(run_dir / "checkpoints", 8) == 1e-4  # this run's step 8, not the one it resumed before
    aside.rename(tmp_path / "8")  # the old step 8, whole, under its own name
    assert lr_saved(tmp_path, 8) == lr_saved(finished / "checkpoints", 8) != 1e-4
    assert open_source(str(run_dir), "latest").meta["config"]["optimizer"]["lr_config"]["lr"] == 1e-4
    again = ok(run_in_process(resume_args(data_cache, run_dir), capsys))  # now finished: the first line says so
    assert f"resuming {run_dir}/checkpoints at step 8 = train.max_steps: nothing left to train" in again.stdout


def test_a_resume_from_an_older_step_sets_the_later_rows_aside_so_the_summary_is_this_runs(
    finished, data_cache, tmp_path, capsys
):
    """Resumed at step 4 of a run that had reached 8, and stopped at 6: summary.json said 8 steps and a final val
    loss at step 8, from the rows of the steps this run trained again and of those it never reached."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = [json.loads(line) for line in open(finished / "metrics.jsonl")]
    args = resume_args(data_cache, run_dir, "checkpoint.load_file=4", "checkpoint.overwrite_config=True")
    ok(run_in_process([*args, "train.max_steps=6"], capsys))
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert max(r["step"] for r in rows) == 6
    assert [r for r in rows if r["step"] <= 4] == [r for r in before if r["step"] <= 4]
    (aside,) = run_dir.glob("metrics.superseded-*.jsonl")
    assert [json.loads(line) for line in open(aside)] == [r for r in before if r["step"] > 4]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["splits"]["val"]["final_step"] == 6


def test_load_auto_continues_its_own_newest_checkpoint_whatever_load_file_names(finished, data_cache, tmp_path, capsys):
    """finetune_piano.sh's `checkpoint.load_file=best` names the pretrained run's checkpoint to start from; rerun
    with checkpoint.load=auto, the fine-tune went back to its own best step and trained the steps after it again."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    args = tiny_overrides(data_cache, "checkpoint.load=auto", "checkpoint.load_file=4", f"logging.run_dir={run_dir}")
    result = ok(run_in_process(args, capsys))
    assert f"resuming {run_dir}/checkpoints at step 8 = train.max_steps: nothing left to train" in result.stdout
    assert not list((run_dir / "checkpoints").glob("8.superseded-*"))


def test_a_resume_into_another_run_directory_is_a_branch_that_saves_there_and_leaves_the_resumed_run_alone(
    finished, data_cache, tmp_path, capsys
):
    """checkpoint.load_path=A logging.run_dir=B: B's run starts at A's step and saves in B. It saved beside A's
    checkpoints, where its retention deleted A's steps 4 and 8 and its config.yaml replaced A's."""
    source, branch = tmp_path / "source", tmp_path / "branch"
    shutil.copytree(finished, source)
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    args = resume_args(data_cache, source, f"logging.run_dir={branch}", "checkpoint.overwrite_config=True")
    result = ok(run_in_process([*args, "train.max_steps=12", "checkpoint.max_to_keep=1"], capsys))
    assert f"run        {branch} | resuming {source}/checkpoints at step 8" in result.stdout
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before
    assert Checkpointer(branch / "checkpoints", read_only=True).steps() == [12]
    assert {row["step"] for row in map(json.loads, open(branch / "metrics.jsonl"))} == set(range(9, 13))

    # a branch killed before its first checkpoint: rerun with load=auto, it starts again from the same checkpoint,
    # its logs set aside (it was refused, with a fix, continuing the branch's checkpoints, that could not work)
    again = tmp_path / "again"
    again.mkdir()
    (again / "metrics.jsonl").write_text(json.dumps({"step": 9, "split": "train", "loss": 4.0}) + "\n")
    args = [a.replace("checkpoint.load=True", "checkpoint.load=auto") for a in args]
    ok(run_in_process([*args, f"logging.run_dir={again}", "train.max_steps=12"], capsys))
    (aside,) = again.glob("abandoned-*")
    assert (aside / "metrics.jsonl").read_text().count("\n") == 1
    assert Checkpointer(again / "checkpoints", read_only=True).steps() == [12]
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before


def test_load_auto_continues_its_own_checkpoints_before_load_path_and_a_missing_load_path_is_one_line(
    finished, data_cache, tmp_path, capsys
):
    """A requeueable run that starts from another run's checkpoint (`checkpoint.load=auto checkpoint.load_path=A`,
    saving elsewhere): its first invocation starts from A, and the same command rerun continues its own checkpoints,
    not A's again. A load_path that is not there is one line, not a silent fresh start."""
    source, run_dir = tmp_path / "source", tmp_path / "run"
    shutil.copytree(finished, source)
    command = tiny_overrides(
        data_cache,
        "checkpoint.load=auto",
        f"checkpoint.load_path={source}",
        f"checkpoint.save_path={run_dir / 'checkpoints'}",
        f"logging.run_dir={run_dir}",
        "checkpoint.overwrite_config=True",
        "train.max_steps=12",
        "checkpoint.num_steps=2",
    )
    first = ok(run_in_process(command, capsys))
    assert f"resuming {source}/checkpoints at step 8" in first.stdout
    second = ok(run_in_process(command, capsys))
    assert f"resuming {run_dir}/checkpoints at step 10" in second.stdout
    assert Checkpointer(run_dir / "checkpoints", read_only=True).steps()[-1] == 12

    missing = tmp_path / "nope"
    result = run_in_process(
        tiny_overrides(
            data_cache, "checkpoint.load=auto", f"checkpoint.load_path={missing}", f"logging.run_dir={tmp_path / 'x'}"
        ),
        capsys,
    )
    assert result.returncode != 0 and result.stderr.strip() == f"error: checkpoint.load_path: {missing} does not exist"
    assert not (tmp_path / "x").exists()


def test_a_resumed_run_keeps_its_saved_dtype_and_wandb_mode_unless_the_command_names_them(
    finished, data_cache, tmp_path
):
    """system.* describes the machine and comes from the command line on resume, but for what the experiment
    computes in: a run saved in bfloat16 resumes in bfloat16 (the command line's default is float32), and in
    float32 only when the command says so; its FP8 scaling likewise."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    saved = run_dir / "checkpoints" / "config.yaml"
    text = saved.read_text()
    assert "  dtype: float32\n" in text and "  fp8_margin: 0\n" in text
    saved.write_text(text.replace("  dtype: float32\n", "  dtype: bfloat16\n").replace("margin: 0", "margin: 2"))

    def planned(*extra):
        overrides = resume_args(data_cache, run_dir, *extra)
        return plan_run(load_config(overrides), overrides, 0).cfg.system

    system = planned("system.num_devices=1")
    assert (system.dtype, system.fp8_margin) == ("bfloat16", 2)
    system = planned("system.dtype=float32", "system.fp8_margin=1")
    assert (system.dtype, system.fp8_margin) == ("float32", 1)
    # where it is tracked, likewise: saved with wandb disabled, resumed by a command that does not name it (whose
    # default is offline) -> still disabled
    overrides = [o for o in resume_args(data_cache, run_dir) if not o.startswith("logging.wandb")]
    assert load_config(overrides).logging.wandb == "offline"
    assert plan_run(load_config(overrides), overrides, 0).cfg.logging.wandb == "disabled"


def test_a_run_directory_under_the_home_is_the_homes(data_cache, tmp_path, monkeypatch):
    """`logging.run_dir=~/runs/x` (quoted, so no shell expanded it) and `checkpoint.save_path=~/...` name the home's
    folders, as the writability check reads them, not a folder named `~` in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    overrides = tiny_overrides(data_cache, 'logging.run_dir="~/runs/x"')
    plan = plan_run(load_config(overrides), overrides, 0)
    assert (plan.run_dir, plan.save_path) == (tmp_path / "home/runs/x", tmp_path / "home/runs/x/checkpoints")
    overrides = tiny_overrides(data_cache, 'logging.run_dir="~/runs/y"', 'checkpoint.save_path="~/saved"')
    assert plan_run(load_config(overrides), overrides, 0).save_path == tmp_path / "home/saved"


BAD_INPUTS = [  # (name, run dir -> (arguments, what the line says), in a process of its own)
    ("missing path", lambda d: (["checkpoint.load=True", f"checkpoint.load_path={d}/nope"], "does not exist"), False),
    ("missing init_from", lambda d: ([f"init_from={d}/nope"], f"error: init_from: {d}/nope does not exist"), False),
    (
        "a step's folder",
        lambda d: (
            ["checkpoint.load=True", f"checkpoint.load_path={d}/good/checkpoints/40"],
            f"name the folder that holds the steps and the step: checkpoint.load_path={d}/good/checkpoints "
            "checkpoint.load_file=40",
        ),
        False,
    ),
    (
        "empty dir",
        lambda d: (["checkpoint.load=True", f"checkpoint.load_path={d}/empty"], "holds no complete checkpoint"),
        False,
    ),
    (
        "corrupt",
        lambda d: (["checkpoint.load=True", f"checkpoint.load_path={d}/corrupt"], "does not restore"),
        True,
    ),  # Orbax's and XLA's own output would show there
    (
        "other model",
        lambda d: (
            [
                "checkpoint.load=True",
                f"checkpoint.load_path={d}/good",
                "checkpoint.overwrite_config=True",
                "model.n_layer=3",
            ],
            "holds a different model: n_layer 2 (checkpoint) vs 3",
        ),
        False,
    ),
    (  # weights only, into a model without the checkpoint's learned positions: not a silent drop of them
        "init_from another structure",
        lambda d: (
            [f"init_from={d}/good", "model.position=rope"],
            "holds a different model: position learned (checkpoint) vs rope",
        ),
        False,
    ),
    (
        "other tokenizer",
        lambda d: (
            [
                "checkpoint.load=True",
                f"checkpoint.load_path={d}/good",
                "checkpoint.overwrite_config=True",
                "dataset.tokenizer=bpe",
            ],
            "dataset.tokenizer: bpe does not match the checkpoint's byte",
        ),
        False,
    ),
    (  # its batches would have started where the checkpoint's run had not (half its samples again)
        "other batch",
        lambda d: (
            [
                "checkpoint.load=True",
                f"checkpoint.load_path={d}/good",
                "checkpoint.overwrite_config=True",
                "train.batch_size=4",
            ],
            "train.batch_size: the checkpoint's 40 steps trained on 20,480 tokens, where this run's batches (1 "
            "process(es) x train.batch_size x train.grad_accum_steps) take 10,240",
        ),
        False,
    ),
    (  # the same tokens per step, accumulated: "its opt_state does not restore (a different optimizer?)"
        "accumulation switched on",
        lambda d: (
            [
                "checkpoint.load=True",
                f"checkpoint.load_path={d}/good",
                "checkpoint.overwrite_config=True",
                "train.batch_size=4",
                "train.grad_accum_steps=2",
            ],
            "config: train.grad_accum_steps: 2 where the checkpoint's optimizer state was saved with 1;",
        ),
        False,
    ),
    (  # Orbax's first line, without the colon that opened its listing of the trees ("do not match:; no other")
        "other optimizer",
        lambda d: (
            [
                "checkpoint.load=True",
                f"checkpoint.load_path={d}/good",
                "checkpoint.overwrite_config=True",
                "optimizer=lion",
            ],
            "its opt_state does not restore (a different optimizer? checkpoint.overwrite_optimizer=True starts a fresh "
            "one): User-provided restore item and on-disk value metadata tree structures do not match; no other",
        ),
        False,
    ),
    (
        "save path in the way",
        lambda d: ([f"checkpoint.save_path={d}/good/checkpoints"], "already holds another run"),
        False,
    ),
    (  # Orbax reads every step's val loss as it opens the directory: a JSONDecodeError traceback, in every mode
        "cut metrics file",
        lambda d: (
            ["checkpoint.load=auto", f"checkpoint.load_path={d}/cut_metrics"],
            f"checkpoint {d}/cut_metrics/checkpoints/{STEPS}: its metrics file {d}/cut_metrics/checkpoints/{STEPS}/"
            "metrics/metrics does not read (JSONDecodeError); corrupt or truncated? delete that file",
        ),
        False,
    ),
    (  # the checkpoints' config.yaml replaced that run's
        "save path a run directory",
        lambda d: ([f"checkpoint.save_path={d}/good"], "good is a run's directory (metrics.jsonl), whose config.yaml"),
        False,
    ),
    (  # a branch of one run (a resume into another directory) appended to another run's metrics and summary
        "branch into a run dir in use",
        lambda d: (
            ["checkpoint.load=True", f"checkpoint.load_path={d}/good", f"logging.run_dir={d}/corrupt"],
            "corrupt already holds a run that trained (metrics.jsonl); choose another directory for this branch",
        ),
        False,
    ),
    (  # a fresh run would append its metrics to that run's and overwrite its config and summary
        "run dir in use",
        lambda d: ([f"logging.run_dir={d}/good", "checkpoint.save=false"], "good already holds a run that trained"),
        False,
    ),
    (  # its config.yaml replaced the checkpoints', with which that run resumes
        "run dir the checkpoints folder",
        lambda d: ([f"logging.run_dir={d}/good/checkpoints"], "good/checkpoints is a run's checkpoints folder, where"),
        False,
    ),
    (  # its logs were deleted with the step when max_to_keep rotated it out
        "run dir inside a step",
        lambda d: (
            [f"logging.run_dir={d}/good/checkpoints/{STEPS}/logs"],
            f"logs is in {d}/good/checkpoints, a run's checkpoints folder, where this run's logs would be read",
        ),
        False,
    ),
    (  # a folder named like a step became that run's newest step, which its resume then failed to read
        "save path beside the steps",
        lambda d: (
            [f"checkpoint.save_path={d}/good/checkpoints/999"],
            f"999 is in {d}/good/checkpoints, a run's checkpoints folder (inside or beside its steps)",
        ),
        False,
    ),
    (  # a project's own config.yaml (`logging.run_dir=.`) was replaced by the run's
        "run dir with a file no run wrote",
        lambda d: (
            [f"logging.run_dir={d}/project"],
            f"{d}/project/config.yaml is not a file a run wrote, and this run would write over it",
        ),
        False,
    ),
]


def test_a_new_run_writes_over_a_run_file_cut_short_and_never_over_another_tools(tmp_path):
    """What a full disk left (an empty config.yaml, a summary.json cut off) must not stop the rerun that the disk
    error suggests; another tool's config.yaml, even with a `model:` section, is refused."""
    from training.checkpoints.storage import check_no_foreign_file

    names = ("config.yaml", "summary.json")
    (tmp_path / "config.yaml").write_text("")
    (tmp_path / "summary.json").write_text('{\n  "steps": 40,\n  "train": {\n    "final_lo')
    check_no_foreign_file("logging.run_dir", tmp_path, names)
    (tmp_path / "config.yaml").write_text("mode: train\neval_only: false\nstage: next_tok")
    check_no_foreign_file("logging.run_dir", tmp_path, names)
    for theirs in (
        "model:\n  class_path: my_package.Net\ntrainer:\n  max_epochs: 3\n",
        "mode: production\nserver: 8080\n",
        "model: {}\ndata: {}\ntrain: {}\n",  # names of a run config's sections, not in its order
        "{}\n",
    ):
        (tmp_path / "config.yaml").write_text(theirs)
        with pytest.raises(ConfigError, match=rf"^logging.run_dir: {tmp_path}/config.yaml is not a file a run wrote"):
            check_no_foreign_file("logging.run_dir", tmp_path, names)
    (tmp_path / "config.yaml").write_text("")
    (tmp_path / "summary.json").write_text('{"accuracy": 0.9}')
    with pytest.raises(ConfigError, match=rf"^logging.run_dir: {tmp_path}/summary.json is not a file a run wrote"):
        check_no_foreign_file("logging.run_dir", tmp_path, names)


def test_a_run_that_saved_beside_its_logs_resumes_there_and_may_save_elsewhere(data_cache, tmp_path, capsys):
    """checkpoint.save_path=<its run dir>: the run's directory is its checkpoints folder, which a run directory may
    not be, but for the run that saved there (also when it now saves elsewhere); without that save path, the line
    says how to continue it."""
    run_dir = tmp_path / "run"
    beside = [f"logging.run_dir={run_dir}", f"checkpoint.save_path={run_dir}", "train.max_steps=4"]
    ok(run_in_process(tiny_overrides(data_cache, *beside), capsys))
    more = ["checkpoint.overwrite_config=True", "train.max_steps=5", f"logging.run_dir={run_dir}"]
    rerun = run_in_process(tiny_overrides(data_cache, "checkpoint.load=auto", *more), capsys)
    assert rerun.returncode == 2 and rerun.stderr.strip().endswith(
        f"or continue the run that saved there with checkpoint.save_path={run_dir} (its save path)"
    )
    moved = [f"checkpoint.load_path={run_dir}", f"checkpoint.save_path={tmp_path}/bigger-disk"]
    ok(run_in_process(tiny_overrides(data_cache, "checkpoint.load=True", *more, *moved), capsys))
    assert (tmp_path / "bigger-disk" / "5").is_dir() and max(losses(run_dir)) == 5
    # moved: its config names the new save path, where it continues (the run directory's steps are older)
    rerun = run_in_process(
        tiny_overrides(data_cache, "checkpoint.load=auto", *more[:-2], "train.max_steps=6", more[-1]), capsys
    )
    assert rerun.stderr.strip().endswith(f"checkpoint.save_path={tmp_path}/bigger-disk (its save path)"), rerun.stderr


@pytest.fixture(scope="module")
def damaged(straight, tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    (root / "empty").mkdir()
    subprocess.run(["cp", "-r", str(straight), str(root / "good")], check=True)
    subprocess.run(["cp", "-r", str(straight), str(root / "corrupt")], check=True)
    for path in (root / "corrupt" / "checkpoints").glob("*/model/**/*"):
        if path.is_file() and path.stat().st_size > 1000:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])  # truncated array data
    subprocess.run(["cp", "-r", str(straight), str(root / "cut_metrics")], check=True)
    (root / "cut_metrics" / "checkpoints" / str(STEPS) / "metrics" / "metrics").write_text('{"val_lo')
    (root / "project").mkdir()
    (root / "project" / "config.yaml").write_text("model:\n  class_path: my_package.Net\ntrainer:\n  max_epochs: 3\n")
    return root


@pytest.mark.parametrize("name,case,own_process", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_checkpoint_input_fails_with_one_line_and_touches_nothing(
    name, case, own_process, damaged, data_cache, tmp_path, capsys
):
    args, message = case(damaged)
    before = {p: p.stat().st_mtime_ns for p in damaged.rglob("*")}
    result = run_command(tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/new", *args), capsys, own_process)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert message in lines[0]
    assert {p: p.stat().st_mtime_ns for p in damaged.rglob("*")} == before
    assert not (tmp_path / "new").exists()


def test_nonfinite_loss_stops_with_a_line_naming_the_step(data_cache, tmp_path):
    result = run_cli(
        config(
            data_cache,
            tmp_path / "run",
            "optimizer=sgdm",
            "optimizer.grad_clip=0",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.lr=1e30",
            "optimizer.lr_config.warmup=0",
        )
    )
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("error: step ") and "the training loss is nan" in line and "train.skip_nonfinite=true" in line
    )
    # its summary says where it stopped (there was none: compare_runs and sweeps read the run as unfinished)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped"] == line and summary["steps"] == max(losses(tmp_path / "run"))


def test_an_evaluation_under_other_settings_keeps_the_earlier_file(tmp_path):
    """Another task (its loss mask), precision or batch never replaces eval-step<N>.json; the same evaluation again
    does; a file written before results held their settings is kept."""
    from training.evaluation.results import eval_settings, write_eval_result

    results = {"val": {"loss": 1.0}}

    def write(*overrides: str) -> Path:
        cfg = load_config(["model=gpt2-tiny", *overrides], num_local_devices=1)
        return write_eval_result(tmp_path, {"step": 4, "results": results}, eval_settings(cfg, "byte", results))

    first = write()
    assert first.name == "eval-step4.json" and write() == first
    piano = ["dataset=music21", "dataset.tokenizer=notes", "stage=piano_task", "tasks=[dynamics]"]
    asked = (["system.dtype=bfloat16"], ["train.eval_iters=3"], piano, [*piano, "loss_masking=finetuning"])
    others = {write(*o) for o in asked}
    assert len(others) == 4 and first not in others and all(p.parent == tmp_path for p in others)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "eval-step4.json").write_text('{"step": 4, "results": {}}')  # an older file: no settings
    cfg = load_config(["model=gpt2-tiny"], num_local_devices=1)
    kept = write_eval_result(tmp_path / "run", {"step": 4, "results": results}, eval_settings(cfg, "byte", results))
    assert (
        kept.name != "eval-step4.json"
        and json.loads((tmp_path / "run" / "eval-step4.json").read_text())["results"] == {}
    )


def test_a_resume_whose_command_leaves_the_runs_device_layout_says_so_in_one_line(finished, data_cache, capsys):
    """The documented resume command (`checkpoint.load=True checkpoint.load_path=<run>`) takes system.* from its
    command line: a run of 1 device resumed on all 8 without a word, its losses no longer bit for bit."""
    overrides = [o for o in resume_args(data_cache, finished) if o != "system.num_devices=1"]
    assert len(overrides) == len(resume_args(data_cache, finished)) - 1
    plan = plan_run(load_config(overrides), overrides, 0)
    assert plan.cfg.system.num_devices is None
    assert capsys.readouterr().err == (
        "warning: the run trained with system.num_devices=1, which this command leaves at system.num_devices=null (a "
        "resume takes system.* from its command line): it continues, but not bit for bit; name them to keep the "
        "run's\n"
    )
    plan_run(load_config(resume_args(data_cache, finished)), resume_args(data_cache, finished), 0)
    assert capsys.readouterr().err == ""  # named as it trained: nothing to say
