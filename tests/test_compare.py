"""scripts/tools/compare_runs.py: the table of what differs between runs and how each ended, and the sweep figure."""

import csv
import json
import math

import yaml

from helpers import run_cli
from training.reporting.compare import find_runs, plot_sweep, run_record, table
from training.reporting.summary import run_names


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
    fake_run(sweep / "1" / "b", "abandoned-20261129-121731", "lion", 1e-3, [5.0], finished=False)  # set aside
    runs = find_runs([sweep])
    assert [r.name for r in runs] == ["a", "b", "c"]  # not the logs a restarted run set aside, a row of their own
    assert find_runs([sweep / "1" / "b" / "abandoned-20261129-121731"])  # unless named
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


def test_a_run_folder_without_a_config_makes_no_key_a_column(tmp_path):
    """Its empty config made every key of the others `varying`: a table of every config key."""
    runs = [fake_run(tmp_path, name, "adamw", lr, [5.0, 4.0]) for name, lr in [("a", 1e-3), ("b", 3e-3)]]
    (runs[1] / "config.yaml").unlink()
    runs.append(fake_run(tmp_path, "c", "adamw", 3e-3, [5.0, 4.2]))
    columns, rows = table([run_record(r) for r in runs])
    assert columns[:2] == ["run", "optimizer.lr_config.lr"] and columns[2] == "val final"
    assert [row["optimizer.lr_config.lr"] for row in rows] == [1e-3, None, 3e-3]


def test_the_figure_keeps_a_runs_colour_in_both_panels_and_wraps_long_labels(tmp_path, monkeypatch):
    """Lines coloured by sorted label on the left and runs by order on the right gave one run two colours; a label
    of many differing keys, wider than its panel, squeezed both panels and was cut."""
    from training.reporting import compare

    figures = []
    monkeypatch.setattr(compare, "save_picture", lambda fig, *a: figures.append(fig))
    runs = [fake_run(tmp_path, o, o, 1e-3, [5.0, 4.0], weight_decay=wd) for o, wd in [("muon", 0.0), ("adamw", 1e-4)]]
    for run, keys in zip(runs, [range(0, 12), range(12, 24)]):  # a dozen more keys that differ between the two
        config = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump({**config, "model": {f"key_{k}": k for k in keys}}))
    plot_sweep([run_record(r) for r in runs], tmp_path / "f.png")
    lr_ax, curve_ax = figures[0].axes
    left = {line.get_label().split(",")[0]: line.get_color() for line in lr_ax.get_lines()}
    right = {
        line.get_label(): line.get_color() for line in curve_ax.get_lines() if not line.get_label().startswith("_")
    }
    assert left == right == {"muon": "C0", "adamw": "C1"}
    labels = [t.get_text() for t in lr_ax.get_legend().get_texts()]
    assert len(labels) == 2 and all(max(map(len, label.splitlines())) <= 48 < len(label) for label in labels)


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


