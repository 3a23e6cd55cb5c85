"""Comparing finished runs: one row per run (what differs between their configs, final and best loss per validation
split, tokens seen, median tokens/s, wall time) as a table, Markdown or CSV, and the figures a sweep is read by.

A run is a directory with a `metrics.jsonl` (and usually `config.yaml` and `summary.json`); a sweep directory is any
directory with runs below it. The table's first columns are the config keys whose values differ between the runs
compared (the sweep's own axes, e.g. `optimizer.name` and `optimizer.lr_config.lr`), not the whole config.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
from pathlib import Path
from typing import Any

from core.errors import PipelineError, first_line
from core.pictures import made_by, save_picture
from training.config import layout
from training.reporting.summary import TRAIN, latest_per_step, lone_point, read_metrics, run_names, summarize_metrics

# Keys that name where a run writes, not what it is: never a column of their own.
RUN_IDENTITY_KEYS = ("logging.run_dir", "logging.name", "checkpoint.save_path", "checkpoint.load_path")
LR_KEY, OPTIMIZER_KEY = "optimizer.lr_config.lr", "optimizer.name"


def find_runs(paths: list[Path]) -> list[Path]:
    """Each path that is a run, and every run below each path that is not (a sweep), in a stable order; below a
    path, not the logs a run set aside (`abandoned-<time>/`: a restarted run's first attempt)."""
    runs: list[Path] = []
    for path in paths:
        if layout.is_run_dir(path):
            runs.append(path)
        else:
            found = [p.parent for p in path.rglob(layout.METRICS)]
            aside = lambda run: any(part.startswith(layout.ABANDONED) for part in run.relative_to(path).parts)  # noqa: E731
            runs.extend(sorted(run for run in found if not aside(run)))
    unique: dict[Path, Path] = {}  # one run named two ways (relative and absolute, through a link): once
    for run in runs:
        unique.setdefault(run.resolve(), run)
    return list(unique.values())


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def run_record(run_dir: Path) -> dict[str, Any]:
    """What one run says about itself: its flat config and its summary (rebuilt from metrics.jsonl for a run that
    did not finish)."""
    import yaml

    config_path, summary_path = run_dir / layout.CONFIG, run_dir / layout.SUMMARY
    try:
        config = _flat(yaml.safe_load(config_path.read_text())) if config_path.exists() else {}
    except yaml.YAMLError as e:
        raise PipelineError(f"{config_path}: not YAML ({first_line(e)}); repair it or pass the other runs") from None
    try:
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    except json.JSONDecodeError as e:
        raise PipelineError(f"{summary_path}: not JSON ({e.msg}); remove it to summarise metrics.jsonl") from None
    if not isinstance(summary, dict):
        summary = summarize_metrics(read_metrics(run_dir), {"stopped": "unfinished"})
    return {"run": str(run_dir), "config": config, "summary": summary}


def varying_keys(records: list[dict[str, Any]]) -> list[str]:
    """The config keys whose values differ between the runs that have a config (not where each run lives): a run
    folder without config.yaml made every key of the others a column."""
    configs = [r["config"] for r in records if r["config"]]
    keys = sorted({k for c in configs for k in c} - set(RUN_IDENTITY_KEYS))
    return [k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]


def table(records: list[dict[str, Any]], main: str = "val") -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and rows: the varying config keys, then per validation split (`main` first) its final and best loss,
    then tokens seen, median tokens/s, wall time and how the run ended."""
    varying = varying_keys(records)
    splits = list(dict.fromkeys(s for r in records for s in r["summary"].get("splits", {})))
    splits.sort(key=lambda s: s != main)  # stable: the others keep their order
    columns = ["run", *varying]
    for split in splits:
        columns += [f"{split} final", f"{split} best"]
    columns += ["tokens seen", "tokens/s (median)", "wall s", "stopped"]
    rows = []
    for r, name in zip(records, run_names([r["run"] for r in records])):
        s = r["summary"]
        row: dict[str, Any] = {"run": name, **{k: r["config"].get(k) for k in varying}}
        for split in splits:
            got = s.get("splits", {}).get(split, {})
            row[f"{split} final"], row[f"{split} best"] = got.get("final_loss"), got.get("best_loss")
        row.update(
            {
                "tokens seen": s.get("tokens_seen"),
                "tokens/s (median)": s.get("tokens_per_s_median"),
                "wall s": s.get("wall_time_s"),
                "stopped": s.get("stopped"),
            }
        )
        rows.append(row)
    return columns, rows


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if abs(value) >= 1e4 else str(value)
    return str(value)


def markdown(columns: list[str], rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(columns: list[str], rows: list[dict[str, Any]], out: Path) -> None:
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def plot_sweep(records: list[dict[str, Any]], out: Path, split: str = "val") -> dict[str, list]:
    """Left: the final `split` loss against the learning rate, one line per optimizer and value of any other key
    that varies (log-scaled lr). Right: every run's training loss and `split` loss against step, overlaid. Returns
    the left panel's points per line (line_label)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    fig, (lr_ax, curve_ax) = plt.subplots(1, 2, figsize=(14, 5))
    by_line: dict[str, list] = {}
    first_run: dict[str, int] = {}  # a line's colour is its first run's on the right (a run alone: one colour)
    others = [k for k in varying_keys(records) if k != LR_KEY]
    for i, r in enumerate(records):
        final = r["summary"].get("splits", {}).get(split, {}).get("final_loss")
        lr = r["config"].get(LR_KEY)
        label = line_label(r, others)
        first_run.setdefault(label, i)
        if final is not None and lr is not None:
            by_line.setdefault(label, []).append((float(lr), float(final)))
    for name, points in sorted(by_line.items()):
        points.sort()
        colour = f"C{first_run[name] % 10}"
        lr_ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colour, label=name)
    lr_ax.set(
        xscale="log",
        xlabel="learning rate (optimizer.lr_config.lr)",
        ylabel=f"final {split} loss per token",
        title=f"final {split} loss against learning rate",
    )
    for i, (r, label) in enumerate(zip(records, run_names([r["run"] for r in records]))):
        rows = latest_per_step(read_metrics(Path(r["run"])))
        colour = f"C{i % 10}"
        train = [x for x in rows if x["split"] == TRAIN]
        curve_ax.plot(  # one logged interval is a point, not a line of no length
            [x["step"] for x in train],
            [x["loss"] for x in train],
            color=colour,
            alpha=0.4,
            lw=1,
            **lone_point(train),
        )
        evals = [x for x in rows if x["split"] == split]
        curve_ax.plot(
            [x["step"] for x in evals], [x["loss"] for x in evals], color=colour, marker="o", ms=3, label=label
        )
    curve_ax.set(xlabel="step", ylabel="loss per token", title=f"training loss (thin) and {split} loss (dots)")
    for ax in (lr_ax, curve_ax):
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:  # a sweep whose runs never evaluated has no points to label
            # runs that differ in many keys: a label wider than its panel squeezed both panels and was cut
            ax.legend(handles, [textwrap.fill(label, 48) for label in labels], fontsize=7)
    fig.tight_layout()
    save_picture(fig, out, "compare_runs", 100)
    plt.close(fig)
    return by_line


