"""Time our train step against nanoGPT's on the same model, batch, context and GPU, alternating, in one run.

    python -m scripts.benchmarks.bench_peer --nanogpt ~/src/nanoGPT                       # gpt2 (124M), batch 16 x 1024
    python -m scripts.benchmarks.bench_peer --nanogpt ~/src/nanoGPT --model gpt2 --batch 32 --steps 10 --rounds 6
    python -m scripts.benchmarks.bench_peer --nanogpt ~/src/nanoGPT --ours "model.remat=block"  # our side only
    python -m scripts.benchmarks.bench_peer --nanogpt ~/src/nanoGPT --device cpu --model gpt2-mini --vocab 259 \
        --ours "model.bias=false" --steps 5 --rounds 6   # the CPU: 6 x 384, context 256, batch 16, bytes

PATH is the user's checkout of github.com/karpathy/nanoGPT; its model.py is imported at run time in a worker, never
copied here. Only a ratio measured in one run holds across machines (DESIGN.md, "Known pitfalls"). This process
imports neither JAX nor torch (neither may hold the GPU): it checks its arguments and asks nvidia-smi for a GPU, then
starts one worker per side (this script with `--worker`) on the same GPU. Each builds its model, optimizer and a
random batch once, compiles, warms up, then answers `run N` with the times of N steps, each synchronised
(block_until_ready / torch.cuda.synchronize). Rounds alternate which side runs first (ours, nanoGPT, nanoGPT, ours,
...), so both see the same clocks and temperature. No data loading is timed on either side.

Ours: the pipeline's step (training/step/train_step.py) on `--model`, system.dtype=bfloat16, model.attention=auto
(cuDNN), AdamW, vocab 50,257 padded to 50,304. nanoGPT: its train.py's inner loop on `GPT(GPTConfig)` of our model's
shape (vocab 50,304, our bias and dropout): bf16 autocast, TF32 matmuls, `torch.compile`, flash SDPA,
`configure_optimizers` (fused AdamW; our weight decay and betas), clipping at our grad_clip. JAX preallocates 75% of a
GPU: our worker gets XLA_PYTHON_CLIENT_MEM_FRACTION=--jax-mem-fraction (0.45), torch the rest; raise it for larger
batches. Printed, one JSON object: per side tokens/s (the median step over all rounds), ms/step median/min/max and per
round, compile and warm-up seconds, peak memory, MFU (training/reporting/flops.py's PaLM convention, 6N + 12·L·C·T,
each side's own N); the config; `ratio` = our tokens/s / nanoGPT's.

`--device cpu`: the newcomer's comparison, float32 on both sides (nanoGPT's train.py on a CPU: eager, no autocast,
unfused AdamW; ours: the pipeline's CPU defaults), each with its library's default threads (one per core), the CPU's
model and vector extensions in the JSON. nanoGPT's own CPU model is gpt2-mini without biases and a byte
vocabulary, `--model gpt2-mini --ours "model.bias=false" --vocab 259 --batch 16` (context 256).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from core.arguments import OneLineParser
from core.errors import ConfigError
from scripts.benchmarks import records
from training.checkpoints.storage import check_writable

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 50257  # GPT-2's tokens; both models pad their embedding to 50,304 rows
PALM_ATTENTION_FLOPS = 12  # training/reporting/flops.py's palm `a` in 6N + a·L·C·T (that module imports JAX; here none)
SIDES = ("ours", "nanogpt")


class BenchError(Exception):
    """An expected failure of this tool or of a worker: one line, exit 1 (or the worker's code)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def parse(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt", metavar="PATH", help="a nanoGPT checkout (its model.py is imported)")
    p.add_argument("--model", default="gpt2", help="a conf/model preset (default gpt2, 124M)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--context", type=int, default=None, help="tokens per sequence (default: the model's)")
    p.add_argument("--vocab", type=int, default=VOCAB, help="token ids (default GPT-2's 50,257; 259: bytes)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per side per round (default 10)")
    p.add_argument("--rounds", type=int, default=6, help="rounds, alternating which side goes first (default 6)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first, the compiling one included")
    p.add_argument("--ours", default="", help='hydra overrides for our side only, one string: "model.remat=full"')
    p.add_argument("--jax-mem-fraction", type=float, default=0.45, help="of the GPU's memory JAX takes (0.45)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: float32 on the CPU, both sides")
    p.add_argument("--record", metavar="DIR", help=f"keep the result as a record in DIR (GPU: {records.RESULTS})")
    p.add_argument("--no-record", action="store_true", help="keep no record, even on a GPU")
    p.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)  # the nanoGPT worker's model, as our worker reported it
    return p.parse_args(argv)


