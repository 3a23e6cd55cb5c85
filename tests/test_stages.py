"""train.stages (training/config/stages.py): a run in stages, as the GPT-2 speedrun trains. Each stage is the run as
configured with that stage's batch size, attention window and lr multiplier, so its steps equal a plain run's bit
for bit; YaRN's rescaling of the rotary positions at each growth of the window matches a NumPy transcription of its
definition; the batches follow one another across the stages' sizes, and a run resumed across a stage boundary
continues bit for bit."""

from __future__ import annotations

import dataclasses
import math
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models.rope
from data.batches import BatchSizes, step_samples
from helpers import build, read_metrics, run_in_process, tiny_overrides
from models.config import GPTConfig
from models.gpt import GPT, with_config
from models.rope import rotary_angles, yarn_score_factor
from training.config import load_config
from training.config.stages import batch_sizes, final_model, plan_stages

# llama-tiny: rotary positions, context 64; stage 0 at 4 sequences and a window of 16, stage 1 at 8 and 32, lr x 2
STAGES = "train.stages=[{until: 0.5, batch_size: 4, attention_window: 16}, {attention_window: 32, lr_multiplier: 2}]"


def numpy_yarn(inv_freq: np.ndarray, windows: list[int]) -> np.ndarray:
    """YaRN's rescaling as the speedrun's train_gpt.py applies it at each growth (alpha 1, beta 32), in float64."""
    freq = inv_freq.astype(np.float64)
    for old, new in zip(windows, windows[1:]):
        rotations = old * freq / (2 * np.pi)
        ramp = np.clip((rotations - 1) / (32 - 1), 0, 1)
        freq = freq * (old / new + ramp * (1 - old / new))
    return freq


@pytest.mark.parametrize("frequencies", ["standard", "half_truncated"])
def test_yarn_stretches_the_slow_pairs_keeps_the_fast_ones_and_sharpens_the_scores(frequencies):
    positions = jnp.arange(1100)
    plain_cos, _ = rotary_angles(positions, 32, 1024.0, frequencies)
    windows = (256, 512, 1024)
    cos, sin = rotary_angles(positions, 32, 1024.0, frequencies, windows)
    if frequencies == "standard":  # each pair's radians per position, by their definitions (models/rope.py)
        speeds = 1024.0 ** -(np.arange(0, 32, 2) / 32)
    else:
        speeds = np.concatenate([(1 / 1024.0) ** np.linspace(0, 1, 8), np.zeros(8)])
    want = numpy_yarn(speeds, list(windows))[None, :] * np.arange(1100)[:, None]
    # float32 angles up to ~1,100 radians: a few 1e-5 of rounding
    np.testing.assert_allclose(np.asarray(cos[:, 0]), np.cos(want), atol=2e-4)
    np.testing.assert_allclose(np.asarray(sin[:, 0]), np.sin(want), atol=2e-4)
    # the fastest pair keeps its speed, the slowest turning one runs 4 times slower: both ends of the ramp are used
    stretched = numpy_yarn(speeds, list(windows))
    turning = speeds > 0
    assert stretched[0] == speeds[0] and np.isclose(stretched[turning][-1], speeds[turning][-1] / 4)
    assert yarn_score_factor(windows) == pytest.approx((1 + 0.2 * math.log(2)) ** 2)
    # one window, or a window that does not grow, changes nothing
    for same in ((256,), (256, 256)):
        np.testing.assert_array_equal(rotary_angles(positions, 32, 1024.0, frequencies, same)[0], plain_cos)
    assert yarn_score_factor((64, 64)) == 1.0


