"""Compare runs or whole sweeps: a table of what differs between them and how each ended, as Markdown and CSV, and a
figure of final validation loss against learning rate (a line per optimizer and value of any other key that varies)
beside the overlaid loss curves.

    python -m scripts.tools.compare_runs runs/sweeps/train_jax-20261123-100000   # every run below a sweep directory
    python -m scripts.tools.compare_runs runs/a runs/b --out comparison/          # or named runs
    python -m scripts.tools.compare_runs SWEEP --split code/val  # the figure for another validation split

Writes <out>/comparison.md, comparison.csv and comparison.png (default <out>: the first directory given) and prints
the Markdown table. A rerun replaces those files; in an --out folder, one of those names that it did not write is
refused, kept as it is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.arguments import OneLineParser
from core.errors import ConfigError, PipelineError, say
from training.checkpoints.storage import check_writable
from training.reporting.compare import find_runs, foreign_comparison_file, run_record, write_comparison


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="run directories, or sweep directories with runs below them")
    parser.add_argument("--out", default=None, help="where the table and figure go (default: the first path)")
    parser.add_argument("--split", default="val", help="the validation split the figure shows (default: val)")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 1
    runs = find_runs(paths)
    if not runs:
        print(f"error: no run (a directory with metrics.jsonl) in or below {', '.join(args.paths)}", file=sys.stderr)
        return 1
    try:
        records = [run_record(run) for run in runs]
    except PipelineError as e:
        return say(e)
    splits = sorted({s for record in records for s in record["summary"].get("splits", {})})
    if splits and args.split not in splits:
        print(f"error: --split {args.split}: no run has it; their splits: {', '.join(splits)}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else paths[0]
    try:
        check_writable("--out", out)  # a file in the way: one line, before anything is written
        # a folder the user named; the first path's own comparison files (a sweep's, an earlier run of this command's,
        # some from before a picture carried its maker's name) are replaced, as before
        if args.out and (foreign := foreign_comparison_file(out)) is not None:
            raise ConfigError(
                f"--out: {foreign} exists and is not a comparison compare_runs wrote; choose another --out, or move it"
            )
    except PipelineError as e:
        return say(e)
    text = write_comparison(runs, out, args.split, records)
    print(
        text + f"\n{len(runs)} run(s); written: {out / 'comparison.md'}, {out / 'comparison.csv'}, "
        f"{out / 'comparison.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