def argument_problem(args: argparse.Namespace) -> str | None:
    if not args.nanogpt:
        return "--nanogpt PATH is required: a checkout of github.com/karpathy/nanoGPT, whose train step is timed"
    if not (Path(args.nanogpt).expanduser() / "model.py").is_file():
        return f"--nanogpt {args.nanogpt}: no model.py there (expected a checkout of github.com/karpathy/nanoGPT)"
    if not (ROOT / "conf" / "model" / f"{args.model}.yaml").is_file():
        names = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
        return f"--model {args.model}: no such preset; choose one of {', '.join(names)}"
    for name in ("batch", "steps", "rounds", "warmup", "vocab") + (("context",) if args.context is not None else ()):
        if getattr(args, name) < 1:
            return f"--{name} must be at least 1; got {getattr(args, name)}"
    if not 0 < args.jax_mem_fraction < 1:
        return f"--jax-mem-fraction must be in (0, 1); got {args.jax_mem_fraction}"
    if args.record:  # before the measuring: a folder the record can go to
        try:
            check_writable("--record", args.record)
        except ConfigError as e:
            return str(e)
    return None


def gpu_problem() -> str | None:
    """Asked of nvidia-smi, not of JAX or torch: a library that starts on the GPU here would hold it all run."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return "no GPU: CUDA_VISIBLE_DEVICES hides every GPU (bench_peer times CUDA train steps)"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA GPU: nvidia-smi is not on PATH (bench_peer times CUDA train steps; --device cpu: the CPU)"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"no NVIDIA GPU: `nvidia-smi -L` failed ({e})"
    if listed.returncode != 0 or not any(line.startswith("GPU") for line in listed.stdout.splitlines()):
        return f"no NVIDIA GPU: `nvidia-smi -L` lists none (exit {listed.returncode})"
    return None


# ---- the workers: one process per side, commands on stdin, one JSON line per answer ----


def serve(
    ready: dict, step: Callable[[], float], last: Callable[[], dict], warmup: int, commands: TextIO, replies: TextIO
) -> None:
    """Warm up (the first step compiles), say ready, then time `run N` commands until `quit` or end of input."""
    compile_s = step()
    warmup_s = sum(step() for _ in range(warmup - 1))
    _reply(replies, {"ready": True, "compile_s": round(compile_s, 2), "warmup_s": round(warmup_s, 2), **ready})
    for line in commands:
        words = line.split()
        if words == ["quit"]:
            return
        ok = len(words) == 2 and words[0] == "run" and words[1].isdigit()
        _reply(
            replies,
            {"times": [step() for _ in range(int(words[1]))], **last()}
            if ok
            else {"error": f"unknown command {line.strip()!r}"},
        )


def _reply(replies: TextIO, message: dict) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def ours(args: argparse.Namespace, commands: TextIO, replies: TextIO) -> None:
    """The pipeline's step as training/pipeline/build.py makes it, on random tokens (no tokenizer, no corpus)."""
    import jax
    import numpy as np

    from models.gpt import count_params
    from training import config as config_lib
    from training.distributed.sharding import init_mesh, put_batch
    from training.loop.host_memory import init_host_memory
    from training.pipeline.build import init_model, init_optimizer, init_scheduler, init_state_and_steps
    from training.reporting.flops import flops_per_token, peak_flops

    dtype_name = "bfloat16" if args.device == "gpu" else "float32"
    overrides = [
        f"model={args.model}",
        f"system.dtype={dtype_name}",
        "model.attention=auto",
        "optimizer=adamw",
        f"train.batch_size={args.batch}",
        "system.num_devices=1",
        *([f"model.context_size={args.context}"] if args.context else []),
        *shlex.split(args.ours),
    ]
    init_host_memory(config_lib.load_config(overrides).system.reuse_host_memory)  # before the backend starts
    if args.device == "gpu" and jax.default_backend() != "gpu":
        raise BenchError(f"JAX runs on {jax.default_backend()}, not the GPU: install jax[cuda12]")
    cfg = config_lib.load_config(overrides, jax.local_device_count())
    config_lib.check_devices(cfg, jax.local_device_count())
    mesh = init_mesh(cfg.system.num_devices, cfg.system.mesh_model)
    model_key, train_key = jax.random.split(jax.random.PRNGKey(cfg.train.seed))
    model = init_model(cfg, args.vocab, model_key, mesh)
    schedule = init_scheduler(cfg)
    optimizer = init_optimizer(cfg, schedule, model)
    state, _, train_step, _ = init_state_and_steps(cfg, model, schedule, optimizer, train_key, mesh)
    context, accum = config_lib.context_size(cfg), cfg.train.grad_accum_steps
    tokens = np.random.default_rng(0).integers(0, args.vocab, (accum, cfg.train.batch_size, context + 1), np.int32)
    inputs, targets = tokens[..., :-1], tokens[..., 1:]
    batch = {"inputs": inputs, "targets": targets, "loss_mask": np.ones(targets.shape, np.float32)}
    out: dict[str, Any] = {"state": state}
    del state  # the step donates it

    def step() -> float:
        on_device = jax.block_until_ready(put_batch(batch, mesh))  # a fresh copy: the step donates its inputs
        t = time.perf_counter()
        out["state"], out["metrics"] = train_step(out["state"], on_device)
        jax.block_until_ready(out["metrics"])
        return time.perf_counter() - t

    def last() -> dict:
        stats = jax.devices()[0].memory_stats() or {}
        return {"loss": float(out["metrics"]["loss"]), "peak_memory_bytes": stats.get("peak_bytes_in_use")}

    m, o, device = model.cfg, cfg.optimizer, jax.devices()[0]
    shape = {
        "n_layer": m.n_layer,
        "n_head": m.n_head,
        "n_embd": m.n_embd,
        "context": context,
        "bias": m.bias,
        "dropout": m.dropout,
        "vocab": m.padded_vocab_size,
        "tokens": args.vocab,
        "batch": cfg.train.batch_size,
        "grad_accum_steps": accum,
        "weight_decay": o.weight_decay,
        "betas": [o.beta1, o.beta2],
        "grad_clip": o.grad_clip,
    }
    ready = {
        "shape": shape,
        "params": count_params(model),
        "flops_per_token": flops_per_token(model, context),
        "peak_flops": peak_flops(device.device_kind, cfg.system.dtype, cfg.system.peak_flops),
        "device_kind": device.device_kind,
        "dtype": cfg.system.dtype,
        "attention": m.attention,
        "remat": m.remat,
        "scan_layers": m.scan_layers,
        "optimizer": o.name,
        "jax": jax.__version__,
    }
    del model  # the state holds the weights
    serve(ready, step, last, args.warmup, commands, replies)


