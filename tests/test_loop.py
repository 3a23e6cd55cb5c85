"""The training loop: actions fire at their steps, a stop ends it, and between syncing actions nothing moves from
the devices to the host (the transfer guard would raise)."""

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import multihost_utils

import train_jax
from helpers import read_metrics, tiny_overrides
from training.loop.steps import Action, LoopState, run_loop
from training.loop.transfer_guard import HostTransferError


def counting_step(state, batch, step):
    return state + batch, {"loss": state * 1.0, "step": step}


def test_actions_fire_at_their_steps_and_at_the_end():
    fired = {"every3": [], "listed": [], "stopper": []}
    loop = LoopState(state=jnp.asarray(0), step=0, tokens_seen=0)
    actions = [
        Action(lambda lp: fired["every3"].append(lp.step), every=3, at_end=True),
        Action(lambda lp: fired["listed"].append(lp.step), steps=frozenset({1, 5})),
        Action(lambda lp: fired["stopper"].append(lp.step), every=1, syncs=False),
    ]
    # a step's tokens may change from step to step (batches that grow with train.stages): 7, 8, ..., 16
    run_loop(loop, counting_step, lambda s: jnp.asarray(1), actions, end=10, tokens_of=lambda s: 7 + s)
    assert fired == {"every3": [3, 6, 9, 10], "listed": [1, 5], "stopper": list(range(1, 11))}
    # each call is told the steps completed before it (they pick train.stages' stage)
    assert [m["step"] for m in loop.pending] == list(range(10))
    assert loop.step == 10 and loop.tokens_seen == 115 and int(loop.state) == 10 and len(loop.pending) == 10


def test_an_action_that_sets_stop_ends_the_loop_after_its_step():
    loop = LoopState(state=jnp.asarray(0), step=2, tokens_seen=0)

    def stop_at_4(lp):
        if lp.step == 4:
            lp.stop = "SIGTERM"

    run_loop(loop, counting_step, lambda s: jnp.asarray(1), [Action(stop_at_4, every=1)], end=10, tokens_of=lambda s: 1)
    assert loop.step == 4 and loop.stop == "SIGTERM"


def fetch_every_step(lp):
    float(lp.pending[-1]["loss"])  # a device-to-host transfer


def agree_every_step(lp):
    multihost_utils.process_allgather(np.int32(0))  # what a stop agreement at every step would do


@pytest.mark.parametrize("read", [fetch_every_step, agree_every_step])
def test_the_guard_raises_on_a_transfer_at_a_step_with_no_syncing_action(read):
    loop = LoopState(state=jnp.asarray(0), step=0, tokens_seen=0)
    with pytest.raises(HostTransferError, match="Disallowed device-to-host transfer"):
        run_loop(
            loop,
            counting_step,
            lambda s: jnp.asarray(1),
            [Action(read, every=1, syncs=False)],
            end=3,
            tokens_of=lambda s: 1,
            guard=True,
        )
    assert loop.step == 1


def test_a_due_syncing_action_may_transfer_and_the_guard_is_off_without_guard():
    for guard, syncs in ((True, True), (False, False)):
        loop = LoopState(state=jnp.asarray(0), step=0, tokens_seen=0)
        run_loop(
            loop,
            counting_step,
            lambda s: jnp.asarray(1),
            [Action(fetch_every_step, every=1, syncs=syncs)],
            end=3,
            tokens_of=lambda s: 1,
            guard=guard,
        )
        assert loop.step == 3
    assert jax.config.jax_transfer_guard_device_to_host is None  # the guard does not outlive the loop


def test_the_time_left_is_unknown_until_a_pace_is_measured():
    """Before the first measured interval the time left was 0 (`0:00:00 remaining` at step 1 of 3,000)."""
    import math
    import time

    from training.loop.clock import RunClock
    from training.reporting.console import format_duration

    clock = RunClock(time.time(), None, lambda step: 512 * step, max_steps=3000)
    assert math.isnan(clock.remaining(1)) and format_duration(clock.remaining(1)) == "-:--:--"
    clock.mark(1)
    time.sleep(0.01)
    clock.interval(2)
    assert clock.remaining(2) > 2998 * 0.01 * 0.5  # 2,998 steps at the measured pace


