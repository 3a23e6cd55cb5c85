"""μP's coordinate check (training/analysis/coord_check.py): activation scale per width over the first steps, standard
parametrization beside μP.

    python -m scripts.experiments.coord_check [--widths 64,128,256,512] [--steps 4] [--lr 1e-2] [--out coord.png]

Each panel is one activation (embedding output, the last block's residual stream, the logits): the mean |change
since step 0| of its coordinates against the width, one line per step. Flat lines: the update's effect does not
depend on width (μP); rising lines: a lr that suits the narrowest model is too large for the widest (standard).
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.arguments import OneLineParser, above, at_least, check_picture
from core.errors import PipelineError, say
from core.pictures import save_picture
from training.analysis.coord_check import coord_check, growth, write_json


def plot(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["embedding", [n for n in results[0]["change"] if n.startswith("block")][-1], "logits"]
    fig, axes = plt.subplots(len(results), len(names), figsize=(4 * len(names), 3.3 * len(results)), squeeze=False)
    for row, result in zip(axes, results):
        for ax, name in zip(row, names):
            for t in range(1, result["steps"] + 1):
                ax.plot(result["widths"], result["change"][name][t], marker="o", label=f"step {t}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(
                f"{result['parametrization']}: {name} (x{growth(result, name):.2g} over the widths)", fontsize=9
            )
            ax.set_xlabel("width (n_embd)")
            ax.set_ylabel("mean |x_t - x_0|")
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    r = results[0]
    fig.suptitle(f"coordinate check: {r['optimizer']} at lr {r['lr']}, μP base width {r['widths'][0]}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_picture(fig, out, "coord_check", 100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="64,128,256,512", help="n_embd of each model; the first is μP's base")
    parser.add_argument("--steps", type=at_least(1), default=4)
    parser.add_argument("--lr", type=above(0), default=1e-2)  # 0 moved nothing, a negative lr climbed: a flat check
    parser.add_argument("--layers", type=at_least(1), default=2)
    parser.add_argument("--heads", type=at_least(1), default=4)
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--out", default="coord_check.png")
    args = parser.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        print(f"error: --widths: comma-separated integers; got {args.widths!r}", file=sys.stderr)
        return 2
    if len(widths) < 2 or widths != sorted(set(widths)) or widths[0] < 1 or any(w % args.heads for w in widths):
        print(
            f"error: --widths: two or more, increasing (the first is μP's base), each a positive multiple of "
            f"--heads={args.heads}; got {args.widths}",
            file=sys.stderr,
        )
        return 2
    try:
        out = check_picture("--out", args.out, "coord_check")
        results = [
            coord_check(widths, p, args.steps, args.lr, args.layers, args.heads, optimizer=args.optimizer)
            for p in ("standard", "mup")
        ]
    except PipelineError as e:  # a config the widths, heads or optimizer make invalid
        return say(e)
    plot(results, out)
    write_json(results, out.with_suffix(".json"))
    for r in results:
        print(
            f"{r['parametrization']:>8}: "
            + ", ".join(f"{n} x{growth(r, n):.2f}" for n in r["change"])
            + f" (change at step {r['steps']}, width {widths[-1]} over {widths[0]})"
        )
    print(f"{out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
