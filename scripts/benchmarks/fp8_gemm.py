"""Which forms of an FP8 matrix product XLA compiles into FP8 GEMMs on this device, and how fast each runs.

    python -m scripts.benchmarks.fp8_gemm                       # 8192 x 4096 x 4096, one JSON line per form
    python -m scripts.benchmarks.fp8_gemm --m 4096 --k 768 --n 2304 --iters 50

Each form computes x W from bfloat16 x [M, K] and W, with float8_e4m3fn operands at per-tensor scales. The forms, in
the order printed: models/fp8.py's `fp8_dot` (float8 operands to `dot_general`, the product rescaled after, W as
[K, N]: the train step's form) with its scales as a runtime argument, as the train step reads them from its amax
history, and with constant scales; the quantise-dequantise form (bfloat16 operands that hold float8 values,
dot(q.astype(bf16) * s, ...)) at constant and at runtime scales with W as [K, N], with W as [N, K], and dequantised in
float32; float8 operands with W as [N, K]; and the plain bfloat16 product; before them, `fp8_dot`'s forward and
backward together at runtime scales (custom calls only: three FP8 GEMMs where the device makes them). On an H100 the
quantise-dequantise form at runtime scales compiled to a bfloat16 GEMM without FP8's rounding (BENCHMARKS.md, "FP8"),
the float8 operands at runtime scales to an FP8 GEMM. Reported per form: the compiled program's custom calls
(`__cublas$lt$matmul$f8` where XLA's GPU compiler made a cuBLASLt FP8 GEMM of it) and its dots of float8 operands
("float8 dots": FP8 matmuls XLA keeps for its own kernels, Triton's), the median time of `--iters`
calls, TFLOP/s, and the product's distance from x W computed from the same bfloat16 operands into float32 (relative,
in norm: FP8's rounding, or bfloat16's output rounding for the plain product). Another backend than a GPU runs every
form as bfloat16 or float32 arithmetic (no FP8 GEMM): its times say nothing of FP8.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from core.arguments import OneLineParser, at_least
from models.fp8 import E4M3, as_quantised, fp8_dot, quantize, quantize_dequantize, scaled_dot
from scripts.benchmarks.bench import custom_calls, float8_dots

SCALES = (4.0 / 448, 0.1 / 448, 1e-3 / 57344)  # the input's, the weight's and the output gradient's


def _qdq_f32(a: jax.Array, scale: jax.Array) -> jax.Array:
    return quantize_dequantize(a.astype(jnp.float32), E4M3, scale)


def _qdq_dot(x: jax.Array, w: jax.Array, scales: jax.Array, dimensions) -> jax.Array:
    """The quantise-dequantise form: bfloat16 operands holding float8 values."""
    return jax.lax.dot_general(
        quantize_dequantize(x, E4M3, scales[0]), quantize_dequantize(w, E4M3, scales[1]), dimensions
    )


def _f8_dot(x: jax.Array, w: jax.Array, scales: jax.Array, dimensions) -> jax.Array:
    """Float8 operands to dot_general, as fp8_dot's (rescaled by the scales as `quantize` divided by them), in any
    layout."""
    sx, sw = as_quantised(scales[0], x), as_quantised(scales[1], w)
    return scaled_dot(quantize(x, E4M3, sx), quantize(w, E4M3, sw), sx, sw, dimensions, x.dtype)


def forms(scales: jax.Array) -> dict[str, Callable]:
    """name -> f(x [M, K], w [K, N], w_t [N, K], runtime scales [3])."""
    kn, nk = (((1,), (0,)), ((), ())), (((1,), (1,)), ((), ()))
    return {
        "fp8_dot: float8 operands at runtime scales, W [K, N] (the train step's form)": lambda x, w, w_t, s: fp8_dot(
            x, w, s
        ),
        "fp8_dot with constant scales": lambda x, w, w_t, s: fp8_dot(x, w, scales),
        "bf16 quantise-dequantise, constant scales, W [K, N]": lambda x, w, w_t, s: _qdq_dot(x, w, scales, kn),
        "bf16 quantise-dequantise, runtime scales, W [K, N]": lambda x, w, w_t, s: _qdq_dot(x, w, s, kn),
        "bf16 quantise-dequantise, constant scales, W [N, K]": lambda x, w, w_t, s: _qdq_dot(x, w_t, scales, nk),
        "float32 quantise-dequantise, constant scales, W [N, K]": lambda x, w, w_t, s: jax.lax.dot_general(
            _qdq_f32(x, scales[0]), _qdq_f32(w_t, scales[1]), nk
        ),
        "float8 operands at runtime scales, W [N, K]": lambda x, w, w_t, s: _f8_dot(x, w_t, s, nk),
        "bfloat16 product (no FP8)": lambda x, w, w_t, s: x @ w,
    }


def matmuls(hlo_text: str) -> dict[str, int]:
    """A compiled program's custom calls, and its dots of float8 operands under "float8 dots" (XLA's own FP8
    kernels)."""
    return {**custom_calls(hlo_text), "float8 dots": float8_dots(hlo_text)}


def measure(f: Callable, args: tuple, iters: int) -> tuple[str, float, jax.Array]:
    """The compiled program's HLO text, the median ms of `iters` synchronised calls, and the product."""
    jitted = jax.jit(f)
    text = jitted.lower(*args).compile().as_text()
    y = jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        times.append(time.perf_counter() - t)
    return text, 1000 * statistics.median(times), y


def main(argv: list[str]) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=at_least(1), default=8192, help="rows of x (tokens)")
    p.add_argument("--k", type=at_least(1), default=4096, help="the contracted width")
    p.add_argument("--n", type=at_least(1), default=4096, help="columns of W")
    p.add_argument("--iters", type=at_least(1), default=20)
    args = p.parse_args(argv)
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (args.m, args.k), jnp.bfloat16)
    w = (0.02 * jax.random.normal(kw, (args.k, args.n), jnp.float32)).astype(jnp.bfloat16)
    scales = jnp.asarray(SCALES, jnp.float32)
    operands = (x, w, w.T, scales)
    flops = 2 * args.m * args.k * args.n
    device = jax.devices()[0].device_kind
    reference = jnp.matmul(x, w, preferred_element_type=jnp.float32)

    def loss(x, w, s):  # the train step's case: scales from its amax history, runtime values
        return jnp.sum(jnp.square(fp8_dot(x, w, s).astype(jnp.float32)))

    gradient = jax.jit(jax.grad(loss, argnums=(0, 1)))
    fp8_gemms = matmuls(gradient.lower(x, w, scales).compile().as_text())
    form = "fp8_dot forward and backward at runtime scales"
    print(json.dumps({"form": form, "custom_calls": fp8_gemms, "device": device}), flush=True)
    for name, f in forms(scales).items():
        text, ms, y = measure(f, operands, args.iters)
        error = float(jnp.linalg.norm(y.astype(jnp.float32) - reference) / jnp.linalg.norm(reference))
        line = {"form": name, "custom_calls": matmuls(text), "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1)}
        line |= {"relative_error": round(error, 5), "shape": [args.m, args.k, args.n], "device": device}
        print(json.dumps(line), flush=True)

    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