def test_the_batches_follow_one_another_across_the_stages_sizes():
    sizes = BatchSizes((0, 3, 5), (2, 4, 6))
    assert [sizes.at(s) for s in range(7)] == [2, 2, 2, 4, 4, 6, 6]
    assert [sizes.rows_before(s) for s in range(7)] == [0, 2, 4, 6, 10, 14, 20]
    for processes, accum in ((1, 1), (2, 3)):
        steps = [
            np.stack([step_samples(s, accum, processes, sizes, p) for p in range(processes)], axis=1) for s in range(7)
        ]
        assert [x.shape for x in steps][2:4] == [(accum, processes, 2), (accum, processes, 4)]
        every = np.concatenate([x.ravel() for x in steps])  # each sample once, in order, whatever the sizes
        np.testing.assert_array_equal(np.sort(every), np.arange(accum * processes * sizes.rows_before(7)))
        np.testing.assert_array_equal(every, np.arange(every.size))
    # one size: the layout of a run without stages
    np.testing.assert_array_equal(step_samples(5, 2, 1, BatchSizes.constant(3), 0), 30 + np.arange(6).reshape(2, 3))


def test_a_stage_trains_as_the_run_configured_as_it_and_the_next_stage_changes_batch_window_and_lr(data_cache):
    staged = build(tiny_overrides(data_cache, "model=llama-tiny", STAGES))
    plain = build(tiny_overrides(data_cache, "model=llama-tiny", "train.batch_size=4", "model.attention_window=16"))
    assert [(s.first_step, s.batch_size, s.attention_window) for s in plan_stages(staged.cfg)] == [
        (0, 4, 16),
        (4, 8, 32),
    ]
    # the model is the one the run ends with; the first stage reads it under its own window
    assert staged.state.model.cfg.attention_window == 32
    assert staged.train_step.model_config_at(3).attention_window == 16 and staged.train_step.model_config_at(4) is None
    for step in range(5):
        a, b = staged.step(step), plain.step(step)
        if step < 4:  # the first stage is the plain run, bit for bit: batches, window, lr
            assert float(a["loss"]) == float(b["loss"]) and float(a["lr"]) == float(b["lr"]), step
    assert staged.data.train.batch(4)["inputs"].shape == (1, 8, 64)
    assert float(a["lr"]) == pytest.approx(2 * float(b["lr"]), rel=1e-6)  # the second stage's multiplier
    assert float(a["loss"]) != float(b["loss"])  # another batch, window and lr


def test_after_a_skipped_step_the_next_stage_changes_its_lr_at_the_step_its_batch_and_window_change(data_cache):
    """A skipped step (a non-finite gradient) applies no update, so the schedule's count falls one behind the step.
    The stage's multiplier followed that count: step 4 trained on the second stage's batch and window at the first
    stage's lr, x 2 only from step 5."""
    import equinox as eqx

    from training.distributed.sharding import put_batch

    parts = build(
        tiny_overrides(
            data_cache,
            "model=llama-tiny",
            STAGES,
            "train.skip_nonfinite=true",
            "optimizer.lr_config.name=constant",
            "optimizer.lr_config.warmup=0",
        )
    )
    state, applied, lrs = parts.state, [], []
    for step in range(6):
        batch = put_batch(parts.data.train.batch(step), parts.mesh)
        if step == 2:  # an overflow's gradient: one weight inf for this step, then put back
            weight = state.model.blocks.fc.weight
            poisoned = eqx.tree_at(lambda s: s.model.blocks.fc.weight, state, jnp.full_like(weight, jnp.inf))
            state, metrics = parts.train_step(poisoned, batch, step)
            state = eqx.tree_at(lambda s: s.model.blocks.fc.weight, state, weight)
        else:
            state, metrics = parts.train_step(state, batch, step)
        applied.append(bool(metrics["applied"]))
        lrs.append(float(metrics["lr"]))
    lr = parts.cfg.optimizer.lr_config.lr
    assert applied == [True, True, False, True, True, True]
    assert lrs == pytest.approx([lr] * 4 + [2 * lr] * 2, rel=1e-6)  # x 2 from step 4, the second stage's first


