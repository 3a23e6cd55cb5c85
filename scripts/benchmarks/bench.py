"""Benchmark the train step of a config: N timed steps after warm-up, one JSON line out per configuration.

    python -m scripts.benchmarks.bench [--steps 20] [--warmup 3] [hydra overrides ...]
    python -m scripts.benchmarks.bench --steps 20 model=gpt2-mini dataset.tokenizer=byte train.batch_size=16
    python -m scripts.benchmarks.bench --steps 20 model=gpt2 --variant "" --variant "model.scan_layers=false"
    python -m scripts.benchmarks.bench --loader --steps 200 model=gpt2          # the data path alone
    python -m scripts.benchmarks.bench --compile-only model=gpt2-xl  # compile time and XLA's memory plan, nothing
                                                                      # allocated

Each timed step is synchronised (block_until_ready), so ms/step is the device time of one step plus dispatch; the median
is reported. Batches come from the real data pipeline, prepared before timing. Reported: tokens/s, ms/step (median, min,
max), compile seconds (the first step's, and XLA's compiling within it), MFU where the device's peak is known under both
conventions of training/reporting/flops.py (`mfu`: 6N + 12·L·C·T as PaLM and nanoGPT count, the pipeline's; `mfu_llmc`:
6N + 6·L·C·T, causal attention halved, as llm.c counts), XLA's memory plan for the step (arguments + outputs +
temporaries - what the donated state's buffers alias), the device's peak memory where the backend reports it (first
configuration of the process only: the peak is the process's), the loss of every step run, the custom calls of the
compiled step (`__cudnn$fmha...`: cuDNN's fused attention; `__cublas$lt$matmul$f8`: FP8 GEMMs) and its dots of float8
operands (`float8_dots`: FP8 matmuls XLA runs with its own kernels), device kind and a config summary.

`--variant "OVERRIDES"` (repeatable) times several configurations in one process, each the common overrides plus its
own, one JSON line each: the corpus and tokenizer are loaded once. `system.xla_flags` belongs with the common
overrides (XLA reads its flags once per process, before the backend starts; bench.py sets them then).
On a GPU every configuration's line is also kept as a record under the checkout's benchmarks/results/, from whatever
directory bench.py runs (scripts/benchmarks/records.py; `--record DIR` elsewhere or on any backend, `--no-record`
never).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import time
from collections import Counter
from typing import Any

import jax

from core.arguments import OneLineParser, at_least
from core.errors import ConfigError, PipelineError, say
from models.gpt import count_params
from scripts.benchmarks import records
from training import config as config_lib
from training.checkpoints.storage import check_writable
from training.config.stages import plan_stages
from training.distributed.sharding import put_batch
from training.loop.compilation import CompileClock, init_xla_flags, xla_flags
from training.loop.host_memory import init_host_memory
from training.pipeline.build import build, init_model, init_optimizer, init_scheduler
from training.reporting.flops import MFU_FORMULA, flops_per_token, mfu, peak_flops


def bench(overrides: list[str], steps: int, warmup: int, first: bool = True) -> dict:
    cfg = config_lib.load_config(overrides, jax.local_device_count())
    if len(plan_stages(cfg)) > 1:  # a median over steps of several batch sizes or windows is no one step's time
        raise ConfigError(
            "config: train.stages: bench.py times one step's configuration; set train.batch_size and "
            "model.attention_window to the stage to time, and train.stages=[]"
        )
    p = build(cfg)
    mesh, data, state, train_step = p.mesh, p.data, p.state, p.train_step
    batches = [put_batch(data.train.batch(s), mesh) for s in range(warmup + steps)]

    losses = []
    clock = CompileClock()
    t0 = time.perf_counter()
    state, metrics = train_step(state, batches[0])
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t0
    xla_compile_s = clock.stop()
    losses.append(float(metrics["loss"]))
    for b in batches[1:warmup]:
        state, metrics = train_step(state, b)
        losses.append(float(metrics["loss"]))  # waits for the step
    times = []
    for b in batches[warmup:]:
        t = time.perf_counter()
        state, metrics = train_step(state, b)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)
        losses.append(float(metrics["loss"]))  # outside the timed interval
    compiled = train_step.lower(state, batches[0]).compile()  # the executable just run (jit's cache: no compiling)
    hlo = compiled.as_text()

    context = config_lib.context_size(cfg)
    tokens_per_step = data.train.global_batch * context
    median = statistics.median(times)
    tokens_per_s = tokens_per_step / median
    device = jax.devices()[0]
    peak = peak_flops(device.device_kind, cfg.system.dtype, cfg.system.peak_flops)
    stats = device.memory_stats() or {}
    import resource

    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {
        "tokens_per_s": round(tokens_per_s, 1),
        "ms_per_step_median": round(1000 * median, 2),
        "ms_per_step_min": round(1000 * min(times), 2),
        "ms_per_step_max": round(1000 * max(times), 2),
        "compile_s": round(compile_s, 2),
        "xla_compile_s": round(xla_compile_s, 2),  # of compile_s: XLA's compiling (its GPU autotuning included)
        **{
            key: _round(mfu(tokens_per_s, flops_per_token(state.model, context, convention), peak, mesh.devices.size))
            for key, convention in (("mfu", "palm"), ("mfu_llmc", "llmc"))
        },
        "mfu_formulas": {"mfu": MFU_FORMULA["palm"], "mfu_llmc": MFU_FORMULA["llmc"]},
        "planned_memory_bytes": planned_memory(compiled),
        # the device's peak since the process started (devices that report it: GPUs): this configuration's own only
        # when it ran first
        "peak_memory_bytes": stats.get("peak_bytes_in_use") if first else None,
        "peak_host_memory_bytes": host_peak if first else None,  # the process's, likewise
        "device_kind": device.device_kind,
        "num_devices": len(mesh.devices.flat),
        "steps_timed": steps,
        "loss_last": losses[-1],
        "losses": [round(x, 5) for x in losses],
        "custom_calls": custom_calls(hlo),
        "float8_dots": float8_dots(hlo),
        "gemm_epilogues": epilogues(hlo),
        "config": {
            "model": cfg.model.name,
            "n_layer": cfg.model.n_layer,
            "n_embd": cfg.model.n_embd,
            "n_head": cfg.model.n_head,
            "context": context,
            "vocab": p.tokenizer.vocab_size,
            "padded_vocab": state.model.cfg.padded_vocab_size,
            "params": count_params(state.model),
            "flops_per_token": {c: flops_per_token(state.model, context, c) for c in ("palm", "llmc")},
            "global_batch": data.train.global_batch,
            "grad_accum_steps": cfg.train.grad_accum_steps,
            "dtype": cfg.system.dtype,
            "sharding": cfg.system.sharding,
            "mesh_model": cfg.system.mesh_model,
            "remat": cfg.model.remat,
            "scan_layers": state.model.cfg.scan_layers,
            "head_loss": state.model.cfg.head_loss,
            "logits_dtype": state.model.cfg.logits_dtype,
            "attention": state.model.cfg.attention,
            "optimizer": cfg.optimizer.name,
            "xla_flags": xla_flags(cfg.system),
        },
    }


def planned_memory(compiled: Any) -> int | None:
    """Bytes XLA's plan for the compiled step holds at once: arguments, outputs and temporaries, less the outputs
    that reuse donated arguments' buffers."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def custom_calls(hlo_text: str) -> dict[str, int]:
    """How often each custom-call target occurs in a compiled program's HLO (cuDNN's attention, cuBLAS's GEMMs...)."""
    return dict(sorted(Counter(re.findall(r'custom_call_target="([^"]+)"', hlo_text)).items()))


