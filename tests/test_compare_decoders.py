"""scripts/experiments/compare_decoders.py: each model's val nats/byte at the token budget and at the shortest run's
training time, the mean of its seeds, from the runs' metrics.jsonl (runs written here by hand: no training, under a
second)."""

import json

import pytest

from scripts.experiments import compare_decoders

TOKENS_PER_STEP = 1024


def write_run(run_dir, seed: int, ms_per_step: float, val: dict[int, float]) -> None:
    """A finished 40-step run: a log line every 10 steps at `ms_per_step`, val nats/byte at the steps of `val`."""
    run_dir.mkdir(parents=True)
    rows = []
    for step in range(10, 41, 10):
        rows.append(
            {
                "step": step,
                "split": "train",
                "loss": 5.0,
                "ms_per_step": ms_per_step,
                "tokens_seen": step * TOKENS_PER_STEP,
            }
        )
        if step in val:
            rows.append({"step": step, "split": "val", "loss": 5.0, "nats_per_byte": val[step]})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text(f"train:\n  seed: {seed}\noptimizer:\n  name: adamw\n")
    (run_dir / "summary.json").write_text(json.dumps({"parameters": 1000, "tokens_per_s_median": 1e6 / ms_per_step}))


@pytest.fixture
def comparison(tmp_path):
    # fast: 0.5 s a step, 20 s for the 40; slow: 1 s a step, at 20 s only half-way (its step-20 evaluation)
    write_run(tmp_path / "fast" / "0-train.seed=1", 1, 500, {20: 2.0, 40: 1.8})
    write_run(tmp_path / "fast" / "1-train.seed=2", 2, 500, {20: 2.1, 40: 1.9})
    write_run(tmp_path / "slow" / "0-train.seed=1", 1, 1000, {20: 1.9, 40: 1.6})
    write_run(tmp_path / "slow" / "1-train.seed=2", 2, 1000, {10: 2.3, 30: 1.7, 40: 1.7})
    return tmp_path


def test_models_compare_at_the_budget_and_at_the_fastest_runs_training_time(comparison):
    # a run's first attempt, set aside when it restarted (checkpoint.load=auto): not a third seed of `slow`
    write_run(comparison / "slow" / "0-train.seed=1" / "abandoned-20261129-121731", 3, 1000, {20: 9.0, 40: 9.0})
    result = compare_decoders.compare(comparison)
    rows = {r["model"]: r for r in result["rows"]}
    assert result["tokens"] == 40 * TOKENS_PER_STEP
    assert result["same_time_s"] == pytest.approx(20.0)
    assert rows["fast"]["at_budget"] == pytest.approx((1.85, 0.05))
    assert rows["slow"]["at_budget"] == pytest.approx((1.65, 0.05))
    assert rows["fast"]["at_same_time"] == pytest.approx((1.85, 0.05))  # its own end
    # seed 1 evaluated at 20 s; seed 2's curve is read between 10 s (2.3) and 30 s (1.7): 2.0
    assert rows["slow"]["at_same_time_per_seed"] == pytest.approx([1.9, 2.0])
    assert rows["slow"]["training_s"] == pytest.approx(40.0)


def test_the_script_writes_the_table_and_the_plot(comparison, capsys):
    assert compare_decoders.main([str(comparison)]) == 0
    table = (comparison / "decoders.md").read_text()
    assert "| slow | adamw | 1,000 | 2 | 1.6500 ± 0.0500 | 1.9500 ± 0.0500 | 1,000 | 40 |" in table
    assert "| val at 40,960 tokens | val at 20 s of training |" in table
    assert (comparison / "decoders.png").stat().st_size > 0
    assert table in capsys.readouterr().out
