"""The decoder comparison's table and plot (scripts/experiments/compare_decoders.sh): each model's val nats/byte at the
token budget and at the same training time, the mean of its seeds, beside its parameters and tokens/s.

    python -m scripts.experiments.compare_decoders runs/decoders            # runs/decoders/decoders.md, .json and .png
    python -m scripts.experiments.compare_decoders runs/decoders --docs     # and copies as docs/decoders.md and .png

Each directory under OUT is one model (a Hydra multirun over `train.seed`), each run below it one seed. A run's
training time is the time its training steps took, summed from its log lines' ms/step (compilation and evaluation
left out, as in tokens/s). "The same training time" is the shortest time any run took for the whole budget: every
run has reached it, and its val curve is read there, linearly between its evaluations.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from core.arguments import OneLineParser
from training.config import layout
from training.reporting.compare import find_runs
from training.reporting.summary import TRAIN, latest_per_step, read_metrics

ROOT = Path(__file__).resolve().parents[2]

SPLIT = "val"


def interpolate(xs: list[float], ys: list[float], x: float) -> float | None:
    """y at x, linearly between the points (xs ascending); None outside them."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[0] if xs and x == xs[0] else None


def val_curve(rows: list[dict]) -> list[dict[str, float]]:
    """Each evaluation of the val split: step, tokens seen, training seconds by then, nats/byte."""
    train = [r for r in rows if r["split"] == TRAIN]
    steps, seconds = [0.0], [0.0]
    for r in train:  # each log line's ms/step is its interval's: the steps since the previous line took that each
        seconds.append(seconds[-1] + r["ms_per_step"] * (r["step"] - steps[-1]) / 1000)
        steps.append(r["step"])
    tokens_per_step = train[-1]["tokens_seen"] / train[-1]["step"]
    return [
        {
            "step": r["step"],
            "tokens": r["step"] * tokens_per_step,
            "seconds": interpolate(steps, seconds, r["step"]),
            "nats_per_byte": r["nats_per_byte"],
        }
        for r in rows
        if r["split"] == SPLIT
    ]


def read_run(run_dir: Path) -> dict[str, Any]:
    """One seed's record: its config's seed and optimizer, parameters, tokens/s and val curve."""
    import yaml

    config = yaml.safe_load((run_dir / layout.CONFIG).read_text())
    summary = json.loads((run_dir / layout.SUMMARY).read_text())
    curve = val_curve(latest_per_step(read_metrics(run_dir)))
    return {
        "run": str(run_dir),
        "seed": config["train"]["seed"],
        "optimizer": config["optimizer"]["name"],
        "parameters": summary["parameters"],
        "tokens_per_s": summary["tokens_per_s_median"],
        "curve": curve,
        "training_s": curve[-1]["seconds"],
        "tokens": curve[-1]["tokens"],
    }


def mean_and_half_gap(values: list[float | None]) -> tuple[float, float] | None:
    """The mean of the seeds and half the distance between the extremes (with two seeds: each lies mean ± it)."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values), (max(values) - min(values)) / 2


def compare(out: Path) -> dict[str, Any]:
    """Every model under `out`: its runs, and the table's numbers."""
    models = {}
    for model_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        runs = [read_run(run) for run in find_runs([model_dir]) if (run / layout.SUMMARY).exists()]
        if runs:
            models[model_dir.name] = sorted(runs, key=lambda r: r["seed"])
    if not models:
        raise SystemExit(f"error: no finished run (metrics.jsonl + summary.json) below {out}")
    budgets = {r["tokens"] for runs in models.values() for r in runs}
    if len(budgets) != 1:
        raise SystemExit(f"error: the runs ended at different token counts ({sorted(budgets)}): not one budget")
    same_time = min(r["training_s"] for runs in models.values() for r in runs)
    rows = []
    for name, runs in models.items():
        at_time = [
            interpolate([p["seconds"] for p in r["curve"]], [p["nats_per_byte"] for p in r["curve"]], same_time)
            for r in runs
        ]
        rows.append(
            {
                "model": name,
                "optimizer": runs[0]["optimizer"],
                "parameters": runs[0]["parameters"],
                "seeds": [r["seed"] for r in runs],
                "at_budget": mean_and_half_gap([r["curve"][-1]["nats_per_byte"] for r in runs]),
                "at_budget_per_seed": [r["curve"][-1]["nats_per_byte"] for r in runs],
                "at_same_time": mean_and_half_gap(at_time),
                "at_same_time_per_seed": at_time,
                "tokens_per_s": sum(r["tokens_per_s"] for r in runs) / len(runs),
                "training_s": sum(r["training_s"] for r in runs) / len(runs),
            }
        )
    return {"tokens": budgets.pop(), "same_time_s": same_time, "rows": rows, "models": models}


def _cell(value: tuple[float, float] | None) -> str:
    return "before its first evaluation" if value is None else f"{value[0]:.4f} ± {value[1]:.4f}"


def markdown(result: dict[str, Any]) -> str:
    tokens, seconds = f"{result['tokens']:,.0f}", f"{result['same_time_s']:.0f}"
    lines = [
        "val: val nats/byte, the mean of the seeds ± half the gap between them. Training s: the steps' time",
        f"alone (no compilation, no evaluation); {seconds} s of training: the shortest run's.",
        "",
        f"| model | optimizer | parameters | seeds | val at {tokens} tokens | val at {seconds} s of training | "
        "tokens/s | training s |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['model']} | {r['optimizer']} | {r['parameters']:,} | {len(r['seeds'])} | "
            f"{_cell(r['at_budget'])} | {_cell(r['at_same_time'])} | {r['tokens_per_s']:,.0f} | "
            f"{r['training_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Val nats/byte against tokens (left) and against training seconds (right), a colour per model, a line per
    seed (the first solid, the others dashed)."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, (by_tokens, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, (name, runs) in enumerate(result["models"].items()):
        for j, r in enumerate(runs):
            nats = [p["nats_per_byte"] for p in r["curve"]]
            style = {
                "color": f"C{i}",
                "marker": "o",
                "ms": 3,
                "ls": "-" if j == 0 else "--",
                "label": f"{name} ({r['optimizer']}), seed {r['seed']}",
            }
            by_tokens.plot([p["tokens"] for p in r["curve"]], nats, **style)
            by_time.plot([p["seconds"] for p in r["curve"]], nats, **style)
    by_time.axvline(result["same_time_s"], color="grey", ls=":", lw=1, label="the same training time")
    by_tokens.set(xlabel="tokens", ylabel=f"{SPLIT} nats/byte", title="at equal tokens")
    by_time.set(xlabel="training seconds (steps only)", title="at equal training time")
    for ax in (by_tokens, by_time):
        ax.grid(alpha=0.3)
    by_time.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out", nargs="?", default="runs/decoders", help="the comparison's directory (default: %(default)s)"
    )
    parser.add_argument("--docs", action="store_true", help="also copy decoders.md and .png into docs/")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        print(f"error: not a directory: {out}", file=sys.stderr)
        return 1
    result = compare(out)
    text = markdown(result)
    (out / "decoders.md").write_text(text)
    (out / "decoders.json").write_text(json.dumps({k: v for k, v in result.items() if k != "models"}, indent=1))
    plot(result, out / "decoders.png")
    if args.docs:
        for suffix in ("md", "png"):
            shutil.copy(out / f"decoders.{suffix}", ROOT / "docs" / f"decoders.{suffix}")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
