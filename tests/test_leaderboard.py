"""The optimizer leaderboard's grids (scripts/experiments/optimizer_leaderboard.py) and its table
(scripts/experiments/leaderboard_table.py), on made-up losses instead of training runs (the runs themselves
are Hydra multiruns, tested in tests/test_sweeps.py): a grid of factor-2 steps grows past a winning edge until its best
point is interior, a momentum's grid steps 1 - beta and stops at the end of its range, a grid whose growth runs out says
so, and a grid with no completed point has no winner."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from core.errors import PipelineError
from scripts.experiments import optimizer_leaderboard as board
from scripts.experiments.leaderboard_settings import CPU_RUN, GPU_RUN, board_run, board_settings
from scripts.experiments.leaderboard_table import edge_of, grid_text, knob_points, summarize
from scripts.experiments.optimizer_leaderboard import grid, main, tune, value_of

KEY = "optimizer.lr_config.lr"


@pytest.fixture
def runs(monkeypatch):
    """board.sweep replaced by one that 'runs' each value of the swept key with `loss(value)`; the sweeps asked for,
    by name, in order."""
    asked: list[tuple[str, list[float]]] = []

    def use(loss):
        def sweep(out, name, overrides):
            key, values = overrides[-1].split("=", 1)
            values = [float(v) for v in values.split(",")]
            asked.append((name, values))
            jobs = [
                {
                    "overrides": [*overrides[:-1], f"{key}={v}"],
                    "status": "completed",
                    "val_loss": loss(v),
                    "run_dir": name,
                }
                for v in values
            ]
            return {"jobs": jobs}

        monkeypatch.setattr(board, "sweep", sweep)
        return asked

    return use


def test_a_step_size_grid_grows_past_its_winning_edge_until_the_best_is_interior(runs, tmp_path):
    asked = runs(lambda lr: math.log2(lr / 0.016) ** 2)  # the optimum 8x the centre: 2 points past the first grid
    g = grid(tmp_path, "x-step", [], KEY, 0.002, "log", points=5, grow=3)
    assert [name for name, _ in asked] == ["x-step", "x-step+3", "x-step+4"]
    assert asked[0][1] == [0.0005, 0.001, 0.002, 0.004, 0.008]
    assert [v for v, _ in g["points"]] == [0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032]
    assert value_of(g["best"], KEY) == 0.016 and g["edge"] is None


def test_a_grid_whose_growth_runs_out_says_its_best_is_at_the_edge(runs, tmp_path):
    runs(lambda lr: -lr)  # ever better: never interior
    g = grid(tmp_path, "x-step", [], KEY, 0.002, "log", points=5, grow=2)
    assert value_of(g["best"], KEY) == 0.002 * 2**4 and g["edge"] == "grid" and len(g["points"]) == 7


def test_a_momentum_grid_steps_one_minus_beta_and_stops_at_its_range(runs, tmp_path):
    asked = runs(lambda beta: beta)  # the smaller the better: down to the range's end
    g = grid(tmp_path, "x-knob", [], "optimizer.beta2", 0.95, "beta", points=3, grow=5)
    assert sorted(asked[0][1]) == pytest.approx([0.9, 0.95, 0.975])
    assert sorted(v for v, _ in g["points"]) == pytest.approx([0.0, 0.2, 0.6, 0.8, 0.9, 0.95, 0.975])
    assert g["edge"] == "range"  # 1 - 0.8 x 2 = -0.6: the step past 0.2 lands on 0, no momentum, and stops there


def test_a_grid_with_no_completed_point_has_no_winner(runs, tmp_path):
    runs(lambda lr: math.nan)  # every run diverged
    assert grid(tmp_path, "x-step", [], KEY, 0.002, "log", points=5, grow=2)["best"] is None


def test_a_grid_flat_past_its_edge_stops_growing_and_says_flat_not_an_optimum_past_it(runs, tmp_path):
    """NAdam's beta2 at 80 steps: 0.998..0.999875 within 0.0006 of each other. One point past the edge shows the
    grid flat there (less than FLAT better): growth stops, and the verdict is "flat", not "an optimum past the edge"."""
    asked = runs(lambda beta: 1 - beta)  # 1 - beta smaller is better, by ever smaller amounts
    g = grid(tmp_path, "x-knob", [], "optimizer.beta2", 0.999, "beta", points=3, grow=5)
    assert [name for name, _ in asked] == ["x-knob", "x-knob-2"]  # one growth: 0.00025 better by < FLAT
    assert g["edge"] == "grid" and edge_of(g) == "flat"
    assert "flat at the edge" in grid_text(g, "optimizer.beta2")


def test_the_optimization_track_is_a_mode_that_trains_its_fixed_model(capsys):
    cpu, gpu = board_run("optimization", False), board_run("optimization", True)
    assert "model=opt-track-micro" in cpu and "model=opt-track" in gpu
    assert [o for o in cpu if not o.startswith("model=")] == [o for o in CPU_RUN if not o.startswith("model=")]
    assert board_run("gpt2", False) == CPU_RUN and board_run("gpt2", True) == GPU_RUN
    # the presets come from the GPT-2 board only
    assert main(["--track", "optimization", "--presets", "--only", "adamw"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --presets:")


def test_a_choice_runs_the_values_other_than_the_presets_and_the_preset_can_win(runs, tmp_path):
    """SOAP's preset keeps the vocabulary side to Adam (2048): the choice runs 10000 only (the step grid's best point
    is the preset's run), and when the preset's value wins, the table names it, not the other value."""
    asked = runs(lambda v: 5.0 if v == 10000 else math.log2(v / 0.002) ** 2 if v < 1 else 0.0)
    board_ = board_settings(["model=gpt2-micro"], 80, 1024)
    record = tune(tmp_path, "soap", (0.002, 2048), board_, points=3, knob_points=3, grow=1)
    assert ("soap-knob", [10000.0]) in asked and not any(2048.0 in values for _, values in asked)
    points = knob_points(record, {})
    assert points == [[2048, 0.0], [10000.0, 5.0]]  # the preset's, from the step grid's best, first
    assert grid_text(record["knob_grid"], "optimizer.max_precond_dim", points).startswith("max_precond_dim=2048 ")
    assert record["tuned"] == ["optimizer.lr_config.lr=0.002", "optimizer.max_precond_dim=2048"]


def fake_record(out, name: str, board_: dict, loss: float) -> None:
    """A tuned optimizer's record and its seed run's files, as tune and the runs write them."""
    run_dir = out / f"{name}-run"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(
        json.dumps({"step": board_["steps"], "split": "val", "loss": loss, "nats_per_byte": loss / 2}) + "\n"
    )
    (run_dir / "summary.json").write_text(json.dumps({"tokens_per_s_median": 1000.0}))
    step_grid = {
        "best": {"overrides": [f"{KEY}=0.001"], "status": "completed", "val_loss": loss},
        "points": [[0.001, loss]],
    }
    record = {
        "optimizer": name,
        "board": board_,
        "overrides": [f"{KEY}=0.001"],
        "tuned": [f"{KEY}=0.001"],
        "step_grid": {**step_grid, "edge": None},
        "knob_grid": None,
        "seeds": [{"seed": 0, "run_dir": str(run_dir), "val_loss": loss}],
    }
    (out / f"{name}.winner.json").write_text(json.dumps(record))


def test_a_folder_holds_one_board_and_a_command_of_another_is_refused_before_it_runs(tmp_path, monkeypatch, capsys):
    def no_sweep(*args):
        raise AssertionError("a sweep ran")

    monkeypatch.setattr(board, "sweep", no_sweep)
    run80 = [*CPU_RUN, "train.max_steps=80", "train.eval_interval=20"]
    fake_record(tmp_path, "adamw", board_settings(run80, 80, 1024), 4.0)
    fake_record(tmp_path, "lion", board_settings(run80, 80, 1024), 3.0)
    table = summarize(tmp_path)  # the steps and tokens a step come from the records
    assert [r["optimizer"] for r in table["rows"]] == ["lion", "adamw"]
    assert "80 steps of 1,024 tokens (81,920 tokens a run)" in (tmp_path / "leaderboard.md").read_text()
    assert table["rows"][0]["tokens_to_adamw_final"] == 80 * 1024

    for argv, why in (  # another budget, another model into this board's folder
        (
            ["--out", str(tmp_path), "--only", "sgdm", "--steps", "240"],
            "this command and adamw are of different boards",
        ),
        (["--out", str(tmp_path), "--only", "adamw", "--gpu"], "tokens_per_step 8,192 against 1,024; overrides model="),
        # the composed run's tokens a step: an extra batch size was counted at the board's default of 8 sequences
        (["--out", str(tmp_path), "--only", "adamw", "train.batch_size=2"], "tokens_per_step 256 against 1,024"),
    ):
        assert main(argv) in (1, 2)
        err = capsys.readouterr().err
        assert err.startswith("error: ") and why in err and len(err.strip().splitlines()) == 1, err
    main(["--out", str(tmp_path), "--only", "sgdm", "--steps", "240"])
    assert (
        "(steps 240 against 80; overrides train.max_steps=240 train.eval_interval=60 against train.max_steps=80 "
        in (capsys.readouterr().err)
    )

    (tmp_path / "adamw.winner.json").rename(tmp_path / "adamw.json.aside")  # a board without AdamW: nothing to reach
    summarize(tmp_path)
    assert "| no AdamW run |" in (tmp_path / "leaderboard.md").read_text()
    (tmp_path / "adamw.json.aside").rename(tmp_path / "adamw.winner.json")

    fake_record(tmp_path, "sgdm", board_settings(run80[:-2], 240, 1024), 3.5)  # a record of another board
    with pytest.raises(PipelineError, match="sgdm and adamw are of different boards"):
        summarize(tmp_path)
    record = json.loads((tmp_path / "sgdm.winner.json").read_text())
    del record["board"]  # written before records held their board
    (tmp_path / "sgdm.winner.json").write_text(json.dumps(record))
    with pytest.raises(PipelineError, match="sgdm tuned before boards recorded their settings"):
        summarize(tmp_path)


def test_a_summarized_board_writes_its_own_docs_and_its_own_presets_only(tmp_path, monkeypatch, capsys):
    """--summarize read the track from --track, not from the board: an optimization-track board's values went into
    the GPT-2 presets (labelled gpt2-micro) and its table over docs/optimizer_leaderboard.md; a GPU board's (the .sh
    passes --docs) over the CPU board's."""
    from scripts.experiments import leaderboard_presets

    shutil.copytree(board.ROOT / "conf" / "optimizer", tmp_path / "conf" / "optimizer")  # what --presets writes
    (tmp_path / "docs").mkdir()  # what --docs writes
    for module in (board, leaderboard_presets):
        monkeypatch.setattr(module, "ROOT", tmp_path)
    from scripts.experiments.leaderboard_settings import board_kind

    # the model a board trains is its last model= (Hydra's reading), as `optimizer_leaderboard.py model=...` gives it
    assert board_kind(board_settings([*board_run("gpt2", False), "model=opt-track-micro"], 80, 1024)) == (
        "optimization",
        False,
    )
    out = tmp_path / "board"
    run = [*board_run("optimization", False), "train.max_steps=80", "train.eval_interval=20"]
    fake_record(out, "adamw", board_settings(run, 80, 1024), 4.0)
    presets = {p: p.read_text() for p in (tmp_path / "conf" / "optimizer").glob("*.yaml")}
    assert main(["--summarize", str(out), "--presets"]) == 2
    assert capsys.readouterr().err == (
        f"error: --presets: {out} is the optimization track's board; the presets are tuned on GPT-2's\n"
    )
    assert {p: p.read_text() for p in presets} == presets
    assert main(["--summarize", str(out), "--docs"]) == 0
    names = ["optimizer_leaderboard_optimization_track.md", "optimizer_leaderboard_optimization_track.png"]
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == names
    gpu = tmp_path / "gpu-board"
    fake_record(gpu, "adamw", board_settings([*board_run("gpt2", True), "train.max_steps=80"], 80, 8192), 4.0)
    assert main(["--summarize", str(gpu), "--docs"]) == 0
    assert (tmp_path / "docs" / "optimizer_leaderboard_gpu.md").exists()
    assert not (tmp_path / "docs" / "optimizer_leaderboard.md").exists()
    # its presets say where they come from: that board's model and page (they said gpt2-micro whatever the board)
    assert main(["--summarize", str(gpu), "--presets"]) == 0
    adamw = (tmp_path / "conf" / "optimizer" / "adamw.yaml").read_text()
    comment = " ".join(line.removeprefix("# ") for line in adamw.splitlines() if line.startswith("# "))
    assert "  lr: 0.001\n" in adamw and "(docs/optimizer_leaderboard_gpu.md: gpt2-mini, 80 steps of 8,192" in comment


