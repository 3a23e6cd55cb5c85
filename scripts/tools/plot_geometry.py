"""Draw a run's update geometry (`logging.update_geometry=true`, training/step/geometry.py) from its metrics.jsonl.

    python -m scripts.tools.plot_geometry RUN_DIR [--out geometry.png]

Four panels against step, one line per parameter group: the running sums of <g_n, Δ_n> and <g_n, Δ_{n+1}> (the
online-to-nonconvex quantities; a sum falling steadily means updates that keep descending), cos(Δ_{n+1}, Δ_n)
(successive updates: near 1 a straight path, negative a zig-zag), cos(g_n, Δ_n) and the update's l2 norm.
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.arguments import OneLineParser, check_picture
from core.errors import PipelineError, say
from core.pictures import save_picture
from training.config import layout
from training.reporting.summary import latest_per_step, read_metrics


def series(rows: list[dict], name: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[name]) for r in rows if r.get(name) is not None]
    return [s for s, _ in points], [v for _, v in points]


def plot_geometry(run_dir: Path, out: Path) -> list[str]:
    """Write the figure; the groups drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in latest_per_step(read_metrics(run_dir)) if r["split"] == "train"]
    groups = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("geometry/") and k.count("/") == 2})
    if not groups:
        raise SystemExit(
            f"error: {run_dir}/metrics.jsonl has no geometry/ metrics; train with logging.update_geometry=true"
        )
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    panels = [
        (
            axes[0, 0],
            [("grad_dot_update_sum", "-", "Σ <g_n, Δ_n+1>"), ("grad_dot_last_update_sum", "--", "Σ <g_n, Δ_n>")],
            "running sums",
        ),
        (axes[0, 1], [("cos_update_last_update", "-", "cos(Δ_n+1, Δ_n)")], "successive updates"),
        (axes[1, 0], [("cos_grad_last_update", "-", "cos(g_n, Δ_n)")], "gradient against the last update"),
        (axes[1, 1], [("update_l2", "-", "|Δ_n+1|_2")], "update length"),
    ]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, quantities, title in panels:
        for i, group in enumerate(groups):
            for name, style, label in quantities:
                steps, values = series(rows, f"geometry/{group}/{name}")
                ax.plot(steps, values, style, color=colours[i % len(colours)], lw=1.2, label=f"{group}: {label}")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[1, 1].set_yscale("log")
    fig.suptitle(f"update geometry: {run_dir.name}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_picture(fig, out, "plot_geometry", 100)
    plt.close(fig)
    return groups


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="run directory (with a metrics.jsonl)")
    parser.add_argument("--out", default="geometry.png")
    args = parser.parse_args(argv)
    run_dir = Path(args.run)
    if not layout.is_run_dir(run_dir):
        print(f"error: no metrics.jsonl in {run_dir}; pass a run directory (runs/<name>)", file=sys.stderr)
        return 2
    try:
        groups = plot_geometry(run_dir, check_picture("--out", args.out, "plot_geometry"))
    except PipelineError as e:
        return say(e)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    print(f"{args.out}: update geometry of {', '.join(groups)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
