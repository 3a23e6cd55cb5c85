"""scripts/experiments/schedule_search.py: the greedy search branches from its checkpoints into candidate lrs, and the
schedule it finds, run from scratch, reproduces its losses step for step."""

import json

import pytest

from helpers import read_metrics, run_cli, tiny_overrides


@pytest.mark.e2e
@pytest.mark.soak
def test_the_found_schedule_reproduces_the_search_from_scratch(data_cache, tmp_path):
    out = tmp_path / "search"
    overrides = [
        o
        for o in tiny_overrides(data_cache)
        if not o.startswith(("train.max_steps", "train.eval_interval", "optimizer.lr_config.warmup"))
    ]
    result = run_cli(
        [
            "--segments",
            "2",
            "--segment-steps",
            "3",
            "--lrs",
            "3e-3",
            "--factors",
            "0.2,0.5",
            "--out",
            str(out),
            "--verify",
            "--",
            *overrides,
        ],
        module="scripts.experiments.schedule_search",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads((out / "schedule.json").read_text())
    first, second = found["segments"]
    assert [c["lr"] for c in second["candidates"]] == pytest.approx([6e-4, 1.5e-3])  # the winner's lr x factors
    winner = min(second["candidates"], key=lambda c: c["smoothed_loss"])
    assert found["lrs"] == pytest.approx([3e-3, winner["lr"]])
    # the later segment continued the first's winner: its steps 4-6 ran from that checkpoint, each candidate apart
    for candidate in second["candidates"]:
        rows = [r for r in read_metrics(tmp_path / candidate["run_dir"], "train")]
        assert [r["step"] for r in rows] == [4, 5, 6]
        assert all(r["lr"] == pytest.approx(candidate["lr"]) for r in rows)
    # from scratch: the schedule jumps where the search switched, and every loss is the search's, exactly
    scratch = {r["step"]: r for r in read_metrics(out / "from_scratch", "train")}
    assert [scratch[s]["lr"] for s in range(1, 7)] == pytest.approx([3e-3] * 3 + [winner["lr"]] * 3)
    assert found["from_scratch"]["same_losses"] is True
    assert {s: r["loss"] for s, r in scratch.items()} == {int(s): v for s, v in found["train_losses"].items()}
    assert "the same train losses at every step" in result.stdout


def test_a_candidate_that_diverged_or_stopped_short_has_no_smoothed_loss():
    """metrics.jsonl writes a non-finite loss as the string "nan": such a candidate, or one missing a step of the
    window, is out of the ranking instead of ending the search with a TypeError."""
    from scripts.experiments import schedule_search as search

    assert search.smoothed_loss({4: 2.0, 5: 3.0, 6: 4.0}, end=6, smooth=2) == 3.5
    assert search.smoothed_loss({4: 2.0, 5: "nan", 6: 4.0}, end=6, smooth=2) is None
    assert search.smoothed_loss({4: 2.0, 5: 3.0, 6: None}, end=6, smooth=2) is None
    assert search.smoothed_loss({4: 2.0, 6: 4.0}, end=6, smooth=2) is None


def test_an_out_that_is_a_file_is_one_line_before_any_run(tmp_path):
    (tmp_path / "a-file").write_text("mine")
    for out in (tmp_path / "a-file", tmp_path / "a-file" / "search"):
        result = run_cli(["--out", str(out)], module="scripts.experiments.schedule_search", timeout=120)
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [
            f"error: --out: {out}{'' if out.name == 'a-file' else f': {out.parent}'} is a file, not a directory; "
            "choose a directory"
        ], result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"] and (tmp_path / "a-file").read_text() == "mine"


def test_a_negative_smooth_is_one_line(tmp_path, capsys, monkeypatch):
    """--smooth -3 ranked every candidate by the mean of no step (-0.0), and the first lr won."""
    from scripts.experiments import schedule_search
    from scripts.experiments.schedule_search import main

    monkeypatch.setattr(schedule_search, "run_sweep", lambda *args, **kwargs: pytest.fail("a sweep ran"))

    with pytest.raises(SystemExit) as exit_:
        main(["--smooth", "-3", "--out", str(tmp_path / "search")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--smooth: must be >= 0; got -3" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "search").exists()