def test_the_untimed_first_interval_prints_no_nan_rate():
    """The first interval, which compiled, has no rate: its line printed `nan tok/s | nan ms/step` (every run's
    step 1 at train.log_interval=1, and a one-step run's only line)."""
    import math

    from training.reporting.console import train_line

    m = {"loss": 5.0, "lr": 1e-3, "grad_norm": 1.0, "elapsed_s": 3.0, "remaining_s": math.nan, "mfu": None}
    line = train_line(1, {**m, "tokens_per_s": math.nan, "ms_per_step": math.nan})
    assert "| - tok/s | - ms/step | MFU n/a |" in line and "nan" not in line
    assert "| 25,600 tok/s | 20 ms/step |" in train_line(2, {**m, "tokens_per_s": 25600.0, "ms_per_step": 20.0})


def test_an_interval_times_its_steps_on_both_sides_of_what_is_not_training(monkeypatch):
    """An evaluation (or a later stage's compiling step) inside a log interval restarted its clock: the steps before
    it were dropped from the interval's rate, and an interval that ended at a stage's first step had no rate."""
    from training.loop import clock as clock_lib

    now = [0.0]
    monkeypatch.setattr(clock_lib.time, "perf_counter", lambda: now[0])
    clock = clock_lib.RunClock(0.0, None, lambda step: 100 * step, max_steps=10)
    clock.mark(1)  # after the first step, which compiled
    now[0] = 2.0  # steps 2 and 3: 1 s each
    clock.pause(3)
    now[0] = 10.0  # an evaluation
    clock.mark(3)
    now[0] = 16.0  # steps 4 and 5: 3 s each
    assert clock.interval(5) == (400 / 8.0, 2000.0)  # four steps in 8 s
    clock.pause(5)
    now[0] = 30.0  # a stage's first step, compiling
    clock.mark(6)
    assert [math.isnan(x) for x in clock.interval(6)] == [True, True]  # nothing timed since the last interval
    now[0] = 31.0
    assert clock.interval(7) == (100.0, 1000.0)


def test_the_time_limit_stops_the_run_with_an_evaluation_and_a_checkpoint(data_cache, tmp_path, capsys):
    """train.max_training_hours, counted from the start (set-up and compiling included): here already spent when the
    first step ends, which is not an evaluation step but is a checkpoint.save_steps one: the checkpoint is written
    after the stop's evaluation, and keeps its val loss."""
    run_dir = tmp_path / "run"
    code = train_jax.command_line(
        tiny_overrides(
            data_cache,
            f"logging.run_dir={run_dir}",
            "train.max_steps=40",
            "train.eval_interval=10",
            "checkpoint.save_steps=1",
            "train.max_training_hours=1e-9",
        )
    )
    out = capsys.readouterr().out
    assert code == 0
    stopped = int(re.search(r"stopped at step (\d+) \(time limit\); checkpoint saved to", out).group(1))
    assert stopped % 10 and f"final evaluation at step {stopped}:" in out
    assert [r["step"] for r in read_metrics(run_dir, "val")] == [stopped]
    assert (run_dir / "checkpoints" / str(stopped)).is_dir()
    meta = json.loads((run_dir / "checkpoints" / str(stopped) / "meta" / "metadata").read_text())
    assert meta["val_loss"] == read_metrics(run_dir, "val")[0]["loss"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "time limit" and summary["checkpoints"]["latest"] == stopped
    assert not (run_dir / "plots.png").exists()  # logging.plot=false (tiny_overrides)


def test_a_time_limit_spent_at_the_last_step_ends_the_run_as_finished(data_cache, tmp_path, capsys):
    """The last step's evaluation and checkpoint are the run's end: a time limit that runs out there stops nothing
    (no second evaluation, and the summary says the run reached max_steps)."""
    run_dir = tmp_path / "run"
    overrides = ("train.max_steps=1", "optimizer.lr_config.warmup=0", "train.max_training_hours=1e-9")
    assert train_jax.command_line(tiny_overrides(data_cache, f"logging.run_dir={run_dir}", *overrides)) == 0
    out = capsys.readouterr().out
    assert "stopped at step" not in out and "final evaluation at step 1:" in out
    assert [r["step"] for r in read_metrics(run_dir, "val")] == [1]
    assert json.loads((run_dir / "summary.json").read_text())["stopped"] == "max_steps"
