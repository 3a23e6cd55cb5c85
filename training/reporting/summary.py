"""What a finished run leaves besides its checkpoints: `summary.json` and `plots.png`, both from metrics.jsonl.

metrics.jsonl is the run's whole history (a resumed run appends to it, its rows past the step it resumed at set aside
in metrics.superseded-<time>.jsonl), so the summary and the plots cover every segment of a run, and
`scripts/tools/plot_runs.py` can overlay any runs after the fact.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import PipelineError, warn
from core.pictures import save_picture
from training.config import layout
from training.reporting.metrics_file import as_json, from_json

if TYPE_CHECKING:
    from training.checkpoints.checkpointer import Checkpointer

TRAIN = "train"


_CUT_OFF: set[Path] = set()  # the metrics files whose cut-off last line a warning has named


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl ([] where it has none). A last line without its newline, cut off by a process
    stopped while it wrote it (or a run still writing), is left out with a warning; any other line that is not a JSON
    row is a PipelineError naming it."""
    path = Path(run_dir) / layout.METRICS
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines) and not text.endswith("\n"):
                if path not in _CUT_OFF:  # once per file, however often a command reads it
                    _CUT_OFF.add(path)
                    warn(f"{path}: its last line is cut off (written by a process stopped mid-line); read without it")
                break
            raise PipelineError(
                f"{path}: line {number} is not a JSON row ({e.msg}); repair or remove that line"
            ) from None
        if not isinstance(row, dict):
            raise PipelineError(f"{path}: line {number} is not a JSON object; repair or remove that line")
        if not isinstance(row.get("split"), str) or not isinstance(row.get("step"), int):
            raise PipelineError(f"{path}: line {number} is not a metrics row (its split and step); repair or remove it")
        rows.append(from_json(row))
    return rows


