"""nanoGPT's CPU train step under torch.profiler: where PyTorch's time goes, in the categories of
scripts/tools/profile_summary.py (the same table for our step), so the two profiles sit side by side.

    python -m scripts.benchmarks.torch_profile --nanogpt ~/src/nanoGPT                    # gpt2-mini's shape, fp32
    python -m scripts.benchmarks.torch_profile --nanogpt ~/src/nanoGPT --dtype bfloat16   # under CPU autocast

The step is nanoGPT's train.py loop on a CPU (eager: forward, backward, gradient clipping at 1.0, AdamW, zero_grad)
on its own model.py (bias=False, dropout 0) at `--n-layer` x `--n-embd`, `--n-head` heads, context `--context`,
`--vocab` token ids (259: bytes), batch `--batch`, on random tokens. Each operator's self time (its own, without the
operators it calls) goes to one category; the step's wall time less their sum is framework overhead. Matmuls whose
shapes hold the vocabulary are the LM head's. Prints the table, and with `--json` one JSON line instead. Threads are
PyTorch's default (one per core) unless `--threads`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

from core.arguments import OneLineParser

CATEGORIES = {
    "matmul": "weight matmuls (qkv, attention output, MLP)",
    "attention": "attention (scores, softmax, values)",
    "elementwise": "norms, GELU, other elementwise",
    "head_loss": "LM head and loss",
    "optimizer": "optimizer update (clipping and AdamW)",
    "copy": "casts and copies",
    "overhead": "framework overhead (the step's wall time outside operators)",
}
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")
COPIES = ("aten::copy_", "aten::to", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat")


def classify(name: str, shapes: str, vocab: int, in_optimizer: bool) -> str:
    """The category of one operator from its name, its input shapes and whether the optimizer's step called it."""
    if in_optimizer or name.startswith("aten::_foreach") or name.startswith("Optimizer."):
        return "optimizer"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if "cross_entropy" in name or "log_softmax" in name or "nll_loss" in name:
        return "head_loss"
    if name in MATMULS:
        return "head_loss" if str(vocab) in shapes else "matmul"
    if name in COPIES:
        return "copy"
    return "elementwise"


def parse(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt", metavar="PATH", required=True, help="a nanoGPT checkout (its model.py is imported)")
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--vocab", type=int, default=259)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (default 2)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="bfloat16: CPU autocast")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: PyTorch's)")
    p.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    args = p.parse_args(argv)
    if not (Path(args.nanogpt).expanduser() / "model.py").is_file():
        p.error(f"--nanogpt {args.nanogpt}: no model.py there (expected a checkout of github.com/karpathy/nanoGPT)")
    return args


def profile(args: argparse.Namespace) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    spec = importlib.util.spec_from_file_location("model", Path(args.nanogpt).expanduser().resolve() / "model.py")
    nano = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nano)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    shape = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.context)
    model = nano.GPT(nano.GPTConfig(**shape, vocab_size=args.vocab, dropout=0.0, bias=False))
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if args.dtype == "bfloat16" else contextlib.nullcontext()
    tokens = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step() -> float:
        t = time.perf_counter()
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    for _ in range(args.warmup):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        walls = [step() for _ in range(args.steps)]
    ms = dict.fromkeys(CATEGORIES, 0.0)
    events = prof.events()
    optimizer_spans = [(e.time_range.start, e.time_range.end) for e in events if e.name.startswith("Optimizer.step")]
    for e in events:
        if e.name.startswith("Optimizer.") or e.name.startswith("ProfilerStep"):
            continue  # annotations: their operators are counted themselves
        inside = any(start <= e.time_range.start < end for start, end in optimizer_spans)
        ms[classify(e.name, str(e.input_shapes), args.vocab, inside)] += e.self_cpu_time_total / 1e3 / args.steps
    step_ms = 1e3 * sum(walls) / len(walls)
    ms["overhead"] = max(0.0, step_ms - sum(ms.values()))
    return {
        "step_ms": step_ms,
        "step_ms_each": [1e3 * w for w in walls],
        "tokens_per_sec": args.batch * args.context / statistics.median(walls),
        "ms": ms,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "blas": _blas(torch),
        "cpu": platform.processor() or platform.machine(),
        "shape": {**shape, "vocab": args.vocab, "batch": args.batch},
    }


def _blas(torch) -> str:
    """The BLAS and oneDNN PyTorch was built with, from its build configuration."""
    found = re.findall(r"(?:BLAS_INFO|USE_MKLDNN)=[^,\s]+", torch.__config__.show())
    return ", ".join(found) or "unknown"


def table(result: dict) -> str:
    step = result["step_ms"]
    lines = [
        f"nanoGPT step, {result['dtype']}, {result['threads']} threads, torch {result['torch']} ({result['blas']}): "
        f"{step:.0f} ms a step, {result['tokens_per_sec']:,.0f} tokens/s",
        "| category | ms/step | % of step |",
        "|---|--:|--:|",
    ]
    for name, ms in sorted(result["ms"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {CATEGORIES[name]} | {ms:,.0f} | {100 * ms / step:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    result = profile(args)
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
