"""The optimizer leaderboard's table: from a folder's tuned records, each winner's mean final `val` nats/byte over the
seeds, its spread, which rows are within noise of the next (against the board's median spread), the tokens each took
to reach AdamW's final loss, each grid's points and edge verdict; written as `<out>/leaderboard.md` and `.json`, with
each winner's val curve in `leaderboard.png`."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from scripts.experiments.leaderboard_settings import (
    FLAT,
    PLANS,
    SEEDS,
    check_boards,
    loss_of,
    preset_centres,
    read_records,
    text,
)
from training.config import layout


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, val loss per token, val nats per byte) at each evaluation."""
    rows = [json.loads(line) for line in (run_dir / layout.METRICS).read_text().splitlines()]
    return [(r["step"], r["loss"], r["nats_per_byte"]) for r in rows if r["split"] == "val"]


def edge_of(g: dict) -> str | None:
    """The grid's edge verdict: None (its best is interior), "range" (the knob's last valid value), "flat" (the best is
    at the edge but the grid is flat there: within FLAT of its neighbour) or "grid" (an optimum past the edge)."""
    if g["edge"] != "grid":
        return g["edge"]
    losses = [loss for _, loss in g["points"]]
    at = losses.index(min(losses))
    neighbour = losses[1] if at == 0 else losses[-2]
    return "flat" if neighbour - losses[at] < FLAT else "grid"


def grid_text(g: dict | None, key: str, points: list | None = None) -> str:
    """`key` best (of n points, e.g. 1e-4..4e-3)[, at its edge]; `points`: the grid's, or with the preset's added."""
    points = points or (g and g["points"])
    if not points or not any(math.isfinite(loss) for _, loss in points):
        return ""
    values = [v for v, _ in points]
    best = min(points, key=lambda p: p[1])[0]
    note = {None: "", "range": ", its range's end", "flat": ", flat at the edge", "grid": ", AT THE GRID'S EDGE"}[
        edge_of(g)
    ]
    span = f"{text(min(values))}..{text(max(values))}" if len(values) > 2 else "/".join(text(v) for v in values)
    return f"{key.removeprefix('optimizer.')}={text(best)} ({len(values)}: {span}{note})"


def knob_points(r: dict, centres: dict) -> list[list]:
    """The record's knob grid as [value, loss] points; a choice's with the preset's value first: its run is the step
    grid's best point (the choice runs the other values only)."""
    if r["knob_grid"] is None:  # no knob grid ran
        return []
    points = [list(p) for p in r["knob_grid"]["points"]]
    if PLANS[r["optimizer"]].scale == "choice":
        preset = r.get("knob_centre", centres.get(r["optimizer"], (None, None))[1])
        if preset is not None and all(v != preset for v, _ in points):
            points.insert(0, [preset, loss_of(r["step_grid"]["best"])])
    return points


def choice_centres(records: list[dict]) -> dict[str, tuple]:
    """The presets' values of records that do not hold their own (tuned before they did)."""
    names = [r["optimizer"] for r in records if PLANS[r["optimizer"]].scale == "choice" and "knob_centre" not in r]
    return preset_centres(names) if names else {}