def run_names(run_dirs: list[Path | str]) -> list[str]:
    """Each run's name in tables and legends: its folder's name, with as many parent folders as it takes for no two
    runs to share one (sweep_a/lr1 and sweep_b/lr1, not lr1 twice)."""
    parts = [Path(r).absolute().parts[1:] for r in run_dirs]  # below the root: "/" joined in gave "//tmp/run"
    for depth in range(1, max(map(len, parts), default=1) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return ["/".join(p) for p in parts]


def latest_per_step(rows: list[dict]) -> list[dict]:
    """A resumed run may log a step twice (the interrupted segment got past its last checkpoint): keep the last."""
    out: dict[tuple[str, int], dict] = {}
    for row in rows:
        out[(row["split"], row["step"])] = row
    return sorted(out.values(), key=lambda r: (r["step"], r["split"]))


def summarize_metrics(rows: list[dict], extra: dict[str, Any]) -> dict[str, Any]:
    """Final and best loss of every split, tokens seen, throughput (median over log intervals), MFU where known."""
    rows = latest_per_step(rows)
    train = [r for r in rows if r["split"] == TRAIN]
    splits: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["split"] == TRAIN or not isinstance(r.get("loss"), (int, float)):
            continue
        s = splits.setdefault(r["split"], {"best_loss": math.inf, "best_step": None})
        s.update(final_loss=r["loss"], final_step=r["step"], final_perplexity=r.get("perplexity"))
        # of equal losses the latest, as the checkpoints' `best` (Orbax's); an infinite loss is no best
        if math.isfinite(r["loss"]) and r["loss"] <= s["best_loss"]:
            s.update(best_loss=r["loss"], best_step=r["step"])
    for s in splits.values():
        if s["best_step"] is None:  # every evaluation NaN: no best
            s["best_loss"] = None
    rates = [r["tokens_per_s"] for r in train if finite_number(r.get("tokens_per_s"))]
    mfus = [r["mfu"] for r in train if finite_number(r.get("mfu"))]
    return {
        "steps": train[-1]["step"] if train else 0,
        "train": {
            "final_loss": train[-1]["loss"] if train else None,
            "best_loss": min((r["loss"] for r in train if finite_number(r.get("loss"))), default=None),
        },
        "splits": splits,
        "tokens_seen": train[-1].get("tokens_seen") if train else 0,
        **(
            {"tokens_seen_per_source": by_source}
            if (
                by_source := {
                    k.split("/", 1)[1]: v
                    for k, v in (train[-1] if train else {}).items()
                    if k.startswith("tokens_seen/")
                }
            )
            else {}
        ),
        "tokens_per_s_median": statistics.median(rates) if rates else None,
        "mfu_median": statistics.median(mfus) if mfus else None,
        **extra,
    }


def finite_number(x: object) -> bool:
    """A finite int or float; None, a string or NaN is not."""
    return isinstance(x, (int, float)) and math.isfinite(x)


def write_summary(run_dir: Path, extra: dict[str, Any]) -> Path:
    path = Path(run_dir) / layout.SUMMARY
    path.write_text(json.dumps(as_json(summarize_metrics(read_metrics(run_dir), extra)), indent=2))
    return path


def plot_runs(run_dirs: list[Path], out: Path, labels: list[str] | None = None) -> dict[str, tuple[list, list]]:
    """Loss per split, learning rate and tokens/s against step, one colour per run (line style per split).
    Returns every curve drawn, `"<panel>/<run>: <split>" -> (steps, values)`, so what the picture shows is checkable."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    loss_ax, lr_ax, speed_ax = axes
    styles = ["-", "--", ":", "-."]
    names = labels or run_names(run_dirs)
    for i, run_dir in enumerate(run_dirs):
        rows = latest_per_step(read_metrics(run_dir))
        label = names[i]
        colour = f"C{i % 10}"
        train = [r for r in rows if r["split"] == TRAIN]
        loss_ax.plot(
            [r["step"] for r in train],
            [r["loss"] for r in train],
            color=colour,
            alpha=0.5,
            lw=1,
            label=f"{label}: train",
            **lone_point(train),
        )
        evals = sorted({r["split"] for r in rows if r["split"] != TRAIN and "loss" in r})  # not e.g. `curvature`
        for j, split in enumerate(evals):
            points = [r for r in rows if r["split"] == split]
            loss_ax.plot(
                [r["step"] for r in points],
                [r["loss"] for r in points],
                color=colour,
                ls=styles[j % len(styles)],
                marker="o",
                ms=3,
                label=f"{label}: {split}",
            )
        lr_ax.plot(
            [r["step"] for r in train], [r.get("lr") for r in train], color=colour, label=label, **lone_point(train)
        )
        timed = [r for r in train if finite_number(r.get("tokens_per_s"))]
        speed_ax.plot(
            [r["step"] for r in timed],
            [r["tokens_per_s"] for r in timed],
            color=colour,
            label=label,
            **lone_point(timed),
        )
    for ax, title in ((loss_ax, "loss per token"), (lr_ax, "learning rate"), (speed_ax, "tokens / s")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=7)
    if len(run_dirs) > 1:
        lr_ax.legend(fontsize=7)
    fig.tight_layout()
    out = save_picture(fig, out, "plot_runs", 100)
    curves = {
        f"{ax.get_title()}/{line.get_label()}": (list(line.get_xdata()), list(line.get_ydata()))
        for ax in axes
        for line in ax.get_lines()
        if len(line.get_xdata())  # a run with no timed interval draws no tokens/s
    }
    plt.close(fig)
    return curves


def lone_point(points: list) -> dict:
    """A curve of one point is drawn as a dot: a line of no length does not show."""
    return {"marker": "o", "ms": 3} if len(points) == 1 else {}


def wall_time_at(run_dir: Path, step: int) -> float | None:
    """The run's wall time in its summary.json when that summary ended at `step`, else None: a segment's summary is
    written after its last checkpoint, and counts what came after the save (the end's evaluation log, the summary)."""
    try:
        summary = json.loads((Path(run_dir) / layout.SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    wall = summary.get("wall_time_s") if isinstance(summary, dict) and summary.get("steps") == step else None
    return float(wall) if finite_number(wall) else None


def finish_run(
    run_dir: Path,
    checkpointer: Checkpointer | None,
    stopped: str | None,
    wall_s: float,
    trained_s: float,
    parameters: int,
    mfu_formula: str,
    plot: bool = True,
) -> None:
    """summary.json, and plots.png unless `plot` is false, at the end of a run (process 0)."""
    from training.checkpoints.metadata import package_versions

    checkpoints = None
    if checkpointer is not None:
        checkpointer.wait()  # the last save is complete before it is listed
        steps = checkpointer.steps()
        checkpoints = {
            "directory": str(checkpointer.directory),
            "steps": steps,
            "latest": checkpointer.resolve("latest") if steps else None,
            "best": checkpointer.resolve("best") if steps else None,
        }
    write_summary(
        run_dir,
        {
            "run_dir": str(run_dir),
            "stopped": stopped or "max_steps",
            "wall_time_s": round(wall_s, 1),  # every resumed segment's together, set-up included
            # the loop's steps (not evaluating, saving or measuring), every resumed segment's together
            "time_trained_s": round(trained_s, 1),
            "parameters": parameters,
            "mfu_formula": mfu_formula,
            "checkpoints": checkpoints,
            "versions": package_versions(),
        },
    )
    if plot:
        plot_runs([run_dir], Path(run_dir) / layout.PLOTS)
