"""What `auto` (or null) means for the model settings whose best value depends on the backend: the attention kernel
(cuDNN's where it runs, probed once per process), layers scanned or unrolled, the LM head dense or chunked, and the
logits' dtype. Each takes the setting as configured and returns it resolved for this process's JAX backend; a value
asked for by name is kept (cudnn where it cannot run is a config error)."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from core.errors import ConfigError


def resolve_scan_layers(requested: bool | None) -> bool:
    """`model.scan_layers`: null (the default, here and in GPTConfig) -> unrolled layers on a GPU (gpt2 on an H200:
    1.30x and 1.35x the tokens/s of scanned in two runs, on an H100 1.348x, with less memory: the scan's stacked
    carries and per-layer slices cost copies there), scanned elsewhere (compile time independent of depth; the CPU
    presets gpt2-micro and -mini unroll by their own setting)."""
    return jax.default_backend() != "gpu" if requested is None else requested


def resolve_head_loss(requested: str, differentiated_twice: bool) -> str:
    """`model.head_loss`: auto (the default) -> the chunked head on a GPU (gpt2 at batch 32: 1.049x the dense head's
    tokens/s on an H100, 1.033x on an H200, each in one process, and 3 GiB less), the dense head elsewhere (a CPU's
    runs hold small batches) and where the loss is differentiated twice (the chunked head's backward pass is written
    by hand, once)."""
    if requested != "auto":
        return requested
    return "chunked" if jax.default_backend() == "gpu" and not differentiated_twice else "dense"


def resolve_logits_dtype(requested: str) -> str:
    """`model.logits_dtype`: auto (the default) -> the compute dtype on a GPU, where the passes over gpt2's [B, T, V]
    logits are memory-bound (bf16 logits: 1.040x the tokens/s of float32's on an H100, the same 23 losses within
    0.0044), float32 elsewhere (a CPU's step is compute-bound and its runs mostly float32)."""
    if requested != "auto":
        return requested
    return "compute" if jax.default_backend() == "gpu" else "float32"


# XLA's deterministic GPU kernels: `system.deterministic=true` adds this flag to XLA_FLAGS before the backend starts
DETERMINISTIC_GPU_FLAG = "--xla_gpu_deterministic_ops=true"


def deterministic_kernels(xla_flags: str) -> bool:
    """Whether XLA_FLAGS-style `xla_flags` turn XLA's deterministic GPU kernels on, as XLA reads a boolean flag: its
    last `--xla_gpu_deterministic_ops`, bare or `=true` / `=1`."""
    on = False
    for flag in xla_flags.split():
        name, _, value = flag.partition("=")
        if name == DETERMINISTIC_GPU_FLAG.partition("=")[0]:
            on = value.lower() in ("", "true", "1")
    return on


def resolve_attention(requested: str, dtype: str, deterministic: bool = False) -> str:
    """`auto` -> cuDNN's fused attention where it runs (NVIDIA GPU, 16-bit compute); on CPU the causal-blocked
    attention (1.15x faster train steps there, BENCHMARKS.md); else XLA's. `deterministic`: the run asks for XLA's
    deterministic GPU kernels (`system.deterministic`); the flag in XLA_FLAGS counts too."""
    return _resolve_attention(requested, dtype, deterministic or deterministic_kernels(os.environ.get("XLA_FLAGS", "")))


@functools.cache
def _resolve_attention(requested: str, dtype: str, deterministic: bool) -> str:
    backend = jax.default_backend()
    if requested in ("xla", "blocked"):
        return requested
    if backend != "gpu":
        failure = f"the backend is {backend}"
    elif dtype == "fp8" and deterministic:
        # measured on an H100 (jaxlib 0.11.2): gpt2-tiny's FP8 step with cuDNN's attention on deterministic kernels
        # fails at its first call (`IndexError: absl::container_internal::raw_hash_map<>::at`), with XLA's it runs;
        # the bfloat16 step and the probe below run on the same kernels
        failure = "an FP8 step's cuDNN attention fails on XLA's deterministic kernels, which this run asks for"
    else:
        failure = _cudnn_attention_failure("bfloat16" if dtype == "fp8" else dtype)  # fp8 attends in bfloat16
    if requested == "cudnn" and failure:
        raise ConfigError(
            f"config: model.attention: cudnn is not available ({failure}); use model.attention=auto or xla"
        )
    if not failure:
        return "cudnn"
    return "blocked" if backend == "cpu" else "xla"


def _cudnn_attention_failure(dtype: str) -> str | None:
    """Why cuDNN's attention does not run here (forward and backward, as training runs it), or None: an unsupported
    dtype, GPU generation or cuDNN version. On XLA's deterministic kernels jaxlib 0.11.2's XLA failed 16-bit steps
    with cuDNN's attention at their first call at 83d6e15 (`IndexError: absl::container_internal::raw_hash_map<>::at`,
    openxla/xla#46500), which this probe would catch; on an H100 at 7263e04 the probe and the bfloat16 step passed
    there and only the FP8 step failed (`_resolve_attention`'s FP8 branch)."""

    def loss(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn").astype(jnp.float32).sum()

    # Forward and backward compiled into one program, as in the train step: run op by op, the same calls passed on an
    # H100 under deterministic kernels where gpt2's step then failed.
    try:
        with jax.ensure_compile_time_eval():  # run it, also where a model is built under a trace (eval_shape, jit)
            qkv = [jnp.zeros((2, 128, 2, 64), jnp.dtype(dtype))] * 3  # concrete here: made inside, never tracers
            jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*qkv))
        return None
    except Exception as e:  # unsupported dtype, GPU generation or cuDNN version: XLA's attention is the fallback
        first = (str(e).strip().splitlines() or [""])[0][:160]
        return f"cuDNN's {dtype} attention fails here: {type(e).__name__}: {first}"
