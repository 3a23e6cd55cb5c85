"""Greedy learning-rate schedule search, segment by segment (as trainit searches schedules).

    python -m scripts.experiments.schedule_search --segments 4 --segment-steps 50 --lrs 1e-3,3e-3,1e-2 --factors 0.5,1 \
        --out runs/schedule_search -- model=gpt2-micro optimizer=adamw

The first segment trains from scratch at each of `--lrs` (one Hydra multirun); the best by smoothed train loss (the
mean of the segment's last `--smooth` steps) wins. Each later segment branches from the winner's checkpoint into
the candidates `--factors` x the winner's lr (a multirun of `checkpoint.load=true`, each job continuing the same
optimizer state with its own lr), keeps the best, and continues from it. The lr is constant within a segment.

Written to `<out>/schedule.json` (and with `--plot`, `<out>/schedule.png`) and printed: the found schedule as a
`piecewise_linear` lr_config (a repeated boundary is a jump: `boundaries=[S,S,2S,2S,...]`), the overrides that run it
from scratch, and each segment's candidates with their smoothed losses. With `--verify`, that run from scratch is
made too and its train losses are compared with the search's (the winners' segments, joined): they are the same,
step for step, because every search job ran the same schedule function on the steps it trained and a batch is a
function of (seed, step).

Arguments after `--` are Hydra overrides for every run (model, optimizer, data, ...); `optimizer.lr_config` and the
checkpoint and logging keys the search needs are set here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from core.arguments import OneLineParser, at_least
from core.errors import PipelineError
from training.checkpoints.storage import check_writable
from training.cli.sweep import run_sweep
from training.reporting.summary import finite_number, latest_per_step, read_metrics

ROOT = Path(__file__).resolve().parents[2]


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def numbers(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(fail(f"{what}: comma-separated numbers, e.g. 1e-3,3e-3; got {text!r}")) from None
    if not values or any(v <= 0 for v in values):
        raise SystemExit(fail(f"{what}: positive numbers; got {text!r}"))
    return values


def schedule_overrides(lrs: list[float], segment_steps: int, warmup: int) -> list[str]:
    """`piecewise_linear` constant at lrs[i] on segment i (absolute steps [i S, (i+1) S)), boundaries counted after
    the warmup (which ramps to lrs[0])."""
    boundaries, values = [], []
    for i, lr in enumerate(lrs):
        if i > 0:  # the jump into segment i
            boundaries.append((i * segment_steps) - warmup)
            values.append(lr)
        boundaries.append((i + 1) * segment_steps - warmup)
        values.append(lr)
    return [
        "optimizer/lr_config=piecewise_linear",
        f"optimizer.lr_config.lr={lrs[0]!r}",
        f"optimizer.lr_config.warmup={warmup}",
        f"optimizer.lr_config.boundaries=[{','.join(map(str, boundaries))}]",
        f"optimizer.lr_config.boundary_lrs=[{','.join(repr(v) for v in values)}]",
    ]


def train_losses(run_dir: Path) -> dict[int, float]:
    rows = latest_per_step(read_metrics(run_dir))
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train" and "loss" in r}


def smoothed_loss(losses: dict[int, object], end: int, smooth: int) -> float | None:
    """The mean train loss of steps end - smooth + 1 .. end, or None when one is missing or not a finite number
    (a diverged candidate logs "nan")."""
    tail = [losses.get(s) for s in range(end - smooth + 1, end + 1)]
    return sum(tail) / smooth if all(map(finite_number, tail)) else None


def multirun(sweep_dir: Path, overrides: list[str]) -> list[dict]:
    """One Hydra multirun; its jobs' records (training/cli/sweep.py's sweep.json)."""
    try:
        return run_sweep(sweep_dir, overrides)["jobs"]
    except PipelineError as e:
        raise SystemExit(fail(str(e))) from None


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each value and the up to window - 1 before it."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def plot_search(result: dict, out: Path, window: int = 1) -> None:
    """Every candidate's train loss over its segment, averaged over `window` steps (the winners bold), and the found
    lr per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, lr_ax) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=[3, 1.3])
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour: dict[str, str] = {}  # one colour per lr, labelled once
    for seg in result["segments"]:
        for candidate in seg["candidates"]:
            losses = train_losses(Path(candidate["run_dir"]))
            steps = [s for s in range(seg["steps"][0], seg["steps"][1] + 1) if s in losses]
            won = candidate["run_dir"] == seg["best"]["run_dir"]
            name = f"lr {candidate['lr']:.3g}"
            new = name not in colour
            colour.setdefault(name, palette[len(colour) % len(palette)])
            loss_ax.plot(
                steps,
                moving_average([losses[s] for s in steps], window),
                color=colour[name],
                lw=2.2 if won else 0.8,
                alpha=1.0 if won else 0.6,
                label=name if new else None,
            )
        loss_ax.axvline(seg["steps"][1] + 0.5, color="grey", lw=0.5, ls=":")
    steps = sorted(int(s) for s in result["train_losses"])
    lrs = [result["lrs"][min((s - 1) // result["segment_steps"], len(result["lrs"]) - 1)] for s in steps]
    lr_ax.step(steps, lrs, where="post", color="black")
    lr_ax.set_yscale("log")
    lr_ax.set_ylabel("found lr")
    lr_ax.set_xlabel("step")
    loss_ax.set_ylabel("train loss" + (f" ({window}-step mean)" if window > 1 else ""))
    loss_ax.set_title("greedy schedule search: each segment's candidates (bold: the one continued)")
    for ax in (loss_ax, lr_ax):
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    argv, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=4, help="segments of the schedule")
    parser.add_argument("--segment-steps", type=int, default=50, help="optimizer steps per segment")
    parser.add_argument("--lrs", default="1e-3,3e-3,1e-2", help="the first segment's candidate lrs")
    parser.add_argument("--factors", default="0.5,1", help="later segments' candidates: these x the last winner's lr")
    parser.add_argument(
        "--smooth",
        type=at_least(0),
        default=0,
        help="steps of the segment's end whose mean train loss ranks the candidates (default: a quarter segment)",
    )
    parser.add_argument("--warmup", type=int, default=0, help="warmup steps of the first segment, ramping to its lr")
    parser.add_argument("--out", default="runs/schedule_search", help="directory of the search's runs and results")
    parser.add_argument("--verify", action="store_true", help="also run the found schedule from scratch and compare")
    parser.add_argument(
        "--plot", action="store_true", help="also draw <out>/schedule.png: the candidates' losses and the found lr"
    )
    args = parser.parse_args(argv)
    if args.segments < 1 or args.segment_steps < 1:
        return fail("--segments and --segment-steps: at least 1")
    if not 0 <= args.warmup < args.segment_steps:
        return fail(f"--warmup: in [0, --segment-steps={args.segment_steps}); got {args.warmup}")
    first, factors = numbers(args.lrs, "--lrs"), numbers(args.factors, "--factors")
    smooth = args.smooth or max(args.segment_steps // 4, 1)
    if smooth > args.segment_steps:
        return fail(f"--smooth: at most --segment-steps={args.segment_steps}; got {smooth}")
    out = Path(args.out).absolute()
    try:
        check_writable("--out", out)  # a file in the way: one line, before any run
    except PipelineError as e:
        return fail(str(e))
    out.mkdir(parents=True, exist_ok=True)
    S = args.segment_steps
    common = [
        *extra,
        "train.log_interval=1",
        f"train.eval_interval={args.segments * S}",
        "checkpoint.save=true",
        "checkpoint.save_steps=null",
    ]

    found: list[float] = []
    segments, parent = [], None
    for i in range(args.segments):
        candidates = first if i == 0 else sorted({found[-1] * f for f in factors})
        schedules = [schedule_overrides([*found, lr], S, args.warmup) for lr in candidates]
        # one multirun over the candidates: every schedule key is the same but the last lr list (and, first, the lr)
        # (first, the lr, which the one boundary lr then names: a multirun over two keys would cross them)
        varying = 1 if i == 0 else 4
        overrides = list(schedules[0])
        key = overrides[varying].split("=", 1)[0]
        overrides[varying] = f"{key}=" + ",".join(s[varying].split("=", 1)[1] for s in schedules)
        if i == 0:
            overrides[4] = "optimizer.lr_config.boundary_lrs=[${optimizer.lr_config.lr}]"
        # each job continues the winner's checkpoint at the segment's start into its own run directory
        resume = (
            []
            if parent is None
            else [
                "checkpoint.load=true",
                f"checkpoint.load_path='{parent}'",
                f"checkpoint.load_file={i * S}",
                "checkpoint.overwrite_config=true",
                "checkpoint.save_path=${logging.run_dir}/checkpoints",
            ]
        )
        jobs = multirun(out / f"segment{i}", [*common, *overrides, f"train.max_steps={(i + 1) * S}", *resume])
        ranked = []
        for lr, job in zip(candidates, sorted(jobs, key=lambda j: j["job"])):
            done = job["status"] == "completed"  # a job never started has no run directory
            loss = smoothed_loss(train_losses(Path(job["run_dir"])), (i + 1) * S, smooth) if done else None
            ranked.append({"lr": lr, "smoothed_loss": loss, "run_dir": job.get("run_dir")})
        finished = [r for r in ranked if r["smoothed_loss"] is not None]
        if not finished:
            return fail(f"segment {i}: no candidate finished (see {out / f'segment{i}'})")
        best = min(finished, key=lambda r: r["smoothed_loss"])
        found.append(best["lr"])
        parent = best["run_dir"]
        segments.append({"segment": i, "steps": [i * S + 1, (i + 1) * S], "candidates": ranked, "best": best})
        print(
            f"segment {i} (steps {i * S + 1}-{(i + 1) * S}): "
            + ", ".join(
                f"lr {r['lr']:.3g} -> {r['smoothed_loss']:.4f}"
                if r["smoothed_loss"] is not None
                else f"lr {r['lr']:.3g} -> failed"
                for r in ranked
            )
            + f"; best {best['lr']:.3g}",
            flush=True,
        )

    schedule = schedule_overrides(found, S, args.warmup)
    search_losses: dict[int, float] = {}
    for seg in segments:
        losses = train_losses(Path(seg["best"]["run_dir"]))
        search_losses |= {s: losses[s] for s in range(seg["steps"][0], seg["steps"][1] + 1) if s in losses}
    result = {
        "lrs": found,
        "segment_steps": S,
        "smooth": smooth,
        "overrides": [*schedule, f"train.max_steps={args.segments * S}"],
        "segments": segments,
        "train_losses": search_losses,
    }
    if args.verify:
        run_dir = out / "from_scratch"
        command = [
            sys.executable,
            "-m",
            "train_jax",
            *common,
            *result["overrides"],
            f"logging.run_dir={run_dir}",
            "checkpoint.save=false",
        ]
        print("$ python train_jax.py", " ".join(command[3:]), flush=True)
        if subprocess.run(command).returncode != 0:
            return fail("the run from scratch failed (see its output above)")
        scratch = train_losses(run_dir)
        result["from_scratch"] = {
            "run_dir": str(run_dir),
            "same_losses": scratch == search_losses,
            "differing_steps": sorted(s for s in search_losses if scratch.get(s) != search_losses[s]),
        }
    (out / "schedule.json").write_text(json.dumps(result, indent=1))
    if args.plot:
        plot_search(result, out / "schedule.png", smooth)
    print("found: lrs " + ", ".join(f"{lr:.3g}" for lr in found) + f" over segments of {S} steps")
    print("run it from scratch: python train_jax.py " + " ".join(extra + result["overrides"]))
    if args.verify:
        same = result["from_scratch"]["same_losses"]
        print(
            f"from scratch: {'the same train losses at every step' if same else 'DIFFERENT losses at steps '}"
            f"{'' if same else result['from_scratch']['differing_steps'][:10]}"
        )
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
