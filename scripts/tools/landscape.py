"""Loss landscape around a checkpoint: the loss along one direction (a line plot) or two (a contour plot), with the
run's saved checkpoints projected onto it.

    python -m scripts.tools.landscape RUN [--step latest|best|N] [--out FILE.png] [--dims 1|2]
        [--to-step M | --last-update | --pca] [--grid 21] [--span LO HI] [--batches 1] [--seed 0] [--include-vectors]

Directions (training/analysis/landscape.py):
  default         random, filter-normalised (Li et al. 2018): each filter of the direction has the norm of the same
                  filter of the weights; biases and LayerNorm get 0 (--include-vectors: their own norm instead)
  --to-step M     toward the checkpoint at step M: theta_M - theta_N (M sits at 1)
  --last-update   theta_N minus the previous saved checkpoint's parameters: the sum of the updates since then, the
                  nearest thing to the last update that checkpoints keep (the checkpoint before N sits at -1)
  --pca           the trajectory's top principal directions: the offsets of the saved checkpoints from theta_N
                  (Li et al. §7; random directions are nearly orthogonal to any trajectory)
With two dimensions and --to-step or --last-update, the second direction is random, filter-normalised, then made
orthogonal to the first and scaled to its length.

The loss is the masked mean token loss in float32 over the first `--batches` evaluation batches of the main validation
split (the first is the batch scripts/tools/hessian.py measures). Every saved checkpoint is placed at its least-squares
coordinates on the directions; the printed residual is how much of its offset lies off them. Keep more checkpoints
with checkpoint.save_steps=N and checkpoint.max_to_keep=null. Exit status 2: the run or a step is not there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.arguments import OneLineParser, check_picture, seed
from core.errors import CheckpointError, PipelineError, say
from core.pictures import save_picture


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="run directory or checkpoint directory")
    parser.add_argument("--step", default="latest", help="the centre: latest, best or a step number")
    parser.add_argument(
        "--out", default=None, metavar="FILE.png", help="default: <run>/landscape-step<N>-<directions>.png"
    )
    parser.add_argument("--dims", type=int, choices=(1, 2), default=2, help="a line (1) or a plane (2)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--to-step", type=int, default=None, help="first direction: toward this step's checkpoint")
    how.add_argument("--last-update", action="store_true", help="first direction: theta_N - the previous checkpoint")
    how.add_argument("--pca", action="store_true", help="the trajectory's principal directions")
    parser.add_argument("--grid", type=int, default=21, help="points per direction")
    parser.add_argument(
        "--span",
        type=float,
        nargs=2,
        default=None,
        metavar=("LO", "HI"),
        help="coordinates along every direction (default: [-1, 1] and whatever holds the checkpoints)",
    )
    parser.add_argument("--batches", type=int, default=1, help="validation batches the loss averages over")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the random directions")
    parser.add_argument(
        "--include-vectors",
        action="store_true",
        help="random directions also move biases and LayerNorm (by their own norm)",
    )
    args = parser.parse_args(argv)
    if args.grid < 2 or args.batches < 1:
        parser.error("--grid must be >= 2 and --batches >= 1")
    if args.span is not None and not args.span[0] < args.span[1]:  # a matplotlib ValueError after all the computing
        parser.error(f"--span LO HI: LO must be below HI; got {args.span[0]:g} {args.span[1]:g}")
    try:
        landscape(args)
    except PipelineError as e:  # a checkpoint error is about the run or step named on the command line: usage
        return say(e, exit_code=2 if isinstance(e, CheckpointError) else None)
    return 0


def landscape(args: argparse.Namespace) -> dict:
    import itertools

    import numpy as np

    from training.analysis import landscape as L
    from training.checkpoints.checkpointer import Checkpointer
    from training.checkpoints.locate import find_checkpoint_dir
    from training.checkpoints.storage import check_writable
    from training.checkpoints.trained import load_trained, run_data

    if args.out:  # before the computing: a picture's name, and a place where it can be written
        args.out = check_picture("--out", args.out, "landscape")
        check_writable("--out", args.out.absolute().parent)
    centre = load_trained(args.run, args.step, ("run", "--step"))
    checkpoints = find_checkpoint_dir(args.run, ("run", "--step"))
    steps = Checkpointer(checkpoints, read_only=True).steps()
    params = {
        s: L.params_of(load_trained(args.run, str(s)).model) if s != centre.step else L.params_of(centre.model)
        for s in steps
    }
    offsets = {s: L.difference(p, params[centre.step]) for s, p in params.items() if s != centre.step}
    directions, names, spans = choose_directions(args, centre, params, offsets, checkpoints)

    placed = {s: L.project(offset, directions) for s, offset in offsets.items()}
    axes = [span_of(args.span, [coords[j] for coords, _ in placed.values()], spans[j]) for j in range(args.dims)]
    grids = [np.linspace(lo, hi, args.grid) for lo, hi in axes]
    points = np.array(list(itertools.product(*grids)))

    data = run_data(centre)
    batches = list(itertools.islice(iter(data.evals[data.main_split]), args.batches))
    tokens = int(sum(b["loss_mask"].sum() for b in batches))
    values = L.loss_surface(centre.model, directions, np.concatenate([points, np.zeros((1, args.dims))]), batches)
    losses, at_centre = values[:-1].reshape([args.grid] * args.dims), values[-1]

    run_dir = centre.run_dir  # beside the run, also one whose checkpoints were saved elsewhere (locate.run_dir_of)
    out = args.out or run_dir / default_name(args, centre.step)
    title = f"{data.main_split} loss around step {centre.step} of {run_dir.name} ({tokens} target tokens)"
    draw(out, grids, losses, names, placed, centre.step, title)
    print(
        f"{out}: the {data.main_split} loss ({len(batches)} batch(es), {tokens} target tokens) at {points.shape[0]} "
        f"points around step {centre.step}; " + "; ".join(f"direction {j + 1}: {n}" for j, n in enumerate(names))
    )
    print(f"  loss at the centre {at_centre:.4f}, lowest on the grid {losses.min():.4f}, highest {losses.max():.4f}")
    for s, (coords, residual) in sorted(placed.items()):
        print(
            f"  step {s}: at ({', '.join(f'{c:.3g}' for c in coords)}), {residual:.0%} of its offset off the "
            f"{'line' if args.dims == 1 else 'plane'}"
        )
    return {"out": out, "losses": losses, "placed": placed}


def default_name(args: argparse.Namespace, step: int) -> str:
    """The picture's name beside the run: its centre and its directions, so that landscapes of one run around one step
    along other directions (a line, a plane, another seed) do not overwrite each other."""
    random = f"random{'-vectors' if args.include_vectors else ''}-seed{args.seed}"
    if args.to_step is not None or args.last_update:  # a plane's second direction is random (choose_directions)
        kind = f"to{args.to_step}" if args.to_step is not None else "last-update"
        kind += f"-{random}" if args.dims == 2 else ""
    else:
        kind = "pca" if args.pca else random
    return f"landscape-step{step}-{kind}-{args.dims}d.png"


def choose_directions(
    args: argparse.Namespace, centre, params: dict, offsets: dict, checkpoints: Path
) -> tuple[list, list[str], list[tuple[float, float] | None]]:
    """The directions the arguments ask for, a name for each, and each one's default span (None: the checkpoints')."""
    import jax
    import numpy as np

    from training.analysis import landscape as L

    key = jax.random.PRNGKey(args.seed)
    toward = args.to_step is not None or args.last_update
    random = [
        L.filter_normalised(centre.model, jax.random.fold_in(key, j), args.include_vectors)
        for j in range(0 if args.pca else args.dims - 1 if toward else args.dims)
    ]
    if args.pca:
        if len(offsets) < args.dims:
            raise CheckpointError(
                f"--pca: {args.dims} directions need {args.dims} saved checkpoints besides the "
                f"centre; {checkpoints} has {len(offsets)}"
            )
        names = [f"principal direction {j + 1} of the trajectory" for j in range(args.dims)]
        return L.principal_directions(list(offsets.values()), args.dims), names, [None] * args.dims
    if not toward:
        return random, [f"random, filter-normalised (seed {args.seed})"] * args.dims, [(-1.0, 1.0)] * args.dims
    steps = sorted(params)
    if args.to_step is not None:
        if args.to_step not in offsets:
            raise CheckpointError(
                f"--to-step: step {args.to_step} is not a saved checkpoint other than the centre "
                f"({centre.step}); saved: {', '.join(map(str, steps))}"
            )
        first, names, spans = offsets[args.to_step], [f"toward step {args.to_step}"], [(-0.5, 1.5)]
    else:
        before = [s for s in steps if s < centre.step]
        if not before:
            raise CheckpointError(f"--last-update: no checkpoint before step {centre.step} is saved")
        first = L.difference(params[centre.step], params[max(before)])
        names, spans = [f"last update: step {centre.step} - step {max(before)}"], [(-1.5, 1.5)]
    directions = [first]
    if args.dims == 2:
        directions.append(L.orthogonal_to(random[0], first, float(np.sqrt(L.dot(first, first)))))
        names.append("random, orthogonal to 1, same length")
        spans.append((-1.0, 1.0))
    return directions, names, spans


def span_of(given: list[float] | None, coords: list[float], default: tuple[float, float] | None) -> tuple[float, float]:
    """`given`, else `default` widened (with a margin) to hold the centre and every checkpoint's coordinate."""
    if given is not None:
        return float(given[0]), float(given[1])
    lo, hi = min(coords + [0.0]), max(coords + [0.0])
    if default is not None and default[0] <= lo and hi <= default[1]:
        return default
    pad = 0.15 * (hi - lo) if hi > lo else 1.0
    lo, hi = lo - pad, hi + pad
    return (lo, hi) if default is None else (min(lo, default[0]), max(hi, default[1]))