def line_label(record: dict[str, Any], varying: list[str]) -> str:
    """The sweep figure's line of a run: its optimizer and every other varying key but the lr (runs that differ in
    weight decay are not one curve)."""
    config = record["config"]
    parts = [str(config.get(OPTIMIZER_KEY))]
    parts += [f"{k}={config.get(k)}" for k in varying if k != OPTIMIZER_KEY]
    return ", ".join(parts)


COMPARISON_FILES = ("comparison.md", "comparison.csv", "comparison.png")  # what write_comparison writes in its folder


def foreign_comparison_file(out: Path) -> Path | None:
    """The first of `out`'s comparison files that write_comparison did not write (a table of other columns, someone's
    notes, another tool's picture): a rerun replaces its own files and nothing else. An empty file (a full disk's) is
    taken as its own."""
    heads = {
        "comparison.md": lambda line: line.startswith("| run |"),
        "comparison.csv": lambda line: line.split(",")[0] == "run",
    }
    for name in COMPARISON_FILES:
        path = out / name
        if not path.exists() and not path.is_symlink():
            continue
        if not path.is_file():
            return path
        if name in heads:
            try:
                first = path.read_text().split("\n", 1)[0]
            except (OSError, UnicodeDecodeError):
                return path
            own = first == "" or heads[name](first)
        else:
            own = path.stat().st_size == 0 or made_by(path, "compare_runs")
        if not own:
            return path
    return None


def write_comparison(runs: list[Path], out: Path, split: str = "val", records: list[dict] | None = None) -> str:
    """The table of `runs` as `out`/comparison.md and comparison.csv, and the figure as comparison.png; returns the
    Markdown table (what scripts/tools/compare_runs.py prints, and what a sweep's sweep.md includes). `records`: the
    runs' `run_record`s where the caller has read them already."""
    out.mkdir(parents=True, exist_ok=True)
    records = [run_record(r) for r in runs] if records is None else records
    columns, rows = table(records, split)
    text = markdown(columns, rows)
    (out / "comparison.md").write_text(text)
    write_csv(columns, rows, out / "comparison.csv")
    plot_sweep(records, out / "comparison.png", split)
    return text