def nanogpt(args: argparse.Namespace, commands: TextIO, replies: TextIO) -> None:
    """nanoGPT's train.py inner loop (forward under autocast, backward, clip, fused AdamW step, zero_grad)."""
    import contextlib
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("model", Path(args.nanogpt).expanduser().resolve() / "model.py")
    model = importlib.util.module_from_spec(spec)  # nanoGPT's model.py, from the user's checkout
    spec.loader.exec_module(model)
    GPT, GPTConfig = model.GPT, model.GPTConfig

    shape = json.loads(args.shape)
    cuda = args.device == "gpu"
    if cuda and not torch.cuda.is_available():
        raise BenchError("torch sees no CUDA GPU: install a CUDA build of torch")
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True  # as train.py sets them
    torch.backends.cudnn.allow_tf32 = True
    model = GPT(
        GPTConfig(
            block_size=shape["context"],
            vocab_size=shape["vocab"],
            n_layer=shape["n_layer"],
            n_head=shape["n_head"],
            n_embd=shape["n_embd"],
            dropout=shape["dropout"],
            bias=shape["bias"],
        )
    ).to(device)
    optimizer = model.configure_optimizers(shape["weight_decay"], 6e-4, tuple(shape["betas"]), device)
    compiled = torch.compile(model) if cuda else model  # CPU: eager, as train.py runs there (compile=False)
    autocast = torch.autocast(device, dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    accum, batch, context = shape["grad_accum_steps"], shape["batch"], shape["context"]
    tokens = torch.randint(0, shape["tokens"], (accum, batch, context + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[..., :-1].contiguous().to(device), tokens[..., 1:].contiguous().to(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out: dict[str, Any] = {}

    def step() -> float:
        sync()
        t = time.perf_counter()
        for i in range(accum):
            with autocast:
                _, loss = compiled(x[i], y[i])
                loss = loss / accum
            loss.backward()
        if shape["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), shape["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        out["loss"] = loss.detach()
        return time.perf_counter() - t

    def last() -> dict:
        return {
            "loss": accum * float(out["loss"]),
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        }

    ready = {
        "params": model.get_num_params(non_embedding=False),
        "params_flops": model.get_num_params(),
        "fused_adamw": bool(optimizer.defaults.get("fused")),
        "compiled": cuda,
        "torch": torch.__version__,
        "device_kind": torch.cuda.get_device_name() if cuda else "cpu",
    }
    serve(ready, step, last, args.warmup, commands, replies)


def worker(args: argparse.Namespace) -> int:
    """Replies go to the original stdout; everything else printed here (nanoGPT's prints, libraries') to stderr."""
    from core.errors import PipelineError  # imports neither JAX nor torch

    sys.stdout.flush()
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        (ours if args.worker == "ours" else nanogpt)(args, sys.stdin, replies)
    except (PipelineError, BenchError, ImportError) as e:  # a bad override, no CUDA build, no model.py to import
        print(f"error: {args.worker} worker: {e}", file=sys.stderr)  # BenchError and ImportError are not ours
        return getattr(e, "exit_code", 1)
    return 0


# ---- the parent: start both workers, alternate rounds, summarise ----


class Worker:
    def __init__(self, side: str, args: argparse.Namespace, extra: list[str], env: dict[str, str]):
        self.side = side
        argv = [
            sys.executable,
            "-m",
            "scripts.benchmarks.bench_peer",
            "--worker",
            side,
            "--model",
            args.model,
            "--batch",
            str(args.batch),
            "--warmup",
            str(args.warmup),
            "--device",
            args.device,
            "--vocab",
            str(args.vocab),
            f"--ours={args.ours}",
            f"--nanogpt={args.nanogpt}",
            *extra,
        ]
        if args.context:
            argv += ["--context", str(args.context)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, command: str | None = None) -> dict:
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise BenchError(f"the {self.side} worker exited with code {code} (its messages above)", code or 1)
        message = json.loads(line)
        if "error" in message:
            raise BenchError(f"the {self.side} worker: {message['error']}")
        return message

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def worker_env(args: argparse.Namespace, side: str) -> dict[str, str]:
    """Both workers on the same (first visible) GPU; JAX takes only its share of the memory."""
    env = dict(os.environ)
    if args.device == "cpu":
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    else:
        env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if side == "ours":
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(args.jax_mem_fraction)
    return env


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    workers: dict[str, Worker] = {}
    try:
        workers["ours"] = Worker("ours", args, [], worker_env(args, "ours"))
        ready = {"ours": workers["ours"].ask()}
        print(f"bench_peer: ours ready (compile {ready['ours']['compile_s']} s)", file=sys.stderr)
        shape = ready["ours"]["shape"]
        workers["nanogpt"] = Worker("nanogpt", args, ["--shape", json.dumps(shape)], worker_env(args, "nanogpt"))
        ready["nanogpt"] = workers["nanogpt"].ask()
        print(f"bench_peer: nanogpt ready (compile {ready['nanogpt']['compile_s']} s)", file=sys.stderr)
        times: dict[str, list[list[float]]] = {side: [] for side in SIDES}
        last: dict[str, dict] = {}
        for r in range(args.rounds):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                last[side] = workers[side].ask(f"run {args.steps}")
                times[side].append(last[side].pop("times"))
            print(f"bench_peer: round {r + 1}/{args.rounds} done", file=sys.stderr)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        for w in workers.values():
            w.close()
    result = summary(args, shape, ready, times, last)
    directory = records.destination(args.record, args.no_record, args.device == "gpu")
    if directory is not None:
        command = ["python", "-m", "scripts.benchmarks.bench_peer", *argv]
        device = result["config"]["device_kind"]
        path = records.write(directory, "bench_peer", device, result, command, ready["ours"]["jax"])
        print(f"bench_peer: recorded {path}", file=sys.stderr)
    print(json.dumps(result), flush=True)
    return 0


def summary(args: argparse.Namespace, shape: dict, ready: dict, times: dict, last: dict) -> dict:
    tokens_per_step = shape["grad_accum_steps"] * shape["batch"] * shape["context"]
    attention = PALM_ATTENTION_FLOPS * shape["n_layer"] * shape["n_embd"] * shape["context"]
    flops = {"ours": ready["ours"]["flops_per_token"], "nanogpt": 6 * ready["nanogpt"]["params_flops"] + attention}
    peak = ready["ours"]["peak_flops"]
    sides = {}
    for side in SIDES:
        flat = [t for round_times in times[side] for t in round_times]
        median = statistics.median(flat)
        tokens_per_s = tokens_per_step / median
        sides[side] = {
            "tokens_per_s": round(tokens_per_s, 1),
            "ms_per_step_median": round(1000 * median, 2),
            "ms_per_step_min": round(1000 * min(flat), 2),
            "ms_per_step_max": round(1000 * max(flat), 2),
            "ms_per_step_round_medians": [round(1000 * statistics.median(t), 2) for t in times[side]],
            "compile_s": ready[side]["compile_s"],
            "warmup_s": ready[side]["warmup_s"],
            "peak_memory_bytes": last[side]["peak_memory_bytes"],
            "loss_last": round(last[side]["loss"], 4),
            "params": ready[side]["params"],
            "flops_per_token": flops[side],
            "mfu": None if peak is None else round(tokens_per_s * flops[side] / peak, 4),
        }
    sides["ours"].update({k: ready["ours"][k] for k in ("attention", "remat", "scan_layers", "optimizer", "jax")})
    sides["nanogpt"].update({k: ready["nanogpt"][k] for k in ("fused_adamw", "compiled", "torch", "device_kind")})
    return {
        "ratio": round(sides["ours"]["tokens_per_s"] / sides["nanogpt"]["tokens_per_s"], 4),
        **sides,
        "config": {
            "model": args.model,
            **{k: shape[k] for k in ("n_layer", "n_head", "n_embd", "context", "bias")},
            "batch": shape["batch"],
            "grad_accum_steps": shape["grad_accum_steps"],
            "tokens_per_step": tokens_per_step,
            "vocab": shape["vocab"],
            "dtype": ready["ours"]["dtype"],
            "device_kind": ready["ours"]["device_kind"],
            "steps_per_round": args.steps,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "ours_overrides": args.ours,
            "jax_mem_fraction": args.jax_mem_fraction,
            "nanogpt": str(args.nanogpt),
            **({"cpu": cpu_description()} if args.device == "cpu" else {}),
        },
        "mfu_formula": "6N + 12*L*C*T (PaLM, nanoGPT; training/reporting/flops.py)",
        "peak_flops": peak,
    }


CPU_EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_description() -> dict:
    """The CPU both sides ran on: its model, the vector extensions that decide which kernels each library picks, and
    its cores (each worker's intra-op threads: JAX's and torch's defaults, one per core)."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "extensions": [e for e in CPU_EXTENSIONS if e in flags], "cores": os.cpu_count()}


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args)
    problem = argument_problem(args) or (gpu_problem() if args.device == "gpu" else None)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return compare(args, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
