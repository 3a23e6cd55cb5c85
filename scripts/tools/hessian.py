"""Sharpness: the largest (and smallest) Hessian eigenvalue of a checkpoint's evaluation loss, and a run's sharpness
against 2/lr.

    python -m scripts.tools.hessian RUN [--step latest|best|N] [--iters N] [--seed 0]
    python -m scripts.tools.hessian RUN --plot sharpness.png  # what logging.hessian_every logged, and 2/lr
    python -m scripts.tools.hessian RUN --step 400 --plot sharpness.png  # ... with this checkpoint's measurement added

RUN is a run directory (runs/<name>) or its checkpoint directory. The eigenvalues are the extremes of a Lanczos run on
Hessian-vector products (training/analysis/curvature.py) of the masked mean token loss in float32 on the run's fixed
curvature batch: the first evaluation batch of its main validation split, the batch the loop action measures, from
the same starting vector and with as many products (logging.hessian_iters), so `--step N` repeats the `sharpness`
and `hessian_min` the run logged at step N; not for schedule-free runs, whose checkpoints' weights are their averaged
ones (what sampling reads) while the loop measures the iterate.

The plot shows `sharpness` from the run's metrics.jsonl (split `curvature`) and 2/lr from its `lr` (split `train`):
gradient descent is stable on a quadratic only while the sharpness stays below 2/lr (the edge of stability, Cohen et
al. 2021); with momentum beta the bound is (2 + 2 beta)/lr, and Adam's applies to the preconditioned Hessian.

Exit status 2: the run, the step or the curve is not there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.arguments import OneLineParser, at_least, check_picture, seed
from core.errors import CheckpointError, PipelineError, say
from core.pictures import save_picture
from training.config import layout


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="run directory or checkpoint directory")
    parser.add_argument(
        "--step",
        default=None,
        help="latest, best or a step number (default: latest; --plot alone, without --iters or --seed: none)",
    )
    parser.add_argument(
        "--iters",
        type=at_least(1),
        default=None,
        help="Lanczos steps, one Hessian-vector product each (default: the run's logging.hessian_iters)",
    )
    parser.add_argument("--seed", type=seed, default=None, help="the starting vector's seed (default: the loop's)")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw the run's sharpness and 2/lr")
    args = parser.parse_args(argv)
    try:
        plot = args.plot and check_picture("--plot", args.plot, "hessian")  # before the measuring
        measured = None
        if args.plot is None or any(a is not None for a in (args.step, args.iters, args.seed)):
            measured = measure(args)
        if args.plot:
            plot_sharpness(args.run, plot, measured)
    except PipelineError as e:  # a checkpoint error is about the run or step named on the command line: usage
        return say(e, exit_code=2 if isinstance(e, CheckpointError) else None)
    return 0


def measure(args: argparse.Namespace) -> tuple[int, float]:
    """Print and return (step, eigenvalue) of the checkpoint at `args.step`."""
    import jax
    import jax.numpy as jnp

    from training.analysis import curvature
    from training.checkpoints.trained import load_trained, run_data

    trained = load_trained(args.run, args.step or "latest", ("run", "--step"))
    data = run_data(trained)
    batch = jax.tree.map(jnp.asarray, curvature.fixed_batch(data))
    iters = args.iters if args.iters is not None else trained.cfg.logging.hessian_iters
    seed = curvature.SEED if args.seed is None else args.seed
    extremes = curvature.sharpness_fn(iters)(trained.model, batch, jax.random.PRNGKey(seed))
    value, bottom, products = (x.item() for x in jax.device_get(extremes))
    print(
        f"step {trained.step}: sharpness {value:.6g}, smallest {bottom:.6g} (the largest and smallest Hessian "
        f"eigenvalues of the {data.main_split} loss on its first batch, {int(batch['loss_mask'].sum())} target "
        f"tokens; Lanczos, {products} Hessian-vector products)"
    )
    return trained.step, value


def plot_sharpness(run: str, out: Path, measured: tuple[int, float] | None = None) -> dict[str, tuple[list, list]]:
    """sharpness (logged, and `measured` at a checkpoint) and 2/lr against step, log-scaled (a negative eigenvalue at
    its magnitude, marked); returns the curves."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    from training.reporting.summary import latest_per_step, read_metrics

    run_dir = next((d for d in (Path(run), Path(run).parent) if layout.is_run_dir(d)), None)
    if run_dir is None:
        raise CheckpointError(f"--plot: no metrics.jsonl in {run} or its parent; pass the run directory")
    rows = latest_per_step(read_metrics(run_dir))
    logged = [r for r in rows if r["split"] == "curvature" and isinstance(r.get("sharpness"), (int, float))]
    if not logged and measured is None:
        raise CheckpointError(
            f"--plot: {run_dir}/metrics.jsonl has no sharpness; train with "
            "logging.hessian_every=N, or add --step to measure a checkpoint"
        )
    lrs = [
        (r["step"], r["lr"])
        for r in rows
        if r["split"] == "train" and isinstance(r.get("lr"), (int, float)) and r["lr"] > 0
    ]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if logged:
        ax.plot(
            [r["step"] for r in logged],
            [abs(r["sharpness"]) for r in logged],
            "o-",
            ms=3,
            color="C0",
            label="sharpness (largest Hessian eigenvalue, logged)",
        )
        negative = [r for r in logged if r["sharpness"] < 0]
        if negative:  # every eigenvalue negative (a maximum's neighbourhood): drawn at its magnitude, marked
            ax.plot(
                [r["step"] for r in negative],
                [-r["sharpness"] for r in negative],
                "x",
                ms=7,
                color="C2",
                label="negative: |eigenvalue| shown",
            )
    if measured is not None:
        ax.plot(
            [measured[0]],
            [abs(measured[1])],
            "*",
            ms=12,
            color="C3",
            label=f"{'|sharpness|' if measured[1] < 0 else 'sharpness'} at step {measured[0]} (scripts.tools.hessian)",
        )
    if lrs:
        ax.plot([s for s, _ in lrs], [2.0 / lr for _, lr in lrs], "--", color="C1", label="2 / lr (edge of stability)")
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="sharpness", title=f"sharpness and 2/lr: {run_dir.name}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_picture(fig, out, "hessian", 100)
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    plt.close(fig)
    print(f"{out}: {len(logged)} logged sharpness point(s), 2/lr over {len(lrs)} logged step(s)")
    return curves


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
