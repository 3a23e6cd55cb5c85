"""Which forms of a bfloat16 matmul's bias and GELU XLA folds into cuBLASLt's epilogues on this device, and how fast
each form's forward and backward run.

    python -m scripts.benchmarks.gemm_epilogue                    # gpt2's MLP input matmul: 32,768 x 768 x 3,072
    python -m scripts.benchmarks.gemm_epilogue --m 8192 --iters 50

Why: on an H100, gpt2's step spends ~17.6 of its ~68 ms on elementwise passes (LayerNorm, GELU, bias and residual
adds; BENCHMARKS.md, "Targets"), and every one of its 147 cuBLASLt GEMMs ran with the DEFAULT epilogue. cuBLASLt can
add a bias and apply GELU while it writes the product (epilogues BIAS, GELU, BIAS_GELU, their _AUX forms keeping the
pre-activation for the backward, BGRADB for the bias's gradient), which saves a pass over the [M, N] output.

Every form computes GELU(x W + b) or a part of it from bfloat16 x [M, K], W [K, N] and b [N]: the product alone; with
the bias; the bias and GELU on the 2-D product; and models/block.py's `Linear` with models/mlp.py's GELU on x as
[B, T, K] (B = M / --context), the train step's own form. Each is compiled twice, forward alone and forward with the
backward (its vjp at a fixed cotangent: dx, dW and db). Reported per form and pass: the compiled program's GEMM
custom calls, the epilogue of each cuBLASLt call (its backend config), the median ms of `--iters` synchronised calls,
and the output's distance from the same function in float32 (relative, in norm). Another backend than a GPU makes no
cuBLASLt calls: its times say nothing of epilogues.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp

from core.arguments import OneLineParser, at_least
from models.block import Linear
from models.mlp import mlp_activation
from scripts.benchmarks.bench import custom_calls, epilogues
from scripts.benchmarks.fp8_gemm import measure


def forms(context: int) -> dict[str, Callable]:
    """name -> f(x [M, K], w [K, N], b [N]) -> [M, N]."""

    def model(x, w, b):
        x_BTK = x.reshape(-1, context, x.shape[-1])
        return mlp_activation("gelu", Linear(w, b)(x_BTK)).reshape(x.shape[0], -1)

    return {
        "x W": lambda x, w, b: x @ w,
        "x W + b": lambda x, w, b: x @ w + b,
        "GELU(x W + b), 2-D": lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=True),
        "Linear then GELU on [B, T, K] (the train step's form)": model,
    }


def with_backward(f: Callable, g: jax.Array) -> Callable:
    """f's output and its vjp at the cotangent g: dx, dW and db."""

    def both(x, w, b):
        y, pullback = jax.vjp(f, x, w, b)
        return (y, *pullback(g.astype(y.dtype)))

    return both


def main(argv: list[str]) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=at_least(1), default=32768, help="rows of x (tokens: gpt2's batch of 32 x 1,024)")
    p.add_argument("--k", type=at_least(1), default=768, help="the contracted width (gpt2's n_embd)")
    p.add_argument("--n", type=at_least(1), default=3072, help="columns of W (gpt2's MLP width)")
    p.add_argument("--context", type=at_least(1), default=1024, help="T of the [B, T, K] form; must divide --m")
    p.add_argument("--iters", type=at_least(1), default=20)
    args = p.parse_args(argv)
    if args.m % args.context:
        print(f"error: --context {args.context} must divide --m {args.m}", file=sys.stderr)
        return 2
    kx, kw, kb, kg = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(kx, (args.m, args.k), jnp.bfloat16)
    w = (0.02 * jax.random.normal(kw, (args.k, args.n), jnp.float32)).astype(jnp.bfloat16)
    b = (0.02 * jax.random.normal(kb, (args.n,), jnp.float32)).astype(jnp.bfloat16)
    g = jax.random.normal(kg, (args.m, args.n), jnp.bfloat16)
    device = jax.devices()[0].device_kind
    for name, f in forms(args.context).items():
        exact = f(x.astype(jnp.float32), w.astype(jnp.float32), b.astype(jnp.float32))
        for passes, fn in (("forward", f), ("forward and backward", with_backward(f, g))):
            text, ms, out = measure(fn, (x, w, b), args.iters)
            y = out if passes == "forward" else out[0]
            error = float(jnp.linalg.norm(y.astype(jnp.float32) - exact) / jnp.linalg.norm(exact))
            line = {"form": name, "passes": passes, "custom_calls": custom_calls(text), "epilogues": epilogues(text)}
            line |= {"ms": round(ms, 4), "relative_error": round(error, 5), "shape": [args.m, args.k, args.n]}
            print(json.dumps(line | {"device": device}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