def test_a_folder_with_no_record_or_an_only_naming_nothing_is_one_line(tmp_path, capsys):
    """--summarize (and --presets) on a folder no tuning wrote into was an IndexError; `--only ,` tuned nothing and then
    failed the same way."""
    for argv in (["--summarize", str(tmp_path)], ["--summarize", str(tmp_path / "none"), "--presets"]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "holds no tuned optimizer's record" in err and "\n" not in err, err
    assert main(["--out", str(tmp_path / "new"), "--only", ","]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --only: names no optimizer; plans exist for adamw")
    assert not (tmp_path / "new").exists() and not list(tmp_path.iterdir())


def second_seed(out, name: str, loss: float) -> None:
    """A second seed's run (final val `loss`, nats/byte half of it) added to the optimizer's fake record."""
    record = json.loads((out / f"{name}.winner.json").read_text())
    other = out / f"{name}-seed1"
    other.mkdir()
    (other / "metrics.jsonl").write_text(
        json.dumps({"step": 80, "split": "val", "loss": loss, "nats_per_byte": loss / 2}) + "\n"
    )
    record["seeds"].append({"seed": 1, "run_dir": str(other), "val_loss": loss})
    (out / f"{name}.winner.json").write_text(json.dumps(record))


def test_a_winner_whose_second_seed_failed_has_no_spread_and_the_boards_median_stands_in(tmp_path):
    """A failed seed left one final loss, whose 'spread' of 0 read as an optimizer without noise: its gap to the next
    row was then judged against the others' spreads only."""
    run = [*CPU_RUN, "train.max_steps=80", "train.eval_interval=20"]
    settings = board_settings(run, 80, 1024)
    for name, loss in (("adamw", 4.0), ("lion", 3.99), ("sgdm", 3.0)):
        fake_record(tmp_path, name, settings, loss)
    for name, second in (("adamw", 4.1), ("sgdm", 3.1)):  # two seeds each: spread 0.05 in nats/byte
        second_seed(tmp_path, name, second)
    record = json.loads((tmp_path / "lion.winner.json").read_text())
    record["seeds"].append({"seed": 1, "run_dir": None, "val_loss": math.inf})  # the second seed failed
    (tmp_path / "lion.winner.json").write_text(json.dumps(record))
    rows = {r["optimizer"]: r for r in summarize(tmp_path)["rows"]}
    assert rows["lion"]["spread"] is None and "| 1 of 2 seeds |" in (tmp_path / "leaderboard.md").read_text()
    assert rows["lion"]["noise_with_next"]  # lion 1.995 against adamw 2.025: within the board's median spread 0.05


def test_the_boards_median_spread_is_the_median(tmp_path):
    """Spreads 0.01, 0.01, 0.05, 0.05: the median is 0.03, not the upper middle 0.05, which marked a 0.04 gap between
    two rows of spread 0.01 as within noise."""
    settings = board_settings([*CPU_RUN, "train.max_steps=80", "train.eval_interval=20"], 80, 1024)
    seeds = {"adamw": (4.0, 4.02), "lion": (4.08, 4.1), "sgdm": (5.0, 5.1), "muon": (6.0, 6.1)}  # losses ~ 2x nats/byte
    for name, (first, second) in seeds.items():
        fake_record(tmp_path, name, settings, first)
        second_seed(tmp_path, name, second)
    rows = summarize(tmp_path)["rows"]
    assert [r["optimizer"] for r in rows] == ["adamw", "lion", "sgdm", "muon"]
    assert [round(r["spread"], 6) for r in rows] == [0.01, 0.01, 0.05, 0.05]
    assert not rows[0]["noise_with_next"]  # 2.005 against 2.045: a gap of 0.04, above the median spread 0.03
    assert "median over the board 0.0300" in (tmp_path / "leaderboard.md").read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--points", "1"], "--points: must be >= 3; got 1"),  # an IndexError at table time, after every run
        (["--knob-points", "-3"], "--knob-points: must be >= 3; got -3"),  # an empty grid: min() of nothing
        (["--grow", "-1"], "--grow: must be >= 0; got -1"),
        (["--steps", "0"], "--steps: must be >= 1; got 0"),
    ],
)
def test_grid_sizes_that_cannot_make_a_board_are_one_line_before_any_run(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(board, "sweep", lambda *args: pytest.fail("a sweep ran"))
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "board"), *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "board").exists()
