"""Tokens and seconds to a target loss: GPT-2 with AdamW (the baseline: scripts/train_lm.sh's run) against the
modded-nanogpt speedrun's recipe at the same size (recipe=speedrun-micro: its model, Muon and stages), on the embedded
corpus.

    python -m scripts.experiments.time_to_target --out runs/ttt                  # baseline and recipe, 2 seeds each
    python -m scripts.experiments.time_to_target --out runs/ttt --ablation       # + the recipe less each piece
    python -m scripts.experiments.time_to_target --out runs/ttt --summarize      # the table of the runs done so far
    python -m scripts.experiments.time_to_target --out runs/ttt --only recipe-no-yarn   # one variant (and the baseline)

Every variant trains `--steps` steps of 16 x 256 tokens (train_lm.sh's budget; the recipe's stages 8, 16 and 24
sequences, the same tokens over the run) for each of `--seeds` seeds, one run directory each under --out, evaluated
every `--eval-every` steps; a run whose directory holds a finished metrics file
is not run again, and a stopped one continues from its checkpoint (stop and start the script at will). The target is
the baseline's final `val` loss (the mean over its seeds); for each run the tokens and the seconds (the run's own
clock, `elapsed_s`: from its start, compiling and evaluations included, every run compiling its own programs: no
compilation cache; the tokenizer and token store are made before the first run, so no run's seconds hold them) at
which `val` first reaches it, linearly interpolated between evaluations, and their fractions of the baseline's full
run. Writes `time_to_target.json` (every run's curve, the crossings, the fractions, the
recipe's final nats/byte), a Markdown table and `time_to_target.png` (val against tokens and against seconds, every
seed's curve) into --out. Extra arguments after `--` are Hydra overrides for every run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from core.arguments import OneLineParser
from core.errors import PipelineError, say
from training.checkpoints.storage import check_writable
from training.reporting.summary import latest_per_step, read_metrics

# gpt2-micro with AdamW at train_lm.sh's settings (its 20 warmup steps of 320 as a fraction), and the recipe at the
# same width, depth and MLP: the same 3.1M non-embedding parameters (its untied head and value embeddings are
# embeddings). The recipe is conf/recipe/speedrun-micro.yaml, what `python train_jax.py recipe=speedrun-micro` runs.
ROOT = Path(__file__).resolve().parents[2]  # where train_jax.py is; the runs start in this command's directory
REQUEST = "time_to_target_request.json"  # the comparison a folder holds (check_request)
BASELINE = ["model=gpt2-micro", "optimizer=adamw", "optimizer.lr_config.lr=3e-3", "optimizer.lr_config.warmup=0.0625"]
RECIPE = ["recipe=speedrun-micro"]
# The recipe less one piece each: what the piece buys at this scale.
ABLATIONS = {
    "unet_skips": ["model.unet_skips=false"],
    "value_embeddings": ["model.value_embeddings=0"],
    "zero_init_mlp_out": ["model.zero_init_mlp_out=false"],
    "half_truncated_rope": ["model.rope_frequencies=standard", "model.rope_theta=10000"],
    "logit_softcap": ["model.logit_softcap=0"],
    "polar_express": ["optimizer.orthogonalizer=newton_schulz"],
    "normuon": ["optimizer.normuon_beta2=null"],
    "cautious_weight_decay": ["optimizer.cautious_weight_decay=false"],
    "momentum_warmup": ["optimizer.momentum_warmup=0"],
    "stages": ["train.stages=[]", "train.yarn=false"],  # 16 sequences and every position at every step
    "yarn": ["train.yarn=false"],
}
BATCH, CONTEXT = 16, 256


def variants(ablation: bool) -> dict[str, list[str]]:
    out = {"baseline": BASELINE, "recipe": RECIPE}
    if ablation:
        out.update({f"recipe-no-{piece}": RECIPE + extra for piece, extra in ABLATIONS.items()})
    return out


def run_overrides(overrides: list[str], run_dir: Path, seed: int, steps: int, eval_every: int) -> list[str]:
    return [
        *overrides,
        f"train.max_steps={steps}",
        f"train.eval_interval={eval_every}",
        f"train.log_interval={eval_every}",
        f"train.batch_size={BATCH}",
        f"train.seed={seed}",
        "train.max_training_hours=2",
        f"logging.run_dir={run_dir}",
        "logging.wandb=disabled",
        "logging.plot=false",
        "logging.progress=lines",
        "checkpoint.load=auto",  # a run stopped by a signal continues from its checkpoint
        "system.compilation_cache_dir=null",  # every run's seconds hold its compiling (a second seed read it cached)
    ]


def prepare_data(chosen: dict[str, list[str]], steps: int, eval_every: int, extra: list[str]) -> None:
    """The tokenizer and token store each variant reads, made here, before any run: the first run's seconds held
    making them (the BPE tokenizer's training, the corpus's tokenising), and the baseline's seconds are every
    fraction's denominator. In the runs' working directory, this command's (relative cache folders), as process 0 of
    1, without starting JAX's backend here (on a GPU it would hold most of the memory the runs need)."""
    from data.corpus import load_corpus
    from training import config as config_lib
    from training.pipeline.build import init_tokenizer, load_data

    for overrides in chosen.values():
        cfg = config_lib.load_config([*run_overrides(overrides, Path("unused"), 0, steps, eval_every), *extra])
        corpus = load_corpus(cfg.dataset, config_lib.mixture_sources(cfg.dataset))
        load_data(cfg, corpus, init_tokenizer(cfg, corpus, None, process_index=0), processes=(0, 1))


