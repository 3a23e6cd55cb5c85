"""Overlay runs: loss per split, learning rate and tokens/s against step, from each run's metrics.jsonl.

python -m scripts.tools.plot_runs RUN_DIR [RUN_DIR ...] [--out comparison.png] [--labels a,b]
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.arguments import OneLineParser, check_picture
from core.errors import PipelineError, say
from training.config import layout
from training.reporting.summary import plot_runs, read_metrics


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (each with a metrics.jsonl)")
    parser.add_argument("--out", default="comparison.png")
    parser.add_argument("--labels", default=None, help="comma-separated names, one per run (default: folder names)")
    args = parser.parse_args(argv)
    try:
        out = check_picture("--out", args.out, "plot_runs")
    except PipelineError as e:
        return say(e)
    missing = [r for r in args.runs if not layout.is_run_dir(r)]
    if missing:
        print(f"error: no metrics.jsonl in {', '.join(missing)}; pass run directories (runs/<name>)", file=sys.stderr)
        return 1
    try:
        empty = [r for r in args.runs if not any(row["split"] == "train" for row in read_metrics(Path(r)))]
    except PipelineError as e:
        return say(e)
    if empty:
        print(f"error: no training step logged yet in {', '.join(empty)}: nothing to plot", file=sys.stderr)
        return 1
    labels = args.labels.split(",") if args.labels else None
    if labels is not None and len(labels) != len(args.runs):
        print(f"error: --labels has {len(labels)} names for {len(args.runs)} runs", file=sys.stderr)
        return 1
    if labels is not None and len(set(labels)) != len(labels):
        print(f"error: --labels: {args.labels}: a name given twice; each run needs its own", file=sys.stderr)
        return 1
    curves = plot_runs([Path(r) for r in args.runs], out, labels)
    print(f"{args.out}: {len(curves)} curves from {len(args.runs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