def test_the_start_line_names_the_first_steps_lr_with_its_stages_multiplier(data_cache, tmp_path, capsys):
    """The start-up line's `first step` lr is the one the first step applies, its stage's multiplier included."""
    import re

    stages = "train.stages=[{until: 0.5, lr_multiplier: 0.5}, {}]"
    args = tiny_overrides(data_cache, f"logging.run_dir={tmp_path}", stages, "train.max_steps=2")
    result = run_in_process(args, capsys)
    assert result.returncode == 0, result.stderr
    said = float(re.search(r"first step ([0-9.e-]+)\)", result.stdout).group(1))
    applied = next(r["lr"] for r in read_metrics(tmp_path, "train") if r["step"] == 1)
    assert said == pytest.approx(applied, rel=1e-3) and said < 0.5 * 1e-3 * 1.01


def test_yarn_fills_the_models_windows_and_needs_growing_windows_and_rotary_positions(data_cache):
    cfg = load_config(tiny_overrides(data_cache, "model=llama-tiny", STAGES, "train.yarn=true"))
    parts = build(tiny_overrides(data_cache, "model=llama-tiny", STAGES, "train.yarn=true"))
    assert parts.state.model.cfg.yarn_windows == (16,) and parts.state.model.cfg.yarn_path == (16, 32)
    assert parts.train_step.model_config_at(0).yarn_path == ()  # the first window: nothing stretched yet
    assert plan_stages(cfg)[1].attention_window == 32
    bad = {
        "train.yarn=true": "train.yarn: rescales at each growth of the stages' windows: they must grow",
        "train.stages=[{until: 0.5, attention_window: 16}, {until: 1.0}]": "train.stages[1].attention_window: every "
        "stage names its window when one does",
        "train.stages=[{until: 0.5}, {until: 0.4}]": "train.stages[1].until: must be in (0, 1] and above",
        "train.stages=[{until: 0.5}]": "train.stages[0].until: the last stage ends the run: must be 1.0",
        "train.stages=[{until: 0.01}, {until: 1.0}]": "leaves stage 0 no step of the run's 8",
        "train.stages=[{batch_size: 0}]": "train.stages[0].batch_size: must be >= 1",
    }
    for override, message in bad.items():
        with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            load_config(tiny_overrides(data_cache, "model=llama-tiny", override))
    with pytest.raises(Exception, match="train.yarn: YaRN rescales rotary positions: it needs model.position=rope"):
        load_config(tiny_overrides(data_cache, STAGES, "train.yarn=true"))  # gpt2-tiny: learned positions


def test_a_window_wider_than_the_models_context_is_that_context_and_does_not_grow_under_yarn():
    """The speedrun's windows (64, 128, 256) over a smaller context: a wider window is full attention, and as itself
    it grew under YaRN where nothing could, the rotary positions rescaled for positions no query sees."""
    for context, windows, grown in ((256, [64, 128, 256], [64, 128]), (128, [64, 128, 128], [64]), (32, [32] * 3, [])):
        cfg = load_config(["recipe=speedrun-micro", f"model.context_size={context}"])
        assert [stage.attention_window for stage in plan_stages(cfg)] == windows
        model = final_model(cfg).model
        assert (model.attention_window, model.yarn_windows) == (windows[-1], grown)