def test_a_rerun_replaces_its_own_comparison_and_keeps_a_file_it_did_not_write(tmp_path, capsys):
    """`--out notes` where notes/comparison.md is someone's own: it was replaced by the table (so was a picture of
    that name another tool drew), exit 0."""
    from core.pictures import made_by
    from scripts.tools import compare_runs

    runs = [str(fake_run(tmp_path / "sweep", name, "adamw", lr, [5.0, 4.0])) for name, lr in (("a", 1e-3), ("b", 3e-3))]
    out = tmp_path / "notes"
    assert compare_runs.main([*runs, "--out", str(out)]) == 0
    assert compare_runs.main([*runs[:1], "--out", str(out)]) == 0  # its own three: replaced
    assert "1 run(s)" in capsys.readouterr().out and "| b |" not in (out / "comparison.md").read_text()
    (out / "comparison.csv").write_text("")  # as a full disk leaves it: its own
    assert compare_runs.main([*runs, "--out", str(out)]) == 0 and "| b |" in (out / "comparison.md").read_text()
    for name, theirs in (("comparison.md", "# my notes\n"), ("comparison.csv", "lr,loss\n"), ("comparison.png", "png")):
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        (out / name).write_text(theirs)
        capsys.readouterr()
        assert compare_runs.main([*runs, "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"error: --out: {out / name} exists and is not a comparison compare_runs wrote; choose another --out, or "
            "move it\n"
        )
        assert (out / name).read_text() == theirs and {p.name for p in out.iterdir()} == set(before)
        (out / name).write_bytes(before[name])
    # no --out: the first path's own folder, whose comparison files (some written before a picture carried its
    # maker's name) are replaced as before
    (tmp_path / "sweep" / "comparison.png").write_text("an older version's picture")
    assert compare_runs.main([str(tmp_path / "sweep")]) == 0
    assert made_by(tmp_path / "sweep" / "comparison.png", "compare_runs")


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


def test_runs_of_one_name_in_two_sweeps_are_told_apart_in_the_table_the_figure_and_plot_runs(tmp_path, capsys):
    """Two sweeps' `lr1`: both rows and both legends read `lr1`, and plot_runs' curves of one name overwrote the
    other's (5 curves for two runs)."""
    from scripts.tools import compare_runs, plot_runs

    runs = [fake_run(tmp_path / sweep, "lr1", "adamw", lr, [5.0, 4.0]) for sweep, lr in (("a", 1e-3), ("b", 3e-3))]
    columns, rows = table([run_record(r) for r in runs])
    assert [row["run"] for row in rows] == ["a/lr1", "b/lr1"]
    # one run named twice (relative and absolute): one row, named from below the root ("//tmp/..." at full depth)
    twice = find_runs([runs[0], runs[0].parent / ".." / "a" / "lr1"])
    assert twice == [runs[0]] and run_names([tmp_path / "lr1"]) == ["lr1"]
    assert run_names([runs[0], runs[0]]) == ["/".join(runs[0].absolute().parts[1:])] * 2
    assert compare_runs.main([*map(str, runs), "--out", str(tmp_path / "cmp")]) == 0
    assert "| a/lr1 |" in capsys.readouterr().out
    one = plot_runs.main([str(runs[0]), "--out", str(tmp_path / "one.png")])
    assert one == 0 and capsys.readouterr().out.endswith("5 curves from 1 run(s)\n")
    assert plot_runs.main([*map(str, runs), "--out", str(tmp_path / "two.png")]) == 0
    assert capsys.readouterr().out.endswith("10 curves from 2 run(s)\n")
    assert plot_runs.main([*map(str, runs), "--out", str(tmp_path / "x.png"), "--labels", "a,a"]) == 1
    assert capsys.readouterr().err == "error: --labels: a,a: a name given twice; each run needs its own\n"
    # a file it did not write is kept, compare_runs' comparison.png too (plot_runs' default name); its own is replaced
    (tmp_path / "mine.png").write_text("precious")
    for kept in (tmp_path / "mine.png", tmp_path / "cmp" / "comparison.png"):
        before = kept.read_bytes()
        assert plot_runs.main([str(runs[0]), "--out", str(kept)]) == 2 and kept.read_bytes() == before
        assert capsys.readouterr().err == (
            f"error: --out: {kept} exists and is not a picture plot_runs wrote; name a new file, or remove it\n"
        )
    assert plot_runs.main([str(runs[0]), "--out", str(tmp_path / "one.png")]) == 0
    # a format without a maker's name (a rerun could not replace its own): refused before the plotting
    assert plot_runs.main([str(runs[0]), "--out", str(tmp_path / "one.jpg")]) == 2
    assert "a picture's name ends in one of .pdf, .png, .svg" in capsys.readouterr().err
    # a folder it cannot write in: one line before the plotting (a traceback from savefig after it)
    assert plot_runs.main([str(runs[0]), "--out", "/proc/p.png"]) == 2
    assert capsys.readouterr().err.startswith("error: --out: /proc/p.png: cannot write in /proc: ")


def test_a_cut_off_last_line_is_read_without_it_and_damaged_files_are_one_line(tmp_path, capsys):
    """A run killed while it wrote a row (or still writing) leaves a last line without its newline: read without it,
    with a warning; a damaged line before it, or a damaged summary.json or config.yaml, is one line naming the file
    (each was a JSONDecodeError or YAML traceback)."""
    from scripts.tools import compare_runs, plot_runs
    from training.reporting.summary import read_metrics

    run = fake_run(tmp_path, "killed", "adamw", 1e-3, [5.0, 4.0], finished=False)
    metrics = run / "metrics.jsonl"
    whole = read_metrics(run)
    metrics.write_text(metrics.read_text() + '{"step": 6, "split": "tr')
    assert read_metrics(run) == whole and "its last line is cut off" in capsys.readouterr().err
    assert plot_runs.main([str(run), "--out", str(tmp_path / "p.png")]) == 0
    assert (
        compare_runs.main([str(run), "--out", str(tmp_path / "cmp")]) == 0 and "| killed |" in capsys.readouterr().out
    )
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    for main, out in ((compare_runs.main, "cmp"), (plot_runs.main, "p.png")):
        assert main([str(run), "--out", str(tmp_path / out)]) == 1
        err = capsys.readouterr().err
        assert err == f"error: {metrics}: line 2 is not a JSON row (Expecting property name enclosed in double " + (
            "quotes); repair or remove that line\n"
        )
    metrics.write_text("\n".join([lines[0], '{"step": 1, "loss": 3}', *lines[1:]]) + "\n")  # a KeyError: 'split'
    assert compare_runs.main([str(run), "--out", str(tmp_path / "cmp")]) == 1
    assert capsys.readouterr().err == (
        f"error: {metrics}: line 2 is not a metrics row (its split and step); repair or remove it\n"
    )
    for name, text, what in (("summary.json", '{"steps": ', "not JSON"), ("config.yaml", "a: [1", "not YAML")):
        bad = fake_run(tmp_path / name, "run", "adamw", 1e-3, [5.0, 4.0])
        (bad / name).write_text(text)
        assert compare_runs.main([str(bad), "--out", str(tmp_path / "cmp")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {bad / name}: {what} (") and err.count("\n") == 1


def test_a_nan_evaluation_is_the_runs_final_loss_in_the_summary_and_a_gap_in_the_plots(tmp_path):
    """metrics.jsonl writes NaN as "nan": the summary skipped those rows and named an earlier finite loss as the
    final one (a diverged run read as healthy in compare_runs and the sweep tables), and the plots drew the strings
    as a category axis."""
    import math

    from training.reporting.metrics_file import MetricsFile
    from training.reporting.summary import plot_runs, write_summary

    run = tmp_path / "diverged"
    run.mkdir()
    log = MetricsFile(run)
    for step, loss in ((4, 4.9), (8, math.nan)):
        log.log(step, "train", {"loss": loss, "tokens_per_s": 1000.0})
        log.log(step, "val", {"loss": loss})
    log.close()
    summary = json.loads(write_summary(run, {}).read_text())  # strict JSON: "nan", as metrics.jsonl has it
    assert summary["splits"]["val"] == {
        "best_loss": 4.9,
        "best_step": 4,
        "final_loss": "nan",
        "final_step": 8,
        "final_perplexity": None,
    }
    assert summary["train"]["final_loss"] == "nan" and summary["steps"] == 8
    curves = plot_runs([run], tmp_path / "plots.png")
    steps, losses = next(v for k, v in curves.items() if k.endswith(": val"))
    assert steps == [4, 8] and losses[0] == 4.9 and math.isnan(losses[1])


def test_plot_runs_draws_a_lone_logged_interval_and_counts_only_what_it_drew(tmp_path, monkeypatch):
    """A run that logged one training interval (train.max_steps below train.log_interval) drew lines of no length,
    and its tokens/s panel, with no timed interval, was counted as a curve."""
    from training.reporting import summary
    from training.reporting.metrics_file import MetricsFile

    run = tmp_path / "short"
    run.mkdir()
    log = MetricsFile(run)
    log.log(8, "train", {"loss": 4.9, "lr": 1e-3, "tokens_per_s": math.nan})
    log.log(8, "val", {"loss": 5.0})
    log.close()
    figures = []
    monkeypatch.setattr(summary, "save_picture", lambda fig, out, *a: figures.append(fig) or out)
    curves = summary.plot_runs([run], tmp_path / "plots.png")
    assert sorted(curves) == ["learning rate/short", "loss per token/short: train", "loss per token/short: val"]
    drawn = [line for ax in figures[0].axes for line in ax.get_lines() if len(line.get_xdata())]
    assert len(drawn) == 3 and all(line.get_marker() == "o" for line in drawn)


def test_a_run_that_appends_after_a_cut_off_row_starts_on_a_line_of_its_own(tmp_path):
    """The half-written row a killed process left is cut before a resumed run appends, so the two do not join into
    one line that is neither (and a later reading fails)."""
    from training.checkpoints.resume import has_trained
    from training.reporting.metrics_file import MetricsFile
    from training.reporting.summary import read_metrics

    run = fake_run(tmp_path, "resumed", "adamw", 1e-3, [5.0, 4.0], finished=False)
    before = read_metrics(run)
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"step": 6, "split": "train", "lo')
    # checkpoint.load=auto's question, where the cut-off row is the first train row: a JSONDecodeError there
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "metrics.jsonl").write_text('{"step": 0, "split": "val", "loss": 5.0}\n{"split": "train", "l')
    assert has_trained(run) and not has_trained(tmp_path / "early")
    log = MetricsFile(run)
    log.log(6, "train", {"loss": 3.0})
    log.close()
    after = read_metrics(run)
    assert after[:-1] == before and after[-1]["step"] == 6 and after[-1]["loss"] == 3.0


def test_the_best_of_equal_losses_is_the_latest_as_the_checkpoints_best(tmp_path):
    """summary.json named the first of two equal val losses its best step; `load_file=best` (Orbax) loads the
    latest: one rule now."""
    from training.reporting.summary import read_metrics, summarize_metrics

    run = fake_run(tmp_path, "flat", "adamw", 0.0, [5.0, 5.0, 5.5])
    assert summarize_metrics(read_metrics(run), {})["splits"]["val"]["best_step"] == 4
    diverged = fake_run(tmp_path, "inf", "adamw", 0.0, [float("inf")] * 2)
    assert summarize_metrics(read_metrics(diverged), {})["splits"]["val"]["best_step"] is None  # no best of infinity
