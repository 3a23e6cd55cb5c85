"""The optimizer leaderboard: every registered optimizer at its own optimum, compared at the end of training.

    bash scripts/optimizer_leaderboard.sh                    # this machine's board (2 CPU cores: about an hour)
    bash scripts/optimizer_leaderboard.sh --gpu              # gpt2-mini, longer runs: where a GPU is lent
    python scripts/optimizer_leaderboard.py --only adamw,lion --out /tmp/board   # a part of it
    python scripts/optimizer_leaderboard.py --summarize runs/leaderboard         # the table and plot again

Each optimizer is tuned as Wen et al. (2025) insist: its learning rate on a grid around its preset (a Hydra
multirun), then its most sensitive other knob at that lr (a second multirun), each job a full run at the same token
budget on pystdlib; the best final `val` loss wins. The finalists (the best `--finalists`) run again with a second
seed. Written: `<out>/leaderboard.md` and `.json` (best val nats/byte, the tuned hyper-parameters, the tokens it
took to reach AdamW's final loss against AdamW's own, tokens/s) and `leaderboard.png` (each winner's val curve);
with `--docs`, copies of the .md and .png in docs/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The board's runs: gpt2-micro on pystdlib, context 128, batch 8 (1,024 tokens a step), no checkpoints; the budget
# (steps) is a flag. Evaluations every quarter of the run give the curves.
CPU_RUN = ["model=gpt2-micro", "dataset.context_size=128", "train.batch_size=8", "train.eval_iters=4",
           "checkpoint.save=false", "logging.wandb=disabled", "logging.plot=false", "logging.tensorboard=false",
           "logging.progress=lines", "optimizer.lr_config.warmup=10"]
GPU_RUN = ["model=gpt2-mini", "train.batch_size=32", "train.eval_iters=20", "checkpoint.save=false",
           "logging.wandb=disabled", "logging.plot=false", "logging.progress=lines", "system.dtype=bfloat16",
           "optimizer.lr_config.warmup=50"]
LR_GRID = (1 / 3, 1.0, 3.0)  # multiples of each optimizer's centre
# Each optimizer's lr centre (the key its step size is: the schedule's lr, or its own) and its one most sensitive
# other knob with the values to try. None: nothing more to tune (Prodigy and D-Adaptation take the schedule's shape).
TUNING = {  # the knob's value(s) other than the preset's (the lr grid has already run the preset's)
    "adamw": ("optimizer.lr_config.lr", 3e-3, "optimizer.beta2", (0.99,)),
    "adam": ("optimizer.lr_config.lr", 3e-3, "optimizer.beta2", (0.95,)),
    "nadam": ("optimizer.lr_config.lr", 3e-3, "optimizer.beta2", (0.95,)),
    "nadamw": ("optimizer.lr_config.lr", 3e-3, "optimizer.beta2", (0.99,)),
    "sgdm": ("optimizer.lr_config.lr", 0.3, "optimizer.momentum", (0.95,)),
    "rmsprop": ("optimizer.lr_config.lr", 3e-3, "optimizer.decay", (0.99,)),
    "lion": ("optimizer.lr_config.lr", 3e-4, "optimizer.beta2", (0.95,)),
    "signum": ("optimizer.lr_config.lr", 3e-4, "optimizer.momentum", (0.95,)),
    "muon": ("optimizer.lr_config.lr", 2e-2, "optimizer.groups.adam.lr_multiplier", (0.3,)),
    "adafactor": ("optimizer.lr_config.lr", 1e-2, "optimizer.decay_rate", (0.9,)),
    "ademamix": ("optimizer.lr_config.lr", 3e-3, "optimizer.alpha", (4.0,)),
    "mars": ("optimizer.lr_config.lr", 3e-3, "optimizer.gamma", (0.05,)),
    "adam_mini": ("optimizer.lr_config.lr", 3e-3, "optimizer.beta2", (0.99,)),
    "scion": ("optimizer.lr_config.lr", 3.6e-4, "optimizer.momentum", (0.95,)),  # the paper's lr for its radii
    "soap": ("optimizer.lr_config.lr", 3e-3, None, ()),  # its knob untuned here: eigendecompositions, ~3 min a run
    "schedule_free_adamw": ("optimizer.sf_lr", 3e-3, "optimizer.beta1", (0.95,)),
    "schedule_free_sgd": ("optimizer.sf_lr", 0.3, "optimizer.momentum", (0.95,)),
    "sophia": ("optimizer.lr_config.lr", 3e-3, "optimizer.gamma", (0.01,)),
    "kron": ("optimizer.lr_config.lr", 1e-3, "optimizer.precond_lr", (0.3,)),
    "prodigy": ("optimizer.d0", 1e-4, "optimizer.d_coef", (2.0,)),  # short runs: d0 sets how soon d is right
    "dadapt_adamw": ("optimizer.d0", 1e-4, None, ()),
    "cocob": ("optimizer.alpha", 100.0, None, ()),
}


def sweep(out: Path, name: str, overrides: list[str]) -> dict:
    """One Hydra multirun (jobs one after another in one process: the data and compiled steps are shared); its
    sweep.json (training/cli/sweep.py)."""
    sweep_dir = out / name
    if not (sweep_dir / "sweep.json").exists():
        command = [sys.executable, str(ROOT / "train_jax.py"), "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]
        print("$", " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=ROOT, check=False)
    return json.loads((sweep_dir / "sweep.json").read_text())


def best_job(summary: dict) -> dict | None:
    return summary.get("best")


def tune(out: Path, optimizer: str, run: list[str]) -> dict | None:
    """The optimizer's lr grid, then its knob at the best lr; the winning job's record."""
    lr_key, centre, knob, values = TUNING[optimizer]
    grid = ",".join(f"{centre * m:.3g}" for m in LR_GRID)
    best = best_job(sweep(out, f"{optimizer}-lr", [f"optimizer={optimizer}", *run, f"{lr_key}={grid}"]))
    if best is None or knob is None:
        return best
    lr = next(o.split("=", 1)[1] for o in best["overrides"] if o.startswith(lr_key + "="))
    tried = sweep(out, f"{optimizer}-knob", [f"optimizer={optimizer}", *run, f"{lr_key}={lr}",
                                              f"{knob}={','.join(map(str, values))}"]).get("best")
    return min([j for j in (best, tried) if j is not None], key=lambda j: j["val_loss"])


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, val loss per token, val nats per byte) at each evaluation."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["nats_per_byte"]) for r in rows if r["split"] == "val"]


def summarize(out: Path, tokens_per_step: int) -> dict:
    """The board from the tuned jobs' records (`<out>/<optimizer>.json`): table, JSON and plot."""
    winners = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.winner.json"))}
    rows = []
    reference = winners.get("adamw.winner")
    target = curve(Path(reference["run_dir"]))[-1][1] if reference else None
    for key, job in winners.items():
        name = key.removesuffix(".winner")
        points = curve(Path(job["run_dir"]))
        seeds = [points[-1][2]] + [curve(Path(j["run_dir"]))[-1][2] for j in job.get("seeds", [])]
        reached = next((s for s, loss, _ in points if target is not None and loss <= target), None)
        summary = json.loads((Path(job["run_dir"]) / "summary.json").read_text())
        rows.append({"optimizer": name, "val_nats_per_byte": sum(seeds) / len(seeds), "seeds": len(seeds),
                     "tuned": job.get("tuned", []),
                     "tokens_to_adamw_final": None if reached is None else reached * tokens_per_step,
                     "tokens_per_s": summary.get("tokens_per_s_median"), "curve": points})
    rows.sort(key=lambda r: r["val_nats_per_byte"])
    adamw_tokens = next((r["tokens_to_adamw_final"] for r in rows if r["optimizer"] == "adamw"), None)
    for r in rows:
        r["speedup_vs_adamw"] = (adamw_tokens / r["tokens_to_adamw_final"]
                                 if adamw_tokens and r["tokens_to_adamw_final"] else None)
    (out / "leaderboard.json").write_text(json.dumps(rows, indent=1))
    lines = ["| # | optimizer | val nats/byte | seeds | tuned | tokens to AdamW's final loss | speed-up | tokens/s |",
             "|---|---|--:|--:|---|--:|--:|--:|"]
    for i, r in enumerate(rows, 1):
        tokens = "not reached" if r["tokens_to_adamw_final"] is None else f"{r['tokens_to_adamw_final']:,}"
        speedup = "" if r["speedup_vs_adamw"] is None else f"{r['speedup_vs_adamw']:.2f}x"
        rate = "" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        tuned = ", ".join(o.removeprefix("optimizer.") for o in r["tuned"])
        lines.append(f"| {i} | {r['optimizer']} | {r['val_nats_per_byte']:.4f} | {r['seeds']} | {tuned} | {tokens} | "
                     f"{speedup} | {rate} |")
    (out / "leaderboard.md").write_text("\n".join(lines) + "\n")
    _plot(rows, tokens_per_step, out / "leaderboard.png")
    print("\n".join(lines))
    return {"rows": rows}


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
    ax.set_title("each optimizer at its tuned hyper-parameters")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> int:
    from optimizers import OPTIMIZERS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/leaderboard", help="where the sweeps and the board go")
    parser.add_argument("--only", default="", help="comma-separated optimizers (default: every one tuned here)")
    parser.add_argument("--steps", type=int, default=80, help="steps of every run (the token budget)")
    parser.add_argument("--finalists", type=int, default=4, help="how many of the best run a second seed")
    parser.add_argument("--gpu", action="store_true", help="the larger board: gpt2-mini, batch 32, bfloat16")
    parser.add_argument("--summarize", metavar="OUT", help="only rebuild the table and plot of a board in OUT")
    parser.add_argument("--docs", action="store_true", help="also copy leaderboard.md and .png into docs/")
    args, extra = parser.parse_known_args(argv)
    run = [*(GPU_RUN if args.gpu else CPU_RUN), f"train.max_steps={args.steps}",
           f"train.eval_interval={max(args.steps // 4, 1)}", *extra]
    context, batch = (256, 32) if args.gpu else (128, 8)
    tokens_per_step = context * batch
    out = Path(args.summarize or args.out)
    if args.summarize:
        summarize(out, tokens_per_step)
        return 0
    missing = [name for name in TUNING if name not in OPTIMIZERS]
    names = [n for n in (args.only.split(",") if args.only else TUNING) if n and n not in missing]
    unknown = [n for n in names if n not in TUNING]
    if unknown:
        print(f"error: --only: no tuning plan for {', '.join(unknown)}; plans exist for {', '.join(TUNING)}",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        winner = tune(out, name, run)
        if winner is not None:
            lr_key, _, knob, _ = TUNING[name]
            winner["tuned"] = [o for o in winner["overrides"] if o.split("=")[0] in (lr_key, knob)]
            (out / f"{name}.winner.json").write_text(json.dumps(winner, indent=1))
    ranked = sorted((json.loads(p.read_text()) | {"name": p.name.removesuffix(".winner.json")}
                     for p in out.glob("*.winner.json")), key=lambda j: j["val_loss"])
    for job in ranked[:args.finalists]:  # a second seed for the finalists
        overrides = [o for o in job["overrides"] if not o.startswith("train.seed")]
        seed = sweep(out, f"{job['name']}-seed2", [*overrides, "train.seed=2"]).get("best")
        if seed is not None:
            record = json.loads((out / f"{job['name']}.winner.json").read_text())
            record["seeds"] = [seed]
            (out / f"{job['name']}.winner.json").write_text(json.dumps(record, indent=1))
    summarize(out, tokens_per_step)
    if args.docs:
        for suffix in ("md", "png"):
            shutil.copy(out / f"leaderboard.{suffix}", ROOT / "docs" / f"optimizer_leaderboard.{suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
