"""scripts/tools/compare_runs.py: the table of what differs between runs and how each ended, and the sweep figure."""

import csv
import json

import yaml

from helpers import run_cli
from training.reporting.compare import find_runs, plot_sweep, run_record, table


def fake_run(root, name, optimizer, lr, val_losses, finished=True, weight_decay=None):
    """A run directory as train_jax.py leaves it: config.yaml, metrics.jsonl, and summary.json when it finished."""
    run = root / name
    run.mkdir(parents=True)
    config = {
        "optimizer": {
            "name": optimizer,
            "lr_config": {"lr": lr},
            "beta1": 0.9,
            **({} if weight_decay is None else {"weight_decay": weight_decay}),
        },
        "logging": {"run_dir": str(run)},
        "train": {"max_steps": 2 * len(val_losses)},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for i, loss in enumerate(val_losses, 1):
        rows.append(
            {"step": 2 * i, "split": "train", "loss": loss + 0.1, "tokens_per_s": 1000.0 * i, "tokens_seen": 512 * i}
        )
        rows += [{"step": 2 * i, "split": "val", "loss": loss}, {"step": 2 * i, "split": "json", "loss": loss + 1}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        from training.reporting.summary import write_summary

        write_summary(run, {"stopped": "max_steps", "wall_time_s": 12.5})
    return run


def test_the_table_names_what_differs_and_each_splits_final_and_best_loss(tmp_path):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", "a", "adamw", 1e-3, [5.0, 4.0, 4.5])
    fake_run(sweep / "1", "b", "lion", 1e-3, [5.0, 3.5])
    fake_run(sweep / "2", "c", "lion", 3e-3, [4.9, 4.8], finished=False)
    runs = find_runs([sweep])
    assert [r.name for r in runs] == ["a", "b", "c"]
    columns, rows = table([run_record(r) for r in runs])
    assert columns == [
        "run",
        "optimizer.lr_config.lr",
        "optimizer.name",
        "train.max_steps",
        "val final",
        "val best",
        "json final",
        "json best",
        "tokens seen",
        "tokens/s (median)",
        "wall s",
        "stopped",
    ]
    a, b, c = rows
    assert (a["val final"], a["val best"], a["json final"]) == (4.5, 4.0, 5.5)
    assert (a["tokens seen"], a["tokens/s (median)"], a["wall s"], a["stopped"]) == (1536, 2000.0, 12.5, "max_steps")
    assert (b["optimizer.name"], b["val best"]) == ("lion", 3.5)
    assert (c["val final"], c["stopped"], c["wall s"]) == (4.8, "unfinished", None)


def test_the_figure_has_a_line_per_optimizer_over_learning_rates(tmp_path):
    runs = [
        fake_run(tmp_path, f"{o}-{lr}", o, lr, [5.0, loss])
        for o, lr, loss in [("adamw", 3e-3, 4.1), ("adamw", 1e-3, 4.3), ("lion", 1e-3, 4.0)]
    ]
    points = plot_sweep([run_record(r) for r in runs], tmp_path / "f.png")
    assert points == {"adamw": [(1e-3, 4.3), (3e-3, 4.1)], "lion": [(1e-3, 4.0)]}
    # a key that varies beside the lr draws its own lines (they joined points of other weight decays as one curve)
    decays = [
        fake_run(tmp_path / "wd", f"{wd}-{lr}", "adamw", lr, [5.0, loss], weight_decay=wd)
        for wd, lr, loss in [(0.0, 1e-3, 4.3), (0.0, 3e-3, 4.1), (0.1, 1e-3, 4.2)]
    ]
    points = plot_sweep([run_record(r) for r in decays], tmp_path / "g.png")
    assert points == {
        "adamw, optimizer.weight_decay=0.0": [(1e-3, 4.3), (3e-3, 4.1)],
        "adamw, optimizer.weight_decay=0.1": [(1e-3, 4.2)],
    }
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_the_command_writes_markdown_csv_and_a_figure_or_says_what_is_missing(tmp_path):
    fake_run(tmp_path / "sweep", "a", "adamw", 1e-3, [5.0, 4.0])
    fake_run(tmp_path / "sweep", "b", "adamw", 3e-3, [5.0, 3.0])
    r = run_cli([str(tmp_path / "sweep")], module="scripts.tools.compare_runs", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| a | 0.001 | 4 | 4 |" in r.stdout and "2 run(s)" in r.stdout
    with open(tmp_path / "sweep" / "comparison.csv") as f:
        assert [row["val final"] for row in csv.DictReader(f)] == ["4.0", "3.0"]
    assert (tmp_path / "sweep" / "comparison.png").exists()
    r = run_cli([str(tmp_path / "empty-dir-that-is-missing")], module="scripts.tools.compare_runs", timeout=120)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "not a directory" in r.stderr
    # a misspelt split drew an empty figure and exited 0
    written = (tmp_path / "sweep" / "comparison.png").stat().st_mtime_ns
    r = run_cli([str(tmp_path / "sweep"), "--split", "vall"], module="scripts.tools.compare_runs", timeout=120)
    assert (r.returncode, r.stderr) == (1, "error: --split vall: no run has it; their splits: json, val\n")
    assert (tmp_path / "sweep" / "comparison.png").stat().st_mtime_ns == written
    # an --out that is a file, or below one: one line naming it, the file as it was (a traceback from mkdir)
    (tmp_path / "a-file").write_text("mine")
    for out in (tmp_path / "a-file", tmp_path / "a-file" / "below"):
        r = run_cli([str(tmp_path / "sweep"), "--out", str(out)], module="scripts.tools.compare_runs", timeout=120)
        assert r.returncode == 2 and r.stderr.startswith(f"error: --out: {out}") and r.stderr.count("\n") == 1, r
        assert "is a file, not a directory" in r.stderr and (tmp_path / "a-file").read_text() == "mine"


def test_the_command_reads_each_runs_records_once(tmp_path, monkeypatch, capsys):
    """The splits check and the table share one reading of each run (it read metrics.jsonl and the rest twice)."""
    from collections import Counter

    import training.reporting.compare as compare
    from scripts.tools import compare_runs

    runs = [fake_run(tmp_path / "sweep", name, "adamw", lr, [5.0, 4.0]) for name, lr in (("a", 1e-3), ("b", 3e-3))]
    reads = Counter()

    def counted(run):
        reads[run] += 1
        return run_record(run)

    monkeypatch.setattr(compare, "run_record", counted)
    monkeypatch.setattr(compare_runs, "run_record", counted)
    assert compare_runs.main([str(tmp_path / "sweep")]) == 0
    assert "2 run(s)" in capsys.readouterr().out
    assert reads == Counter(runs)