def summarize(out: Path) -> dict:
    """The board from the tuned optimizers' records (`<out>/<name>.winner.json`): table, JSON and plot, at the
    steps and tokens a step of the board the records share."""
    records = read_records(out)
    board = check_boards(records, out)
    steps, tokens_per_step = board["steps"], board["tokens_per_step"]
    rows = []
    centres = choice_centres(records)
    for r in records:
        plan = PLANS[r["optimizer"]]
        finals = [curve(Path(s["run_dir"]))[-1][2] for s in r["seeds"] if s["run_dir"]]
        points = curve(Path(r["seeds"][0]["run_dir"]))
        summary = json.loads((Path(r["seeds"][0]["run_dir"]) / layout.SUMMARY).read_text())
        rows.append(
            {
                "optimizer": r["optimizer"],
                "val_nats_per_byte": sum(finals) / len(finals),
                # a seed that failed leaves no spread to measure: None, and the board's median stands in for it
                "spread": max(finals) - min(finals) if len(finals) == len(SEEDS) else None,
                "seeds": finals,
                "tuned": r["tuned"],
                "step": grid_text(r["step_grid"], plan.step),
                "knob": grid_text(r["knob_grid"], plan.knob, knob_points(r, centres)) if plan.knob else "",
                "edge": edge_of(r["step_grid"]) == "grid" or bool(r["knob_grid"] and edge_of(r["knob_grid"]) == "grid"),
                "tokens_per_s": summary.get("tokens_per_s_median"),
                "curve": points,
            }
        )
    rows.sort(key=lambda r: r["val_nats_per_byte"])
    adamw = next((r for r in rows if r["optimizer"] == "adamw"), None)
    target = adamw["curve"][-1][1] if adamw else None
    for r in rows:
        reached = next((s for s, loss, _ in r["curve"] if target is not None and loss <= target), None)
        r["tokens_to_adamw_final"] = None if reached is None else reached * tokens_per_step
    # within noise: the gap is below either row's spread over seeds or the board's median spread (two seeds make a
    # poor estimate of one optimizer's noise: AdamW's two runs may land 0.0001 apart by chance)
    spreads = sorted(r["spread"] for r in rows if r["spread"] is not None) or [0.0]
    typical = statistics.median(spreads)
    for above, below in zip(rows, rows[1:]):
        gap = below["val_nats_per_byte"] - above["val_nats_per_byte"]
        above["noise_with_next"] = gap < max(above["spread"] or 0.0, below["spread"] or 0.0, typical)
    (out / "leaderboard.json").write_text(json.dumps(rows, indent=1))
    seeds = ", ".join(map(str, SEEDS))
    models = sorted({o.split("=", 1)[1] for r in records for o in r.get("overrides", []) if o.startswith("model=")})
    lines = [
        f"{len(rows)} optimizers on {'/'.join(models) or 'one model'}, each at its tuned values, {steps} steps of "
        f"{tokens_per_step:,} tokens "
        f"({steps * tokens_per_step:,} tokens a run); val nats/byte: the mean over seeds {seeds} of the final "
        "`val` loss; spread: the largest minus the smallest (median over the board "
        f"{typical:.4f}). `~`: within noise of the next row (their gap is below the larger spread of the two, or "
        "the median).",
        "",
        "| # | optimizer | val nats/byte | spread | noise | step size (grid points: range) | "
        "knob (grid points: range) | tokens to AdamW's final loss | tokens/s |",
        "|---|---|--:|--:|---|---|---|--:|--:|",
    ]
    for i, r in enumerate(rows, 1):
        tokens = (
            "no AdamW run"
            if target is None
            else "not reached"
            if r["tokens_to_adamw_final"] is None
            else f"{r['tokens_to_adamw_final']:,}"
        )
        rate = "" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        lines.append(
            f"| {i} | {r['optimizer']} | {r['val_nats_per_byte']:.4f} | {spread_text(r)} | "
            f"{'~' if r.get('noise_with_next') else ''} | {r['step']} | {r['knob']} | {tokens} | {rate} |"
        )
    (out / "leaderboard.md").write_text("\n".join(lines) + "\n")
    _plot(rows, tokens_per_step, out / "leaderboard.png")
    print("\n".join(lines))
    return {"rows": rows}


def spread_text(row: dict) -> str:
    """The spread over seeds, or how many seeds finished where one failed."""
    return f"{row['spread']:.4f}" if row["spread"] is not None else f"{len(row['seeds'])} of {len(SEEDS)} seeds"


def _plot(rows: list[dict], tokens_per_step: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        steps, _, nats = zip(*r["curve"])
        ax.plot([s * tokens_per_step for s in steps], nats, marker="o", markersize=3, label=r["optimizer"])
    ax.set_xlabel("tokens")
    ax.set_ylabel("val nats/byte")
    ax.set_title("each optimizer at its tuned hyper-parameters (seed 0)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
