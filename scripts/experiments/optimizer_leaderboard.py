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
`leaderboard.png` (each winner's val curve); with `--docs`, copies of the .md and .png in docs/.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError, PipelineError, say
from training.checkpoints.storage import check_writable
from training.config import layout

ROOT = Path(__file__).resolve().parents[2]

# The board's runs: gpt2-micro on pystdlib, context 128, batch 8 (1,024 tokens a step), no checkpoints; the budget
# (steps) is a flag, each preset's own schedule (its warmup and floor are fractions of the run). Evaluations every
# quarter of the run give the curves.
CPU_RUN = [
    "model=gpt2-micro",
    "dataset.context_size=128",
    "train.batch_size=8",
    "train.eval_iters=4",
    "checkpoint.save=false",
    "logging.wandb=disabled",
    "logging.plot=false",
    "logging.tensorboard=false",
    "logging.progress=lines",
]
GPU_RUN = [
    "model=gpt2-mini",
    "train.batch_size=32",
    "train.eval_iters=20",
    "checkpoint.save=false",
    "logging.wandb=disabled",
    "logging.plot=false",
    "logging.progress=lines",
    "system.dtype=bfloat16",
]
# --track optimization: the speedrun's optimization track's fixed model (conf/model/opt-track.yaml) instead of GPT-2,
# at the board's size: opt-track-micro (gpt2-micro's size) on the CPU, opt-track itself (context 1,024) with --gpu.
TRACK_MODELS = {"gpt2": ("gpt2-micro", "gpt2-mini"), "optimization": ("opt-track-micro", "opt-track")}
# val loss per token: a grid's edge point better than its neighbour by less is a flat grid, not an optimum past it
FLAT = 0.002
SEEDS = (0, 1)  # the grids run the first; the winner runs every one
LR = "optimizer.lr_config.lr"


@dataclass(frozen=True)
class Plan:
    """How an optimizer is tuned: the key of its step size, then its most sensitive other knob, stepped as `scale`
    says: "log" (x2), "beta" (1 - value x2: a momentum or averaging constant), or "choice" (`choices`: the preset's
    value, which the step grid's best already ran, against the others)."""

    step: str
    knob: str | None = None
    scale: str = "log"
    choices: tuple = ()


PLANS = {
    "adamw": Plan(LR, "optimizer.beta2", "beta"),
    "adam": Plan(LR, "optimizer.beta2", "beta"),
    "nadam": Plan(LR, "optimizer.beta2", "beta"),
    "nadamw": Plan(LR, "optimizer.beta2", "beta"),
    "sgdm": Plan(LR, "optimizer.momentum", "beta"),
    "rmsprop": Plan(LR, "optimizer.decay", "beta"),
    "lion": Plan(LR, "optimizer.beta2", "beta"),
    "signum": Plan(LR, "optimizer.momentum", "beta"),
    "muon": Plan(LR, "optimizer.groups.adam.lr_multiplier"),  # the embedding's and vectors' AdamW lr : Muon's
    "adafactor": Plan(LR, "optimizer.decay_rate", "beta"),
    "ademamix": Plan(LR, "optimizer.alpha"),
    "mars": Plan(LR, "optimizer.gamma"),
    "adam_mini": Plan(LR, "optimizer.beta2", "beta"),
    "scion": Plan(LR, "optimizer.momentum", "beta"),  # its authors advise 0.5 for short runs
    # the vocabulary's side of the embedding preconditioned (10000 >= 4,096) or not (2048), as at GPT-2's 50k
    "soap": Plan(LR, "optimizer.max_precond_dim", "choice", (10000, 2048)),
    "schedule_free_adamw": Plan("optimizer.sf_lr", "optimizer.beta1", "beta"),
    "schedule_free_sgd": Plan("optimizer.sf_lr", "optimizer.momentum", "beta"),
    "sophia": Plan(LR, "optimizer.gamma"),
    "kron": Plan(LR, "optimizer.max_size_triangular", "choice", (8192, 2048)),  # triangular or diagonal vocabulary
    "prodigy": Plan(LR, "optimizer.d0"),  # lr multiplies Prodigy's estimate d (d_coef does the same); d0 starts d
    "dadapt_adamw": Plan(LR, "optimizer.d0"),
    "cocob": Plan("optimizer.alpha"),  # no step size: alpha caps the early bets
}


def ladder(centre: float, scale: str, k: int) -> float | None:
    """The k-th point from the centre of a grid (None past the knob's range). A beta's steps halve or double 1 - beta;
    the step that would cross 0 lands on 0 (no momentum), the range's end."""
    if scale == "log":
        return centre * 2.0**k
    value = 1 - (1 - centre) * 2.0**k  # "beta"
    if value < 0 and 1 - (1 - centre) * 2.0 ** (k - 1) > 0:
        return 0.0
    return value if 0 <= value < 1 else None


def text(value: float) -> str:
    return f"{value:.6g}"


def preset_centres(names: list[str]) -> dict[str, tuple]:
    """Each preset's step size and knob, as `python train_jax.py optimizer=<name>` composes them."""
    from omegaconf import OmegaConf

    from training.config.compose import compose_config

    centres = {}
    for name in names:
        cfg, plan = compose_config([f"optimizer={name}"]), PLANS[name]
        centres[name] = (OmegaConf.select(cfg, plan.step), plan.knob and OmegaConf.select(cfg, plan.knob))
    return centres


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


def loss_of(job: dict | None) -> float:
    return job["val_loss"] if job and job.get("status") == "completed" and math.isfinite(job["val_loss"]) else math.inf


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


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, val loss per token, val nats per byte) at each evaluation."""
    rows = [json.loads(line) for line in (run_dir / layout.METRICS).read_text().splitlines()]
    return [(r["step"], r["loss"], r["nats_per_byte"]) for r in rows if r["split"] == "val"]


def edge_of(g: dict) -> str | None:
    """The grid's edge verdict: None (its best is interior), "range" (the knob's last valid value), "flat" (the best is
    at the edge but the grid is flat there: within FLAT of its neighbour) or "grid" (an optimum past the edge)."""
    if g["edge"] != "grid":
        return g["edge"]
    losses = [loss for _, loss in g["points"]]
    at = losses.index(min(losses))
    neighbour = losses[1] if at == 0 else losses[-2]
    return "flat" if neighbour - losses[at] < FLAT else "grid"


def grid_text(g: dict | None, key: str, points: list | None = None) -> str:
    """`key` best (of n points, e.g. 1e-4..4e-3)[, at its edge]; `points`: the grid's, or with the preset's added."""
    points = points or (g and g["points"])
    if not points or not any(math.isfinite(loss) for _, loss in points):
        return ""
    values = [v for v, _ in points]
    best = min(points, key=lambda p: p[1])[0]
    note = {None: "", "range": ", its range's end", "flat": ", flat at the edge", "grid": ", AT THE GRID'S EDGE"}[
        edge_of(g)
    ]
    span = f"{text(min(values))}..{text(max(values))}" if len(values) > 2 else "/".join(text(v) for v in values)
    return f"{key.removeprefix('optimizer.')}={text(best)} ({len(values)}: {span}{note})"


def board_settings(run: list[str], steps: int, tokens_per_step: int) -> dict:
    """What makes two records of one board: the overrides every run shares, the steps and the tokens a step."""
    return {"run": run, "steps": steps, "tokens_per_step": tokens_per_step}


def read_records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.winner.json"))]


def check_boards(records: list[dict], out: Path, board: dict | None = None) -> dict:
    """The one board every record in `out` was tuned on (and `board`, when given: this invocation's); else a
    PipelineError naming what differs, so that no table ranks runs of other budgets or models together."""
    boards = [(r["optimizer"], r.get("board")) for r in records]
    if board is not None:
        boards.append(("this command", board))
    unknown = [name for name, b in boards if b is None]
    if unknown:
        raise PipelineError(
            f"{out}: {', '.join(unknown)} tuned before boards recorded their settings: tune it again in a new --out"
        )
    if not boards:  # --summarize or --presets on a folder no tuning wrote into
        raise PipelineError(f"{out}: holds no tuned optimizer's record (<name>.winner.json); tune with --out {out}")
    first_name, first = boards[0]
    for name, b in boards[1:]:
        if b != first:
            differs = [f"{k} {b[k]:,} against {first[k]:,}" for k in ("steps", "tokens_per_step") if b[k] != first[k]]
            if b["run"] != first["run"]:
                ours, theirs = ([o for o in x["run"] if o not in y["run"]] for x, y in ((b, first), (first, b)))
                differs.append(f"overrides {' '.join(ours) or '(none)'} against {' '.join(theirs) or '(none)'}")
            raise PipelineError(
                f"{out}: {name} and {first_name} are of different boards ({'; '.join(differs)}); choose another "
                "--out for another board"
            )
    return first


def knob_points(r: dict, centres: dict) -> list[list]:
    """The record's knob grid as [value, loss] points; a choice's with the preset's value first: its run is the step
    grid's best point (the choice runs the other values only)."""
    if r["knob_grid"] is None:  # no knob grid ran
        return []
    points = [list(p) for p in r["knob_grid"]["points"]]
    if PLANS[r["optimizer"]].scale == "choice":
        preset = r.get("knob_centre", centres.get(r["optimizer"], (None, None))[1])
        if preset is not None and all(v != preset for v, _ in points):
            points.insert(0, [preset, loss_of(r["step_grid"]["best"])])
    return points


def choice_centres(records: list[dict]) -> dict[str, tuple]:
    """The presets' values of records that do not hold their own (tuned before they did)."""
    names = [r["optimizer"] for r in records if PLANS[r["optimizer"]].scale == "choice" and "knob_centre" not in r]
    return preset_centres(names) if names else {}


def summarize(out: Path) -> dict:
    """The board from the tuned optimizers' records (`<out>/<name>.winner.json`): table, JSON and plot, at the
    steps and tokens a step of the board the records share."""
    records = read_records(out)
    board = check_boards(records, out)
    steps, tokens_per_step = board["steps"], board["tokens_per_step"]
    rows = []
    centres = choice_centres(records)
    for r in records:
        plan = PLANS[r["optimizer"]]
        finals = [curve(Path(s["run_dir"]))[-1][2] for s in r["seeds"] if s["run_dir"]]
        points = curve(Path(r["seeds"][0]["run_dir"]))
        summary = json.loads((Path(r["seeds"][0]["run_dir"]) / layout.SUMMARY).read_text())
        rows.append(
            {
                "optimizer": r["optimizer"],
                "val_nats_per_byte": sum(finals) / len(finals),
                # a seed that failed leaves no spread to measure: None, and the board's median stands in for it
                "spread": max(finals) - min(finals) if len(finals) == len(SEEDS) else None,
                "seeds": finals,
                "tuned": r["tuned"],
                "step": grid_text(r["step_grid"], plan.step),
                "knob": grid_text(r["knob_grid"], plan.knob, knob_points(r, centres)) if plan.knob else "",
                "edge": edge_of(r["step_grid"]) == "grid" or bool(r["knob_grid"] and edge_of(r["knob_grid"]) == "grid"),
                "tokens_per_s": summary.get("tokens_per_s_median"),
                "curve": points,
            }
        )
    rows.sort(key=lambda r: r["val_nats_per_byte"])
    adamw = next((r for r in rows if r["optimizer"] == "adamw"), None)
    target = adamw["curve"][-1][1] if adamw else None
    for r in rows:
        reached = next((s for s, loss, _ in r["curve"] if target is not None and loss <= target), None)
        r["tokens_to_adamw_final"] = None if reached is None else reached * tokens_per_step
    # within noise: the gap is below either row's spread over seeds or the board's median spread (two seeds make a
    # poor estimate of one optimizer's noise: AdamW's two runs may land 0.0001 apart by chance)
    spreads = sorted(r["spread"] for r in rows if r["spread"] is not None) or [0.0]
    typical = spreads[len(spreads) // 2]
    for above, below in zip(rows, rows[1:]):
        gap = below["val_nats_per_byte"] - above["val_nats_per_byte"]
        above["noise_with_next"] = gap < max(above["spread"] or 0.0, below["spread"] or 0.0, typical)
    (out / "leaderboard.json").write_text(json.dumps(rows, indent=1))
    seeds = ", ".join(map(str, SEEDS))
    models = sorted({o.split("=", 1)[1] for r in records for o in r.get("overrides", []) if o.startswith("model=")})
    lines = [
        f"{len(rows)} optimizers on {'/'.join(models) or 'one model'}, each at its tuned values, {steps} steps of "
        f"{tokens_per_step:,} tokens "
        f"({steps * tokens_per_step:,} tokens a run); val nats/byte: the mean over seeds {seeds} of the final "
        "`val` loss; spread: the largest minus the smallest (median over the board "
        f"{typical:.4f}). `~`: within noise of the next row (their gap is below the larger spread of the two, or "
        "the median).",
        "",
        "| # | optimizer | val nats/byte | spread | noise | step size (grid points: range) | "
        "knob (grid points: range) | tokens to AdamW's final loss | tokens/s |",
        "|---|---|--:|--:|---|---|---|--:|--:|",
    ]
    for i, r in enumerate(rows, 1):
        tokens = "not reached" if r["tokens_to_adamw_final"] is None else f"{r['tokens_to_adamw_final']:,}"
        rate = "" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        lines.append(
            f"| {i} | {r['optimizer']} | {r['val_nats_per_byte']:.4f} | {spread_text(r)} | "
            f"{'~' if r.get('noise_with_next') else ''} | {r['step']} | {r['knob']} | {tokens} | {rate} |"
        )
    (out / "leaderboard.md").write_text("\n".join(lines) + "\n")
    _plot(rows, tokens_per_step, out / "leaderboard.png")
    print("\n".join(lines))
    return {"rows": rows}


def spread_text(row: dict) -> str:
    """The spread over seeds, or how many seeds finished where one failed."""
    return f"{row['spread']:.4f}" if row["spread"] is not None else f"{len(row['seeds'])} of {len(SEEDS)} seeds"


def _plot(rows: list[dict], tokens_per_step: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        steps, _, nats = zip(*r["curve"])
        ax.plot([s * tokens_per_step for s in steps], nats, marker="o", markersize=3, label=r["optimizer"])
    ax.set_xlabel("tokens")
    ax.set_ylabel("val nats/byte")
    ax.set_title("each optimizer at its tuned hyper-parameters (seed 0)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def yaml_number(value: float) -> str:
    """`text(value)` as YAML 1.1 reads a float (PyYAML takes 2e-06 for a string: the mantissa needs a dot)."""
    written = text(value)
    mantissa, _, exponent = written.partition("e")
    return f"{mantissa}.0e{exponent}" if exponent and "." not in mantissa else written


def set_value(lines: list[str], dotted: str, value: str, note: str = "") -> bool:
    """Set `dotted` (e.g. `lr_config.lr`, `groups.adam.lr_multiplier`) in a preset's YAML lines to `value`, keeping
    every comment; False when the key is not there."""
    at, parts = 0, dotted.split(".")
    for depth, part in enumerate(parts):
        indent = "  " * depth
        for i in range(at, len(lines)):
            line = lines[i]
            if line.startswith(indent + part + ":"):
                at = i
                break
            if line.strip() and not line.lstrip().startswith("#") and len(line) - len(line.lstrip()) < len(indent):
                return False  # left the enclosing block
        else:
            return False
        if depth < len(parts) - 1:
            at += 1
    old = lines[at]
    comment = old[old.index("#") :] if "#" in old else note
    lines[at] = f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}" + (f"  {comment}" if comment else "")
    return True


def write_presets(out: Path) -> list[str]:
    """conf/optimizer/<name>.yaml of every tuned optimizer takes the board's step size, and its knob's value where
    that beat the preset's by more than the board's median seed spread (less is noise: the field's value stays); the
    comment above the schedule says where the values come from. Returns what changed, one line per preset."""
    records = read_records(out)
    board = check_boards(records, out)
    steps, tokens_per_step = board["steps"], board["tokens_per_step"]
    centres = choice_centres(records)
    losses = [[s["val_loss"] for s in r["seeds"]] for r in records]
    spreads = sorted(max(x) - min(x) for x in losses if all(map(math.isfinite, x))) or [0.0]  # a failed seed: none
    noise = spreads[len(spreads) // 2]
    changed = []
    for r in records:
        name, plan = r["optimizer"], PLANS[r["optimizer"]]
        path = ROOT / "conf" / "optimizer" / f"{name}.yaml"
        lines = path.read_text().splitlines()
        tuned = dict(o.split("=", 1) for o in r["tuned"])
        step = float(tuned[plan.step])
        points = [v for v, _ in r["step_grid"]["points"]]
        what = [f"{plan.step.removeprefix('optimizer.')}={text(step)}"]
        source = (
            f"the leaderboard's best (docs/optimizer_leaderboard.md: gpt2-micro, {steps} steps of {tokens_per_step:,} "
            f"tokens), of {len(points)} factor-2 points {text(min(points))}..{text(max(points))}"
        )
        set_value(lines, plan.step.removeprefix("optimizer."), yaml_number(step), "")
        knob_note = ""
        finite = plan.knob and r["knob_grid"] and [p for p in knob_points(r, centres) if math.isfinite(p[1])]
        if finite:
            value, loss = min(finite, key=lambda p: p[1])  # the preset's value among them: the step grid's best
            gain = loss_of(r["step_grid"]["best"]) - loss
            key = plan.knob.removeprefix("optimizer.")
            if gain > noise:
                set_value(lines, key, yaml_number(value) if plan.scale != "choice" else str(int(value)))
                what.append(f"{key}={text(value)}")
                knob_note = f" {key} the board's too ({gain:.3f} lower val loss per token than the preset's)."
            else:
                knob_note = f" {key} kept: the board's best ({text(value)}) was within its noise of it."
        start = next(
            (i for i, line in enumerate(lines) if line.startswith("# The schedule (optimizers/schedules.py)")), None
        )
        if start is not None and plan.step == LR:
            end = next(i for i in range(start, len(lines)) if lines[i].startswith("lr_config:"))
            warmup = next(line.split(":", 1)[1].strip() for line in lines[end:] if line.startswith("  warmup:"))
            floor = next(line.split(":", 1)[1].strip() for line in lines[end:] if line.startswith("  min_lr_ratio:"))
            paragraph = (
                f"The schedule (optimizers/schedules.py): its lr is {source}.{knob_note} Warmup {warmup} of the run "
                f"(or steps, from 1); the floor {floor} of the peak."
            )
            lines[start:end] = textwrap.wrap(paragraph, 118, initial_indent="# ", subsequent_indent="# ")
        else:
            set_value(lines, plan.step.removeprefix("optimizer."), yaml_number(step), f"# {source}")
        path.write_text("\n".join(lines) + "\n")
        changed.append(f"{name}: {' '.join(what)}")
    return changed


def board_run(track: str, gpu: bool) -> list[str]:
    """The overrides every run of the board shares: the CPU's or the GPU's, on the track's model."""
    model = f"model={TRACK_MODELS[track][int(gpu)]}"
    return [model if o.startswith("model=") else o for o in (GPU_RUN if gpu else CPU_RUN)]


def main(argv: list[str]) -> int:
    from optimizers import OPTIMIZERS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/leaderboard", help="where the sweeps and the board go")
    parser.add_argument("--only", default="", help="comma-separated optimizers (default: every one with a plan)")
    parser.add_argument("--steps", type=int, default=80, help="steps of every run (the token budget)")
    parser.add_argument("--points", type=int, default=5, help="each grid's first points (factor-2 steps)")
    parser.add_argument("--knob-points", type=int, default=3, help="the knob grid's first points")
    parser.add_argument("--grow", type=int, default=2, help="points a grid may grow past each edge")
    parser.add_argument("--parallel", type=int, default=1, help="optimizers tuned at once (each its own process)")
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
    context, batch = ((1024 if args.track == "optimization" else 256), 32) if args.gpu else (128, 8)
    board = board_settings(run, args.steps, context * batch)
    out = Path(args.summarize or args.out)
    try:
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
        name = "optimizer_leaderboard" + ("" if args.track == "gpt2" else f"_{args.track}_track")
        for suffix in ("md", "png"):
            shutil.copy(out / f"leaderboard.{suffix}", ROOT / "docs" / f"{name}.{suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
