"""Does the best learning rate transfer across widths? A grid of lrs at a base width and a wider one, under standard
parametrization and under μP (models/mup.py), each a Hydra multirun; the final val loss against lr per width.

    python -m scripts.experiments.mup_transfer [--widths 64,256] [--lrs 1e-3,3e-3,1e-2,3e-2,1e-1] [--steps 100] \
        [--out runs/mup-transfer] [--docs] [-- extra overrides]

Expected (Tensor Programs V): under standard parametrization the wider model's optimum moves to a smaller lr; under
μP it stays where the base width has it. Written: <out>/transfer.md (the table) and transfer.png; with --docs,
copies in docs/ (mup_transfer.md, .png).
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

from core.arguments import OneLineParser
from core.errors import PipelineError, say
from training.cli.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    "model=gpt2-tiny",
    "model.n_head=4",
    "dataset.tokenizer=byte",
    "train.batch_size=16",
    "train.eval_iters=4",
    "optimizer=adamw",
    "optimizer.lr_config.warmup=0.1",  # of the run: 10 of the default 100 steps (a fixed 10 refused --steps below 10)
    "checkpoint.save=false",
    "logging.wandb=disabled",
    "logging.plot=false",
    "logging.tensorboard=false",
    "logging.progress=lines",
]


def sweep(out: Path, parametrization: str, widths: list[int], lrs: list[float], steps: int, extra: list[str]) -> list:
    jobs = run_sweep(
        out / parametrization,
        [
            *RUN,
            f"train.max_steps={steps}",
            f"train.eval_interval={steps}",
            f"model.parametrization={parametrization}",
            f"model.mup_base_width={widths[0]}",
            "model.n_embd=" + ",".join(map(str, widths)),
            "optimizer.lr_config.lr=" + ",".join(map(repr, lrs)),
            *extra,
        ],
    )["jobs"]
    failed = [j for j in jobs if j["status"] != "completed" and "the training loss is" not in str(j.get("error"))]
    if failed:  # not a divergence (a non-finite loss): a table of 'diverged' cells would hide it
        raise PipelineError(
            f"mup_transfer: {len(failed)} of {len(jobs)} {parametrization} jobs failed, e.g. job {failed[0]['job']}: "
            f"{failed[0].get('error') or failed[0]['status']}; {out / parametrization / 'sweep.md'} lists them"
        )
    table = []
    for job in jobs:
        values = dict(o.split("=", 1) for o in job["overrides"])
        loss = job.get("val_loss") if job["status"] == "completed" else None
        table.append(
            {
                "width": int(values["model.n_embd"]),
                "lr": float(values["optimizer.lr_config.lr"]),
                "val_loss": loss if loss is not None and math.isfinite(loss) else None,  # None: diverged or failed
            }
        )
    return table


def main(argv: list[str]) -> int:
    argv, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="64,256", help="n_embd values; the first is μP's base width")
    parser.add_argument("--lrs", default="1e-3,3e-3,1e-2,3e-2,1e-1")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default="runs/mup-transfer")
    parser.add_argument("--docs", action="store_true", help="copy the table and plot into docs/")
    args = parser.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",")]
        lrs = [float(v) for v in args.lrs.split(",")]
    except ValueError:
        print(f"error: --widths takes integers and --lrs numbers, comma-separated; got {argv}", file=sys.stderr)
        return 2
    for flag, given, bad, rule in (
        (
            "--widths",
            args.widths,
            len(widths) < 2 or widths != sorted(set(widths)) or widths[0] < 1,
            "two or more, increasing (the first is μP's base), each >= 1",
        ),
        ("--lrs", args.lrs, not lrs or min(lrs) <= 0, "each > 0"),
        ("--steps", args.steps, args.steps < 1, ">= 1"),
    ):
        if bad:
            print(f"error: {flag}: {rule}; got {given}", file=sys.stderr)
            return 2
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        results = {p: sweep(out, p, widths, lrs, args.steps, extra) for p in ("standard", "mup")}
    except PipelineError as e:  # e.g. --out holds a sweep of other values: run_sweep refuses to mix them
        return say(e)
    except OSError as e:
        return say(PipelineError(f"--out: {out}: {e.strerror}"))
    lines = write_results(out, results, widths, lrs, args.steps)
    print("\n".join(lines))
    if args.docs:
        shutil.copy(out / "transfer.png", ROOT / "docs" / "mup_transfer.png")
        shutil.copy(out / "transfer.md", ROOT / "docs" / "mup_transfer.md")
    return 0


def write_results(out: Path, results: dict[str, list], widths: list[int], lrs: list[float], steps: int) -> list[str]:
    """<out>/transfer.md (a row per parametrization and width: the val loss at each lr, "diverged" where a run failed
    or ended non-finite, and the best lr) and transfer.png; returns the table's lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    lines = [
        "| parametrization | width | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best lr |",
        "|---|--:|" + "--:|" * len(lrs) + "--:|",
    ]
    for ax, (parametrization, table) in zip(axes, results.items()):
        for width in widths:
            row = {r["lr"]: r["val_loss"] for r in table if r["width"] == width}
            done = [(lr, row[lr]) for lr in lrs if row.get(lr) is not None]
            best = min(done, key=lambda p: p[1]) if done else (None, None)
            ax.plot([lr for lr, _ in done], [v for _, v in done], marker="o", label=f"width {width}")
            if best[0] is not None:
                ax.plot([best[0]], [best[1]], marker="*", markersize=14, color=ax.lines[-1].get_color())
            cells = [f"{row[lr]:.4f}" if row.get(lr) is not None else "diverged" for lr in lrs]
            lines.append(
                f"| {parametrization} | {width} | "
                + " | ".join(cells)
                + f" | {'none' if best[0] is None else f'{best[0]:g}'} |"
            )
        ax.set_xscale("log")
        ax.set_title(f"{parametrization} (star: each width's best)")
        ax.set_xlabel("learning rate")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel(f"val loss after {steps} steps")
    fig.tight_layout()
    fig.savefig(out / "transfer.png", dpi=100)
    plt.close(fig)
    (out / "transfer.md").write_text("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