def epilogues(hlo_text: str) -> dict[str, int]:
    """How often each cuBLASLt epilogue (what the GEMM applies as it writes: DEFAULT, BIAS, GELU, ...) occurs in a
    compiled program's GEMM calls (their backend configs)."""
    return dict(sorted(Counter(re.findall(r'"epilogue":"([A-Z_]+)"', hlo_text)).items()))


_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[", re.M)
_DOT = re.compile(r"=\s*\w+\[[^\]]*\]\S*\s+dot\(([^)]*)\)")


def float8_dots(hlo_text: str) -> int:
    """How many dots of an HLO module take two float8 operands: the FP8 matmuls XLA's GPU compiler leaves to its own
    kernels (a Triton GEMM fusion keeps such a dot inside it), beside the ones it hands to cuBLASLt
    (`__cublas$lt$matmul$f8` custom calls). A dot it could not run in FP8 gets wider operands first (none counted)."""
    dtypes = dict(_DEFINITION.findall(hlo_text))  # instruction names are unique within a module

    def dtype(operand: str) -> str:
        name = operand.split()[-1].lstrip("%")
        return dtypes.get(name, operand.split("[")[0] if "[" in operand else "")

    return sum(all(dtype(o).startswith("f8") for o in m.split(", ")) for m in _DOT.findall(hlo_text))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def bench_loader(overrides: list[str], steps: int) -> dict:
    """The data path alone, no model: read the windows, build the batch, put it on the devices."""
    cfg = config_lib.load_config(overrides, jax.local_device_count())
    p = build(cfg)
    jax.block_until_ready(put_batch(p.data.train.batch(0), p.mesh))
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        jax.block_until_ready(put_batch(p.data.train.batch(s), p.mesh))
    seconds = (time.perf_counter() - t0) / steps
    tokens = p.data.train.global_batch * config_lib.context_size(cfg)
    return {
        "loader_tokens_per_s": round(tokens / seconds, 1),
        "ms_per_batch": round(1000 * seconds, 3),
        "tokens_per_batch": tokens,
        "steps": steps,
        "model": cfg.model.name,
    }


def bench_compile(overrides: list[str], vocab: int) -> dict:
    """Compile the train step from abstract shapes only (nothing allocated): for models too big for this machine."""
    import equinox as eqx

    from optimizers import lr_schedule_of
    from training.distributed.sharding import init_mesh, state_shardings
    from training.pipeline.build import state_options
    from training.step.state import TrainState
    from training.step.train_step import make_train_step

    cfg = config_lib.load_config(overrides)
    mesh = init_mesh(cfg.system.num_devices, cfg.system.mesh_model)
    model = eqx.filter_eval_shape(init_model, cfg, vocab, jax.random.PRNGKey(0))
    schedule = init_scheduler(cfg)
    optimizer = init_optimizer(cfg, schedule, model)
    dtype, knobs, fp8 = state_options(cfg, model)
    state = eqx.filter_eval_shape(TrainState.create, model, optimizer, jax.random.PRNGKey(0), dtype, knobs, fp8)
    shardings = state_shardings(state, mesh, cfg.system.sharding)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
    shape = (cfg.train.grad_accum_steps, cfg.train.batch_size, config_lib.context_size(cfg))
    batch = {
        k: jax.ShapeDtypeStruct(shape, dt)
        for k, dt in (("inputs", jax.numpy.int32), ("targets", jax.numpy.int32), ("loss_mask", jax.numpy.float32))
    }
    step = make_train_step(
        optimizer,
        lr_schedule_of(cfg.optimizer, schedule),
        shardings,
        dtype,
        jit=False,
        knobs=knobs,
        z_loss=cfg.train.z_loss,
    )
    arrays, static = eqx.partition(state, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    compiled_step = jax.jit(lambda arrays, batch, lr: step(eqx.combine(arrays, static), batch, lr), donate_argnums=0)
    t0 = time.perf_counter()
    lowered = compiled_step.lower(arrays, batch, jax.ShapeDtypeStruct((), jax.numpy.float32))
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    memory = compiled.memory_analysis()  # XLA's plan for this backend: what the step's buffers take
    return {
        "model": cfg.model.name,
        "params": count_params(model),
        "scan_layers": model.cfg.scan_layers,
        "trace_and_lower_s": round(t1 - t0, 2),
        "compile_s": round(t2 - t1, 2),
        **{
            f"{kind}_bytes": getattr(memory, f"{kind}_size_in_bytes", None)
            for kind in ("argument", "output", "temp", "alias")
        },
        "batch": list(shape),
        "dtype": cfg.system.dtype,
        "head_loss": model.cfg.head_loss,
        "logits_dtype": model.cfg.logits_dtype,
        "remat": cfg.model.remat,
        "device_kind": jax.devices()[0].device_kind,
    }


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=at_least(1), default=20)
    parser.add_argument(
        "--warmup", type=at_least(1), default=3, help="untimed steps before the timed ones, the first compiling"
    )
    parser.add_argument("--loader", action="store_true", help="time the data path alone (no model)")
    parser.add_argument("--compile-only", action="store_true", help="compile from abstract shapes, run nothing")
    parser.add_argument("--vocab", type=int, default=50257, help="--compile-only: the vocab size to build")
    parser.add_argument(
        "--variant", action="append", metavar="OVERRIDES", help="a configuration: overrides added to the common ones"
    )
    parser.add_argument("--record", metavar="DIR", help=f"keep each result as a record in DIR (GPU: {records.RESULTS})")
    parser.add_argument("--no-record", action="store_true", help="keep no record, even on a GPU")
    args, overrides = parser.parse_known_args(argv)
    one_off = "--compile-only" if args.compile_only else "--loader" if args.loader else None
    if one_off and (args.variant or args.record):  # they went unread: one configuration, and no record of it
        parser.error(f"{one_off} measures the common overrides once and keeps no record; drop --variant and --record")
    try:
        if args.record:  # before the measuring: a folder the record can go to
            check_writable("--record", args.record)
        system = config_lib.load_config(overrides).system
        init_host_memory(system.reuse_host_memory)  # as train_jax.py does
        init_xla_flags(system)  # before the backend starts
        if args.compile_only:
            print(json.dumps(bench_compile(overrides, args.vocab)), flush=True)
        elif args.loader:
            print(json.dumps(bench_loader(overrides, args.steps)), flush=True)
        else:
            for i, variant in enumerate(args.variant or [""]):
                extra = shlex.split(variant)
                if any(o.lstrip("+").startswith(("system.xla_flags", "system.deterministic")) for o in extra):
                    raise ConfigError(
                        f"--variant {variant!r}: system.xla_flags and system.deterministic go with the common "
                        "overrides (XLA reads its flags once per process); run one bench.py per set of flags"
                    )
                result = bench(overrides + extra, args.steps, args.warmup, first=i == 0)
                result = {**({"variant": variant} if args.variant else {}), **result}
                keep(args, result, argv)
                print(json.dumps(result), flush=True)
    except PipelineError as e:
        return say(e)
    return 0


def keep(args: argparse.Namespace, result: dict, argv: list[str]) -> None:
    """A record of a train-step result: always on a GPU (unless --no-record), elsewhere with --record DIR."""
    directory = records.destination(args.record, args.no_record, jax.default_backend() == "gpu")
    if directory is None:
        return
    path = records.write(
        directory,
        "bench",
        result["device_kind"],
        result,
        ["python", "-m", "scripts.benchmarks.bench", *argv],
        jax.__version__,
    )
    print(f"bench: recorded {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