def test_throughput_is_measured_from_each_stages_first_step_as_from_the_runs(data_cache, tmp_path, capsys, monkeypatch):
    """A later stage's first step compiles its batch's and window's programs: the interval around it counted that
    compiling as step time (453 tokens/s logged where the steps ran at 25,700). The clock restarts after that step,
    as after the run's first (and after an evaluation)."""
    from training.loop.clock import RunClock

    marks = []
    mark = RunClock.mark
    monkeypatch.setattr(RunClock, "mark", lambda self, step: (marks.append(step), mark(self, step))[1])
    stages = "train.stages=[{until: 0.5, batch_size: 4}, {batch_size: 8}]"
    args = tiny_overrides(data_cache, f"logging.run_dir={tmp_path}", stages, "train.log_interval=3")
    assert run_in_process(args, capsys).returncode == 0
    assert sorted(set(marks)) == [1, 4, 5, 8]  # the first step, the evaluation at 4, stage 2's first step, the end
    # logged at stage 2's first step: the rate of the steps before it (it had none: the clock restarted there)
    stage_start = tmp_path / "stage-start"
    args = tiny_overrides(data_cache, f"logging.run_dir={stage_start}", stages, "train.log_interval=5")
    assert run_in_process(args, capsys).returncode == 0
    rows = {r["step"]: r for r in read_metrics(stage_start, "train")}
    assert sorted(rows) == [5, 8] and all(math.isfinite(rows[s]["tokens_per_s"]) for s in (5, 8))
    assert rows[5]["ms_per_step"] > 0 and rows[5]["tokens_per_s"] == pytest.approx(
        4 * 64 / rows[5]["ms_per_step"] * 1e3
    )


def test_a_run_resumed_inside_its_stages_continues_bit_for_bit(data_cache, tmp_path, capsys):
    stages = (
        "train.stages=[{until: 0.75, attention_window: 16}, {batch_size: 16, attention_window: 32, lr_multiplier: 2}]"
    )
    args = [*tiny_overrides(data_cache, "model=llama-tiny", stages, "train.yarn=true")]
    straight = tmp_path / "straight"
    assert run_in_process([*args, f"logging.run_dir={straight}"], capsys).returncode == 0
    rows = read_metrics(straight, "train")
    assert [r["tokens_seen"] for r in rows] == [512 * s for s in range(1, 7)] + [3072 + 1024, 3072 + 2048]
    # an evaluation inside a stage reads the model as the stage trains it: the plain run's (window 16)
    plain = tmp_path / "plain"
    plain_args = ["model.attention_window=16", "checkpoint.num_steps=4"]
    ran = run_in_process(
        [*tiny_overrides(data_cache, "model=llama-tiny", *plain_args), f"logging.run_dir={plain}"], capsys
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert read_metrics(plain, "val")[-1]["step"] == 4
    assert read_metrics(plain, "val")[-1]["loss"] == read_metrics(straight, "val")[0]["loss"]
    stopped = tmp_path / "stopped"
    subprocess.run(["cp", "-r", str(straight), str(stopped)], check=True)
    subprocess.run(["rm", "-r", str(stopped / "checkpoints" / "8")], check=True)
    (stopped / "metrics.jsonl").write_text(
        "".join(
            line + "\n" for line in (straight / "metrics.jsonl").read_text().splitlines() if '"step": 8' not in line
        )
    )
    resumed = run_in_process([*args, "checkpoint.load=True", f"checkpoint.load_path={stopped}"], capsys)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    want = {r["step"]: (r["loss"], r["tokens_seen"]) for r in rows}
    got = {r["step"]: (r["loss"], r["tokens_seen"]) for r in read_metrics(stopped, "train")}
    assert [got[s] for s in range(5, 9)] == [want[s] for s in range(5, 9)]  # across the boundary at step 6
    assert read_metrics(stopped, "val")[-1]["loss"] == read_metrics(straight, "val")[-1]["loss"]
    # a longer schedule moves the stages' ends (fractions of it): the checkpoint's steps 6-8 fell in stage 0 again
    # (under a batch of 16 refused as a data position, "set train.batch_size"; under a window alone, silently)
    longer = [*args, "checkpoint.load=True", f"checkpoint.load_path={straight}", "checkpoint.overwrite_config=True"]
    longer += [f"logging.run_dir={tmp_path}/longer", "train.max_steps=16", "checkpoint.num_steps=1"]
    refused = run_in_process(longer, capsys)
    assert refused.returncode == 2 and refused.stderr == (
        "error: config: train.stages: the checkpoint's 8 steps trained in stages starting at steps 0, 6 (their "
        "`until` fractions of 8 schedule steps), where this run's stages over 16 start at 0 (or set another batch, "
        "window or lr multiplier): keep the schedule at 8 steps, or give train.stages whose stages before step 8 are "
        "the checkpoint's (its config.yaml has them)\n"
    )
    # an evaluation under this command line's config trains nothing: its stages do not matter
    scored = [*tiny_overrides(data_cache, "model=llama-tiny", "mode=eval", "checkpoint.load=True")]
    scored += [f"checkpoint.load_path={straight}", "checkpoint.overwrite_config=True"]
    assert run_in_process(scored, capsys).returncode == 0
    ends_kept = stages.replace("until: 0.75", "until: 0.375")  # stage 1 from step 6 of 16: the checkpoint's stages
    assert run_in_process([*longer, ends_kept], capsys).returncode == 0
    assert [r["step"] for r in read_metrics(tmp_path / "longer", "train")] == [9]


def test_yarn_multiplies_the_models_attention_scores_by_its_factor(monkeypatch):
    """With the frequencies left as they are, a model under YaRN's windows computes what the same parameters do with
    scores scaled by the factor (model.attention_scale = factor / sqrt(head size))."""
    monkeypatch.setattr(models.rope, "yarn_frequencies", lambda inv_freq, windows: inv_freq)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, context_size=32, vocab_size=40, position="rope")
    yarn = dataclasses.replace(cfg, attention_window=16, yarn_windows=(4, 8))
    model = GPT.init(yarn, jax.random.PRNGKey(0))
    # as model.yarn_windows reads (a list): GPT.init's program hashes its config (a list is not hashable)
    as_listed = GPT.init(dataclasses.replace(yarn, yarn_windows=[4, 8]), jax.random.PRNGKey(0))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(as_listed)))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 32), 0, 40)
    factor = (1 + 0.2 * math.log(2)) ** 2
    scaled = dataclasses.replace(cfg, attention_window=16, attention_scale=factor / math.sqrt(16))
    np.testing.assert_allclose(model(tokens), with_config(model, scaled)(tokens), rtol=2e-5, atol=2e-5)
    assert not np.allclose(model(tokens), with_config(model, dataclasses.replace(yarn, yarn_windows=()))(tokens))


