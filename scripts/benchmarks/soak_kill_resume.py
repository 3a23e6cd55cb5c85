"""Kill a training run with kill -9 at random moments, some during saves, and resume it each time with the same
command (checkpoint.load=auto); then check that every loss logged by every segment equals the uninterrupted run's
at the same step, and that the last step was reached.

    python -m scripts.benchmarks.soak_kill_resume --kills 20 --steps 240 --workdir /tmp/soak
    python -m scripts.benchmarks.soak_kill_resume --kills 20 ... model=gpt2-micro  # extra arguments go to train_jax.py

Prints one line per segment and a JSON summary (kills, kills during a save, resumes, steps compared, differences);
exits 1 when a loss differs or the run did not finish.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from core.arguments import OneLineParser, seed
from core.errors import PipelineError, say
from training.checkpoints.storage import check_writable
from training.config import layout

ROOT = Path(__file__).resolve().parents[2]


def tiny(workdir: Path, steps: int, save_every: int) -> list[str]:
    return [
        "model=gpt2-tiny",
        "dataset.tokenizer=byte",
        "dataset.max_documents=24",
        "dataset.num_proc=1",
        f"dataset.cache_dir={workdir / 'cache'}",
        f"system.compilation_cache_dir={workdir / 'cache' / 'jax'}",
        "train.batch_size=8",
        f"train.max_steps={steps}",
        "train.eval_interval=40",
        "train.eval_iters=2",
        "train.log_interval=1",
        f"checkpoint.save_steps={save_every}",
        "checkpoint.max_to_keep=2",
        "system.num_devices=1",
        "logging.wandb=disabled",
        "logging.progress=lines",
    ]


def start(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "train_jax.py"), *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
        )


def logged(run_dir: Path) -> list[dict]:
    """Every row of metrics.jsonl that parses (a row being written when the run was killed may not)."""
    path = run_dir / layout.METRICS
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def last_step(run_dir: Path) -> int:
    return max((r["step"] for r in logged(run_dir) if r["split"] == "train"), default=0)


def saves_under_way(run_dir: Path) -> set[str]:
    """Orbax's temporary step directories: a save under way (or one a kill left, until the next save clears it)."""
    directory = run_dir / layout.CHECKPOINTS
    return {p.name for p in directory.iterdir() if ".orbax-checkpoint-tmp" in p.name} if directory.is_dir() else set()


def kill_at_random_moment(
    proc: subprocess.Popen, run_dir: Path, rng: random.Random, steps: int, during_save: bool
) -> tuple[str, int] | None:
    """Wait for a random step (and, if `during_save`, for a save to be under way) and kill -9; None if the run
    ended first."""
    target = min(last_step(run_dir) + rng.randint(1, 12), steps - 1)
    left_over = saves_under_way(run_dir)
    while proc.poll() is None:
        reached = last_step(run_dir) >= target
        if reached and not during_save:
            time.sleep(rng.uniform(0, 0.05))
        if reached and (not during_save or saves_under_way(run_dir) - left_over):
            saving = bool(saves_under_way(run_dir) - left_over)
            proc.kill()
            return "during a save" if saving else "between saves", last_step(run_dir)
        time.sleep(0.005)
    return None


def main() -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--during-save", type=float, default=0.4, help="share of kills aimed at a save under way")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--workdir", type=Path, required=True)
    args, extra = parser.parse_known_args()
    rng = random.Random(args.seed)
    workdir = args.workdir.absolute()
    try:
        check_writable("--workdir", workdir)  # a file in the way: one line, before any run
    except PipelineError as e:
        return say(e)
    workdir.mkdir(parents=True, exist_ok=True)
    command = tiny(workdir, args.steps, args.save_every) + extra

    reference = workdir / "uninterrupted"
    started = time.time()
    if last_step(reference) < args.steps:
        ref = start(command + [f"logging.run_dir={reference}"], workdir / "uninterrupted.log")
        if ref.wait() != 0:
            print(f"error: the uninterrupted run failed; see {workdir / 'uninterrupted.log'}", file=sys.stderr)
            return 1
    want = {(r["split"], r["step"]): r["loss"] for r in logged(reference) if isinstance(r.get("loss"), float)}

    soaked = workdir / "killed"
    soaked_args = command + [f"logging.run_dir={soaked}", "checkpoint.load=auto"]
    kills, during_saves, segments = 0, 0, 0
    while True:
        segments += 1
        proc = start(soaked_args, workdir / "killed.log")
        if kills < args.kills:
            outcome = kill_at_random_moment(proc, soaked, rng, args.steps, rng.random() < args.during_save)
            proc.wait()
            if outcome is not None:
                kills += 1
                during_saves += outcome[0] == "during a save"
                print(f"segment {segments}: killed {outcome[0]} at logged step {outcome[1]}", flush=True)
                continue
        if proc.wait() != 0:
            print(
                f"error: segment {segments} failed (exit {proc.returncode}); see {workdir / 'killed.log'}",
                file=sys.stderr,
            )
            return 1
        print(f"segment {segments}: ran to the end", flush=True)
        break

    rows = [r for r in logged(soaked) if isinstance(r.get("loss"), float)]
    differences = [r for r in rows if want.get((r["split"], r["step"])) != r["loss"]]
    summary = {
        "kills": kills,
        "kills_during_a_save": during_saves,
        "resumes": segments - 1,
        "losses_compared": len(rows),
        "train_steps_compared": sum(r["split"] == "train" for r in rows),
        "distinct_train_steps": len({r["step"] for r in rows if r["split"] == "train"}),
        "differences": len(differences),
        "last_step": last_step(soaked),
        "max_steps": args.steps,
        "wall_s": round(time.time() - started, 1),
    }
    print(json.dumps(summary))
    for r in differences[:5]:
        print(
            f"differs: {r['split']} step {r['step']}: {r['loss']} vs {want.get((r['split'], r['step']))}",
            file=sys.stderr,
        )
    return 0 if not differences and summary["last_step"] == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
