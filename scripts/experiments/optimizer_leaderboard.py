"""The optimizer leaderboard: every registered optimizer at its own optimum, compared at the end of training.

    bash scripts/experiments/optimizer_leaderboard.sh  # this machine's board (2 CPU cores: about an hour)
    bash scripts/experiments/optimizer_leaderboard.sh --gpu              # gpt2-mini, longer runs: where a GPU is lent
    bash scripts/experiments/optimizer_leaderboard.sh --track optimization   # the speedrun's optimization track's model
    python -m scripts.experiments.optimizer_leaderboard --only adamw,lion --out /tmp/board   # a part of it
    python -m scripts.experiments.optimizer_leaderboard --summarize runs/leaderboard         # the table and plot again

Each optimizer is tuned as Wen et al. (2025) insist, around its own preset (conf/optimizer/<name>.yaml): its step
size on a grid of factor-2 steps (5 points, centred on the preset's), grown by a point past whichever edge wins until
the best point is interior (up to --grow points a side); then, at that step size, its most sensitive other knob the
same way from 3 points (factor-2 steps of the knob, or of 1 - beta for a momentum); each point a full run at the same
token budget on pystdlib, seed 0, the lowest final `val` loss winning. The winner then runs again with seed 1, and
the board ranks the mean of the two, with their spread, marking a gap to the next row smaller than the larger spread
of the two (or than the board's median spread) as within noise. The presets' values (the board's commit) come from
this table.

A folder holds one board: its records say the overrides, steps and tokens a step they were tuned at, and a command
whose board differs from theirs is refused before it runs anything (another budget goes in another --out).

Written: `<out>/leaderboard.md` and `.json` (per optimizer: the mean and spread over seeds, each grid's points and
losses, whether its best is interior, the tokens it took to reach AdamW's final loss, tokens/s) and
`leaderboard.png` (each winner's val curve); with `--docs`, copies of the .md and .png in docs/ under the board's
name (`optimizer_leaderboard`, `_optimization_track` for that track's, `_gpu` for a --gpu board's), read from the
records with `--summarize`, as `--presets` reads which board it writes from.

This module runs and tunes the board; what a board is (its runs, plans, seeds and records) is in
leaderboard_settings.py, the table and plot in leaderboard_table.py, the writing of the presets in
leaderboard_presets.py.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from core.arguments import OneLineParser, at_least
from core.errors import ConfigError, PipelineError, say
from scripts.experiments.leaderboard_presets import write_presets
from scripts.experiments.leaderboard_settings import (
    FLAT,
    PLANS,
    ROOT,
    SEEDS,
    TRACK_MODELS,
    board_kind,
    board_run,
    board_settings,
    check_boards,
    docs_name,
    loss_of,
    preset_centres,
    read_records,
    text,
    tokens_per_step,
)
from scripts.experiments.leaderboard_table import summarize
from training.checkpoints.storage import check_writable


def ladder(centre: float, scale: str, k: int) -> float | None:
    """The k-th point from the centre of a grid (None past the knob's range). A beta's steps halve or double 1 - beta;
    the step that would cross 0 lands on 0 (no momentum), the range's end."""
    if scale == "log":
        return centre * 2.0**k
    value = 1 - (1 - centre) * 2.0**k  # "beta"
    if value < 0 and 1 - (1 - centre) * 2.0 ** (k - 1) > 0:
        return 0.0
    return value if 0 <= value < 1 else None


def sweep(out: Path, name: str, overrides: list[str]) -> dict:
    """One Hydra multirun into `<out>/<name>` (training/cli/sweep.py's runner: a finished one is read, not rerun), its
    output in `<out>/<name>.log`; what its sweep.json holds."""
    from training.cli.sweep import run_sweep

    if (out / name / "sweep.json").exists():
        return run_sweep(out / name, overrides)
    with open(out / f"{name}.log", "w") as log:
        return run_sweep(out / name, overrides, log)


def value_of(job: dict, key: str) -> float:
    return float(next(o.split("=", 1)[1] for o in job["overrides"] if o.startswith(key + "=")))


def grid(out: Path, tag: str, base: list[str], key: str, centre: float, scale: str, points: int, grow: int) -> dict:
    """A grid of `key` around `centre` (`points` points), grown by a point past a winning edge up to `grow` times
    per side. Returns {"best": job, "points": [[value, val loss], ...] in order, "edge": None when the best point is
    interior, "range" when it is the knob's last valid value, "grid" when the growth ran out}."""
    jobs: dict[int, dict | None] = {}

    def run(ks: list[int], name: str) -> None:
        values = {k: ladder(centre, scale, k) for k in ks}
        summary = sweep(out, name, [*base, f"{key}={','.join(text(v) for v in values.values())}"])
        for k, v in values.items():
            jobs[k] = next((j for j in summary["jobs"] if math.isclose(value_of(j, key), float(text(v)))), None)

    half = points // 2
    run([k for k in range(-half, half + 1) if ladder(centre, scale, k) is not None], tag)
    grown = {-1: 0, 1: 0}
    while True:
        best = min(jobs, key=lambda k: loss_of(jobs[k]))
        side = -1 if best == min(jobs) else 1 if best == max(jobs) else 0
        nxt = best + side
        inner = jobs.get(best - side)
        if (
            side == 0
            or (grown[side] > 0 and inner is not None and loss_of(inner) - loss_of(jobs[best]) < FLAT)
            or grown[side] >= grow
            or ladder(centre, scale, nxt) is None
            or not math.isfinite(loss_of(jobs[best]))
        ):
            break
        grown[side] += 1
        run([nxt], f"{tag}{nxt:+d}")
    ks = sorted(jobs)
    edge = None if ks[0] < best < ks[-1] else "range" if ladder(centre, scale, nxt) is None else "grid"
    winner = jobs[best] if math.isfinite(loss_of(jobs[best])) else None  # None: no point completed
    return {"best": winner, "points": [[ladder(centre, scale, k), loss_of(jobs[k])] for k in ks], "edge": edge}


def choose(out: Path, tag: str, base: list[str], key: str, values: tuple) -> dict:
    """A choice between values of `key` (the preset's is already run)."""
    summary = sweep(out, tag, [*base, f"{key}={','.join(map(str, values))}"])
    return {
        "best": summary.get("best"),
        "points": [[value_of(j, key), loss_of(j)] for j in summary["jobs"]],
        "edge": None,
    }


def seed_run(out: Path, name: str, overrides: list[str], seed: int) -> dict | None:
    """The winner's run with another seed: `<name>-seed<seed>`, or a new directory beside it when the one there ran
    other values (a winner that changed since)."""
    wanted = [*overrides, f"train.seed={seed}"]
    for n in range(100):
        tag = f"{name}-seed{seed}" + (f"-{n}" if n else "")
        if not (out / tag / "sweep.json").exists():
            return sweep(out, tag, wanted).get("best")
        jobs = json.loads((out / tag / "sweep.json").read_text())["jobs"]
        if jobs and sorted(jobs[0]["overrides"]) == sorted(wanted):
            return sweep(out, tag, wanted).get("best")
    return None


def tune(out: Path, name: str, centres: tuple, board: dict, points: int, knob_points: int, grow: int) -> dict | None:
    """The optimizer's step-size grid, then its knob's at the best step size, then the winner's other seeds: its
    record, written to `<out>/<name>.winner.json` with the `board` it was tuned on (`board_settings`; a record there
    already is read, not tuned again: `check_boards` has made sure it is of this board)."""
    record_path = out / f"{name}.winner.json"
    if record_path.exists():
        return json.loads(record_path.read_text())
    plan = PLANS[name]
    centre, knob_centre = centres
    base = [f"optimizer={name}", *board["run"], f"train.seed={SEEDS[0]}"]
    started = time.time()
    step_grid = grid(out, f"{name}-step", base, plan.step, centre, "log", points, grow)
    if step_grid["best"] is None:
        print(f"{name}: no grid point completed; see {out}/{name}-step*.log", flush=True)
        return None
    best_step = f"{plan.step}={text(value_of(step_grid['best'], plan.step))}"
    knob_grid = None
    if plan.knob is not None:
        at = [*base, best_step]
        knob_grid = (
            choose(out, f"{name}-knob", at, plan.knob, tuple(v for v in plan.choices if v != knob_centre))
            if plan.scale == "choice"
            else grid(out, f"{name}-knob", at, plan.knob, knob_centre, plan.scale, knob_points, grow)
        )
    winner = min([g["best"] for g in (step_grid, knob_grid) if g and g["best"]], key=loss_of)
    tuned = [o for o in winner["overrides"] if o.split("=")[0] in (plan.step, plan.knob)]
    if plan.knob is not None and not any(o.startswith(plan.knob + "=") for o in tuned):
        tuned.append(f"{plan.knob}={knob_centre}")
    overrides = [o for o in winner["overrides"] if not o.startswith("train.seed=")]
    seeds = [winner] + [seed_run(out, name, overrides, s) for s in SEEDS[1:]]
    record = {
        "optimizer": name,
        "board": board,
        "knob_centre": knob_centre,
        "overrides": overrides,
        "tuned": tuned,
        "step_grid": step_grid,
        "knob_grid": knob_grid,
        "seeds": [{"seed": s, "run_dir": j and j["run_dir"], "val_loss": loss_of(j)} for s, j in zip(SEEDS, seeds)],
        "wall_s": round(time.time() - started, 1),
    }
    record_path.write_text(json.dumps(record, indent=1))
    print(f"{name}: tuned {' '.join(tuned)} in {record['wall_s']:.0f} s", flush=True)
    return record


def main(argv: list[str]) -> int:
    from optimizers import OPTIMIZERS

    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/leaderboard", help="where the sweeps and the board go")
    parser.add_argument("--only", default="", help="comma-separated optimizers (default: every one with a plan)")
    parser.add_argument("--steps", type=at_least(1), default=80, help="steps of every run (the token budget)")
    centred = "centred on the preset's: an even count gets one more"
    parser.add_argument(
        "--points", type=at_least(3), default=5, help=f"each grid's first points (factor-2 steps; {centred})"
    )
    parser.add_argument("--knob-points", type=at_least(3), default=3, help=f"the knob grid's first points ({centred})")
    parser.add_argument("--grow", type=at_least(0), default=2, help="points a grid may grow past each edge")
    parser.add_argument(
        "--parallel", type=at_least(1), default=1, help="optimizers tuned at once (each its own process)"
    )
    parser.add_argument("--gpu", action="store_true", help="the larger board: gpt2-mini, batch 32, bfloat16")
    parser.add_argument(
        "--track",
        choices=sorted(TRACK_MODELS),
        default="gpt2",
        help="the model every run trains: GPT-2's, or the speedrun's optimization track's fixed model (opt-track)",
    )
    parser.add_argument("--summarize", metavar="OUT", help="only rebuild the table and plot of a board in OUT")
    parser.add_argument("--presets", action="store_true", help="write the tuned values into conf/optimizer/*.yaml")
    parser.add_argument("--docs", action="store_true", help="also copy leaderboard.md and .png into docs/")
    args, extra = parser.parse_known_args(argv)
    if args.presets and args.track != "gpt2":
        print("error: --presets: the presets are tuned on the GPT-2 board; drop --track or --presets", file=sys.stderr)
        return 2
    run = [
        *board_run(args.track, args.gpu),
        f"train.max_steps={args.steps}",
        f"train.eval_interval={max(args.steps // 4, 1)}",
        *extra,
    ]
    out = Path(args.summarize or args.out)
    try:
        board = None if args.summarize else board_settings(run, args.steps, tokens_per_step(run))
        names = [] if args.summarize else [n for n in (args.only.split(",") if args.only else PLANS) if n]
        if not args.summarize and not names:  # `--only ,`
            raise ConfigError(f"--only: names no optimizer; plans exist for {', '.join(PLANS)}")
        unknown = [n for n in names if n not in PLANS or n not in OPTIMIZERS]
        if unknown:
            raise ConfigError(f"--only: no tuning plan for {', '.join(unknown)}; plans exist for {', '.join(PLANS)}")
        check_writable("--summarize" if args.summarize else "--out", out)  # a file in the way: before any run
        records = read_records(out)
        if not args.summarize:  # before a run: a board is tuned on one budget and model
            check_boards(records, out, board)
        # what --presets and --docs write is the board's, read from its records when summarizing one
        track, gpu = board_kind(check_boards(records, out)) if args.summarize else (args.track, args.gpu)
        if args.presets and track != "gpt2":
            raise ConfigError(f"--presets: {out} is the {track} track's board; the presets are tuned on GPT-2's")
        if not args.summarize:
            out.mkdir(parents=True, exist_ok=True)
            centres = preset_centres(names)
            with ThreadPoolExecutor(max(args.parallel, 1)) as pool:
                list(
                    pool.map(lambda n: tune(out, n, centres[n], board, args.points, args.knob_points, args.grow), names)
                )
        summarize(out)
        if args.presets:
            print("\n".join(write_presets(out)))
    except PipelineError as e:
        return say(e)
    if args.docs:
        name = docs_name(track, gpu)
        for suffix in ("md", "png"):
            shutil.copy(out / f"leaderboard.{suffix}", ROOT / "docs" / f"{name}.{suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