def test_the_speedrun_recipes_compose_to_the_speedruns_stages():
    """conf/recipe/: speedrun-micro (this machine: train_lm.sh's tokens over its 320 steps, 16 sequences a step on
    average) and speedrun (8 GPUs: the speedrun's 131k -> 393k tokens a step, windows 384 -> 1,408 in 1,285 steps)."""
    micro = load_config(["recipe=speedrun-micro", "train.max_steps=320"])
    stages = plan_stages(micro)
    assert [(s.first_step, s.batch_size, s.attention_window, s.lr_multiplier) for s in stages] == [
        (0, 8, 64, 1.0),
        (107, 16, 128, 1.52),
        (213, 24, 256, 1.73),
    ]
    assert batch_sizes(stages).rows_before(320) == 320 * 16
    assert (micro.model.name, micro.optimizer.name, micro.optimizer.orthogonalizer) == (
        "speedrun-micro",
        "muon",
        "polar_express",
    )
    gpu = load_config(["recipe=speedrun"])
    stages = plan_stages(gpu)
    assert [(s.first_step, s.batch_size * 2048, s.attention_window) for s in stages] == [
        (0, 131072, 384),
        (428, 262144, 896),
        (857, 393216, 1408),
    ]
    final = final_model(gpu).model
    assert (final.attention_window, final.yarn_windows, final.context_size) == (1408, [384, 896], 2048)
    assert (gpu.dataset.name, gpu.system.dtype, gpu.train.max_steps, gpu.optimizer.lr_config.lr) == (
        "fineweb10b",
        "bfloat16",
        1285,
        0.023,
    )
    # each evaluation scores every val target the speedrun's does (its comment said the last did: none did)
    assert gpu.train.eval_iters * gpu.train.batch_size * gpu.model.context_size == gpu.dataset.val_tokens