def draw(out: Path, grids: list, losses, names: list[str], placed: dict, centre: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 5.5) if len(grids) == 2 else (7.5, 4.5))
    order = sorted(placed)
    if len(grids) == 1:
        ax.plot(grids[0], losses, color="C0", label="loss")
        xs = [placed[s][0][0] for s in order]
        ax.plot(xs, np.interp(xs, grids[0], losses), "o", color="C3", ms=5, label="checkpoints, projected")
        for s, x in zip(order, xs):
            ax.annotate(
                str(s), (x, np.interp(x, grids[0], losses)), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        ax.plot([0], [np.interp(0.0, grids[0], losses)], "*", ms=12, color="k", label=f"step {centre} (centre)")
        ax.set(xlabel=f"direction 1: {names[0]}", ylabel="loss per token")
    else:
        levels = np.unique(np.quantile(losses, np.linspace(0, 1, 25)))
        filled = ax.contourf(grids[0], grids[1], losses.T, levels=levels, cmap="viridis")
        ax.contour(grids[0], grids[1], losses.T, levels=levels, colors="white", linewidths=0.3, alpha=0.6)
        fig.colorbar(filled, ax=ax, label="loss per token")
        path = sorted([*order, centre])
        xy = {s: (0.0, 0.0) if s == centre else tuple(placed[s][0]) for s in path}
        ax.plot(
            [xy[s][0] for s in path],
            [xy[s][1] for s in path],
            "o-",
            color="C3",
            ms=4,
            lw=1,
            label="checkpoints, projected (by step)",
        )
        for s in order:
            ax.annotate(
                str(s),
                xy[s],
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.6},
            )
        ax.plot([0], [0], "*", ms=14, color="k", mec="white", label=f"step {centre} (centre)")
        ax.set(xlabel=f"direction 1: {names[0]}", ylabel=f"direction 2: {names[1]}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_picture(fig, out, "landscape", 100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