def metrics(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl rows, a step logged twice (a run started again in its directory) kept once."""
    return latest_per_step(read_metrics(run_dir))


def finished(run_dir: Path, steps: int) -> bool:
    """The run evaluated at its last step, `steps` (one of more steps is another budget's)."""
    rows = metrics(run_dir)
    return any(r["step"] == steps and r["split"] == "val" for r in rows) and all(r["step"] <= steps for r in rows)


def check_request(out: Path, request: dict, summarize_only: bool, check: Callable[[], None] = lambda: None) -> None:
    """A folder holds one comparison: its runs' --steps, --eval-every and extra overrides are recorded
    (REQUEST) with the first, and a command asking for others is refused before anything runs: its runs were
    skipped as finished, and the table named the new budget for the old runs. `check` runs before the first is
    recorded: a command it refuses (an unknown key after `--`) leaves the folder free for the corrected one."""
    path = out / REQUEST
    if path.exists():
        try:
            held = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PipelineError(f"--out: {path} is unreadable ({type(e).__name__}); repair or remove it") from None
        if held != request:
            raise PipelineError(
                f"--out: {out} holds the runs of {_command(held)}, and this command asks {_command(request)}; "
                "choose another --out, or the same settings"
            )
    elif not summarize_only:
        check()
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(request))


def _command(request: dict) -> str:
    extra = " ".join(request["extra_overrides"])
    return f"--steps {request['steps']} --eval-every {request['eval_every']}" + (f" -- {extra}" if extra else "")


def curve(run_dir: Path) -> list[dict]:
    """Each evaluation of `val`: step, training tokens, seconds (`elapsed_s` of the train row logged at that step),
    loss per token and per byte."""
    rows = metrics(run_dir)
    train = {r["step"]: r for r in rows if r["split"] == "train"}
    seconds = {step: r["elapsed_s"] for step, r in train.items() if "elapsed_s" in r}
    return [
        {
            "step": r["step"],
            # what the run counted (a batch that grows with train.stages), else the fixed batch's
            "tokens": train.get(r["step"], {}).get("tokens_seen", r["step"] * BATCH * CONTEXT),
            "seconds": seconds.get(r["step"]),
            "loss": r["loss"],
            "nats_per_byte": r["nats_per_byte"],
        }
        for r in rows
        if r["split"] == "val"
    ]


def crossing(points: list[dict], target: float) -> dict | None:
    """Tokens and seconds at which the loss first reaches `target`, linearly interpolated between the evaluation
    before and the one that reaches it; None when it never does."""
    before = None
    for point in points:
        if point["loss"] <= target:
            if before is None:
                return {"tokens": point["tokens"], "seconds": point["seconds"]}
            share = (before["loss"] - target) / (before["loss"] - point["loss"])
            return {  # None where an end has no time (an evaluation before the first step: train.eval_at_start)
                key: None
                if point[key] is None or before[key] is None
                else before[key] + share * (point[key] - before[key])
                for key in ("tokens", "seconds")
            }
        before = point
    return None


def summarize(runs: dict[str, list[list[dict]]]) -> dict:
    """The target (the baseline's mean final val loss), each run's crossing and its fractions of the baseline's
    full run (tokens, seconds), and each variant's mean final nats/byte."""
    baseline = runs["baseline"]
    target = statistics.mean(points[-1]["loss"] for points in baseline)
    full_tokens = statistics.mean(points[-1]["tokens"] for points in baseline)
    ends = [points[-1]["seconds"] for points in baseline]
    full_seconds = None if None in ends else statistics.mean(ends)
    out = {"target_val_loss": target, "baseline_tokens": full_tokens, "baseline_seconds": full_seconds, "variants": {}}
    for name, seeds in runs.items():
        crossings = [crossing(points, target) for points in seeds]
        reached = [c for c in crossings if c is not None]
        out["variants"][name] = {
            "seeds": len(seeds),
            "reached": len(reached),
            "crossings": crossings,
            "tokens_fraction": _mean_fraction([c["tokens"] for c in reached], len(seeds), full_tokens),
            "seconds_fraction": _mean_fraction([c["seconds"] for c in reached], len(seeds), full_seconds),
            "final_val_loss": statistics.mean(points[-1]["loss"] for points in seeds),
            "final_val_nats_per_byte": statistics.mean(points[-1]["nats_per_byte"] for points in seeds),
        }
    return out


def _mean_fraction(values: list[float | None], seeds: int, full: float | None) -> float | None:
    """The seeds' mean crossing as a fraction of the baseline's full run: None unless every seed reached the target
    and every crossing (and the baseline) has a value."""
    if len(values) < seeds or full is None or any(v is None for v in values):
        return None
    return statistics.mean(values) / full


def table(summary: dict) -> str:
    lines = [
        f"target: the baseline's final val loss {summary['target_val_loss']:.4f} per token, reached by it in "
        f"{summary['baseline_tokens']:,.0f} tokens and "
        + ("an unlogged time" if summary["baseline_seconds"] is None else f"{summary['baseline_seconds']:.0f} s"),
        "| variant | seeds | tokens to target | seconds to target | final val (nats/byte) |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, v in summary["variants"].items():
        missing = "not reached" if v["reached"] == 0 else f"reached by {v['reached']} of {v['seeds']} seeds"
        if v["reached"] == v["seeds"]:
            missing = "no time logged"  # a crossing from an evaluation before the first step
        tokens = missing if v["tokens_fraction"] is None else f"{v['tokens_fraction']:.1%}"
        seconds = missing if v["seconds_fraction"] is None else f"{v['seconds_fraction']:.1%}"
        if name == "baseline":  # the target is its own mean final loss: its whole run, by definition
            tokens = seconds = "100% (the target)"
        lines.append(f"| {name} | {v['seeds']} | {tokens} | {seconds} | {v['final_val_nats_per_byte']:.4f} |")
    return "\n".join(lines)


def plot(runs: dict[str, list[list[dict]]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for i, (name, seeds) in enumerate(runs.items()):
        for s, points in enumerate(seeds):
            label = name if s == 0 else None
            for ax, key in zip(axes, ("tokens", "seconds"), strict=True):
                xs = [p[key] for p in points]
                if None not in xs:
                    ax.plot(xs, [p["loss"] for p in points], color=f"C{i}", alpha=0.8, label=label)
    for ax, key in zip(axes, ("training tokens", "seconds since the run started"), strict=True):
        ax.axhline(target, color="k", ls=":", lw=1)
        ax.set_xlabel(key)
    axes[0].set_ylabel("val loss per token")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="a folder for the runs, the record, the table and the picture")
    p.add_argument("--seeds", type=int, default=2, help="seeds per variant (default 2)")
    p.add_argument("--steps", type=int, default=320, help="steps per run (default 320: train_lm.sh's)")
    p.add_argument("--eval-every", type=int, default=20, help="steps between evaluations (default 20)")
    p.add_argument("--ablation", action="store_true", help="also the recipe less each of its pieces")
    p.add_argument(
        "--only",
        metavar="NAMES",
        help="run only these variants, comma-separated (e.g. recipe-no-yarn); the baseline runs too, for the target",
    )
    p.add_argument("--summarize", action="store_true", help="run nothing: the table of the runs finished so far")
    p.add_argument("--record", metavar="DIR", help="also keep the summary as a record in DIR (benchmarks/results)")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.steps < 1 or args.eval_every < 1:
        p.error("--seeds, --steps and --eval-every must be at least 1")
    chosen = variants(args.ablation or bool(args.only))
    if args.only:  # before the folder records this comparison: a refused command leaves it as it was
        wanted = {"baseline", *args.only.split(",")}
        if unknown := wanted - set(chosen):
            p.error(f"--only: no variant {', '.join(sorted(unknown))}; choose from {', '.join(chosen)}")
        chosen = {name: overrides for name, overrides in chosen.items() if name in wanted}
    out = Path(args.out)
    try:  # before any run: folders the runs, the table and the record can go to, and the folder's own comparison
        check_writable("--out", out)
        if args.record:
            check_writable("--record", args.record)

        def composes() -> None:  # an unknown key after `--` was refused only after the folder recorded it
            from training import config as config_lib

            for overrides in chosen.values():
                config_lib.load_config(
                    [*run_overrides(overrides, Path("unused"), 0, args.steps, args.eval_every), *extra]
                )

        request = {"steps": args.steps, "eval_every": args.eval_every, "extra_overrides": extra}
        check_request(out, request, args.summarize, composes)
    except PipelineError as e:
        return say(e)
    to_run = [n for n in chosen for seed in range(args.seeds) if not finished(out / f"{n}-s{seed}", args.steps)]
    if to_run and not args.summarize:
        try:
            prepare_data({n: chosen[n] for n in to_run}, args.steps, args.eval_every, extra)
        except PipelineError as e:
            return say(e)
    for name, overrides in chosen.items():
        for seed in range(args.seeds):
            run_dir = out / f"{name}-s{seed}"
            if args.summarize or finished(run_dir, args.steps):
                continue
            command = [
                sys.executable,
                str(ROOT / "train_jax.py"),
                *run_overrides(overrides, run_dir, seed, args.steps, args.eval_every),
            ]
            print(f"[{name} seed {seed}] {' '.join(command[1:])}", flush=True)
            # in this command's directory, where prepare_data made their data and `finished` reads them: a relative
            # --out or path after `--` is one folder for all three (the runs went to the checkout's <--out>, and a
            # non-editable install's runs and caches into site-packages)
            done = subprocess.run([*command, *extra], env=os.environ)
            if done.returncode:
                print(f"error: {name} seed {seed} exited {done.returncode}", file=sys.stderr)
                return done.returncode
            if not finished(run_dir, args.steps):  # stopped by a signal: exit 0, with a checkpoint
                print(
                    f"error: {name} seed {seed} stopped before step {args.steps}; the same command continues it",
                    file=sys.stderr,
                )
                return 1
    runs = {
        name: [curve(out / f"{name}-s{seed}") for seed in range(args.seeds)]
        for name in chosen
        if all(finished(out / f"{name}-s{seed}", args.steps) for seed in range(args.seeds))
    }
    if "baseline" not in runs:
        print("error: time_to_target: no finished baseline runs under --out yet", file=sys.stderr)
        return 1
    summary = summarize(runs)
    record = {"summary": summary, "runs": runs, "steps": args.steps, "seeds": args.seeds, "extra_overrides": extra}
    (out / "time_to_target.json").write_text(json.dumps(record, indent=1))
    (out / "time_to_target.md").write_text(table(summary) + "\n")
    plot(runs, summary["target_val_loss"], out / "time_to_target.png")
    if args.record:
        import jax

        from scripts.benchmarks import records
        from scripts.benchmarks.bench_peer import cpu_description

        result = {
            "summary": summary,
            "steps": args.steps,
            "seeds": args.seeds,
            "variants": {n: chosen[n] for n in runs},
        }
        cpu = cpu_description()
        device = f"cpu: {cpu['model']}, {cpu['cores']} cores ({' '.join(cpu['extensions'])})"
        print(f"record: {records.write(args.record, 'time_to_target', device, result, sys.argv, jax.__version__)}")
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
