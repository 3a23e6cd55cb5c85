"""Score a checkpoint on downstream tasks with EleutherAI's lm-evaluation-harness (lm-eval), each task at its own
few-shot setting (0 for most) by default.

    python -m scripts.tools.eval_harness RUN_DIR [--tasks hellaswag,lambada_openai] [--which latest|best|STEP]
        [--num-fewshot K] [--limit N] [--include-path MY_TASKS/] [--batch-tokens 8192] [--dtype float32]
        [--out FILE]

RUN_DIR is a run directory or its checkpoint directory. The model reads the tasks' text through the run's own
tokenizer. Results (lm-eval's results dict, the command, the checkpoint and its step) go to
<run>/harness/step<N>-<tasks>.json (a rerun of the same evaluation replaces it), are printed as lm-eval's table and
are logged to the run's TensorBoard as harness/<task>/<metric> at the checkpoint's step. lm-eval is an extra:
pip install -r requirements-eval.txt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import sys
from pathlib import Path

from core.arguments import OneLineParser, above, at_least, seed
from core.errors import ConfigError, PipelineError, say
from core.files import write_atomic
from training.checkpoints.locate import find_checkpoint_dir
from training.checkpoints.storage import check_writable
from training.checkpoints.trained import Trained, add_checkpoint_arguments, load_trained
from training.evaluation.harness import evaluate_tasks, harness_lm, import_lm_eval
from training.step.precision import COMPUTE_DTYPES, cast_floating


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    add_checkpoint_arguments(parser)
    parser.add_argument("--tasks", default="hellaswag,lambada_openai", help="comma-separated lm-eval task names")
    parser.add_argument(
        "--num-fewshot", type=at_least(0), default=None, help="examples in the prompt (default: the task's)"
    )
    parser.add_argument(
        "--limit", type=above(0), default=None, help="only the first N documents per task (or a fraction)"
    )
    parser.add_argument("--include-path", default=None, help="a folder of task YAMLs besides lm-eval's own")
    parser.add_argument("--batch-tokens", type=at_least(1), default=8192, help="padded tokens per forward pass")
    parser.add_argument("--dtype", default="float32", choices=sorted(COMPUTE_DTYPES), help="compute dtype")
    parser.add_argument("--seed", type=seed, default=0, help="lm-eval's seeds (few-shot example choice)")
    parser.add_argument("--out", default=None, help="results file (default: <run>/harness/step<N>-<tasks>.json)")
    args = parser.parse_args(argv)
    try:
        import_lm_eval()  # before anything is loaded: a missing extra is one line at once
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        if not tasks:
            raise ConfigError("--tasks: name at least one lm-eval task, e.g. --tasks hellaswag,lambada_openai")
        trained = load_trained(args.path, args.which)
        if trained.tokenizer.kind == "notes":
            raise ConfigError(f"{args.path}: a note model (notes tokenizer); lm-eval's tasks are text")
        out = Path(args.out or trained.run_dir / "harness" / results_name(trained, tasks, args))
        check_writable("--out", out.parent)
        if out.is_dir():
            raise ConfigError(f"--out: {out} is a directory; name a file in it")
        if out.exists() and not is_results_file(out):  # a rerun replaces its own results, never another file
            raise ConfigError(f"--out: {out} exists and is not an eval_harness result; name a new file")
        lm = harness_lm(cast_floating(trained.model, COMPUTE_DTYPES[args.dtype]), trained.tokenizer, args.batch_tokens)
        results = evaluate_tasks(
            lm, tasks, include_path=args.include_path, limit=args.limit, num_fewshot=args.num_fewshot, seed=args.seed
        )
    except PipelineError as e:
        return say(e)
    from lm_eval.utils import handle_non_serializable, make_table

    record = {
        "command": shlex.join(["python", "-m", "scripts.tools.eval_harness", *argv]),
        "checkpoint": str(find_checkpoint_dir(args.path, ("path", "--which")).absolute()),
        "step": trained.step,
        "model": trained.cfg.model.name,
        "tokenizer": trained.tokenizer.kind,
        **results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(record, indent=2, default=handle_non_serializable))  # whole or not at all
    print(f"# {trained.cfg.model.name}, step {trained.step} of {args.path}")
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    logged = log_to_tensorboard(trained, results)
    print(f"written to {out}" + (f"; TensorBoard: {logged}" if logged else ""))
    return 0


NAMED_TASKS = 120  # the longest task list a results file is named by in full (results_name)


def results_name(trained: Trained, tasks: list[str], args: argparse.Namespace) -> str:
    """step<N>-<tasks>[-<k>shot][-limit<n>][-<dtype>][-seed<s>].json: what sets the numbers, so that another
    evaluation (bfloat16, other few-shot examples) does not replace one that differs from it. Tasks joined longer
    than NAMED_TASKS characters (twelve MMLU subjects: a name over the file system's 255 bytes) are the first task,
    their count and a hash of them all."""
    shots = "" if args.num_fewshot is None else f"-{args.num_fewshot}shot"
    limit = "" if args.limit is None else f"-limit{args.limit:g}"
    dtype = "" if args.dtype == "float32" else f"-{args.dtype}"
    seed = "" if args.seed == 0 else f"-seed{args.seed}"
    named = "+".join(tasks)
    if len(named) > NAMED_TASKS:
        digest = hashlib.sha256(named.encode()).hexdigest()[:12]
        named = f"{tasks[0][: NAMED_TASKS // 2]}+{len(tasks) - 1}more-{digest}"
    return f"step{trained.step}-{named}{shots}{limit}{dtype}{seed}.json"


def is_results_file(path: Path) -> bool:
    """`path` holds what this command writes (a JSON record whose command is an eval_harness one)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(record, dict) and "scripts.tools.eval_harness" in str(record.get("command", ""))


def scalar_metrics(results: dict) -> dict[str, float]:
    """harness/<task>/<metric> (with `_<filter>` unless lm-eval's default filter) for every finite number."""
    scalars = {}
    for task, values in {**results.get("results", {}), **results.get("groups", {})}.items():
        for key, value in values.items():
            metric, _, kind = key.partition(",")
            if not kind or metric.endswith("_stderr") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                scalars[f"harness/{task}/{metric}" + ("" if kind == "none" else f"_{kind}")] = float(value)
    return scalars


def log_to_tensorboard(trained: Trained, results: dict) -> Path | None:
    """The metrics as scalars at the checkpoint's step, in the run's TensorBoard folder (when the run has one)."""
    logdir = trained.run_dir / "tensorboard"
    if not (trained.cfg.logging.tensorboard and logdir.is_dir()):
        return None
    from tensorboardX import SummaryWriter

    with SummaryWriter(logdir=str(logdir)) as writer:
        for tag, value in scalar_metrics(results).items():
            writer.add_scalar(tag, value, trained.step)
    return logdir


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
