"""FP8 matmuls with delayed per-tensor scaling (`system.dtype=fp8`): the blocks' four weight matmuls take float8
operands, everything else computes in bfloat16.

Forward, the input and the weight are quantised to float8_e4m3fn (3 mantissa bits, range +-448); backward, the
output's gradient is quantised to float8_e5m2 (2 mantissa bits, range +-57,344), and the two gradient matmuls take
it with the forward's quantised operands. Each is a product of float8 operands, rescaled after:
    qx = clip(x / sx, -max, max).astype(float8);   qw likewise;   dot(qx, qw) * (sx sw)
which XLA's GPU compiler makes a cuBLASLt FP8 GEMM with the scales as runtime arguments (Hopper and Ada GPUs). Other
backends run the same products in their own arithmetic: the numbers a GPU would compute, without its speed.

Delayed scaling: a tensor's scale s comes from the largest |x| of the last `history` steps (its amax history),
s = amax / max * 2^margin, so quantising the current step needs no pass over the tensor first. The step records each
tensor's amax of this step into the history. The histories are train state (TrainState.fp8): checkpointed and
restored with everything else, so a resumed run quantises as the straight run does.

How the amaxes leave the compiled step: `fp8_dot` takes the three scales as an input and returns, as that input's
"gradient", the three amaxes it saw (x and w in the forward, the output's gradient in the backward). The train step
reads them from the gradient pytree, takes the largest over micro-batches, and records them; the optimizer never sees
them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
X, W, G = 0, 1, 2  # a matmul's three scaled tensors: input, weight, output gradient
TENSORS = ("input", "weight", "gradient")  # their names, in that order
MATMULS = ("qkv", "attn_proj", "fc", "mlp_proj")  # the blocks' weight matmuls in FP8 (the LM head stays bf16)


def native_fp8_problem() -> str | None:
    """None where XLA runs FP8 GEMMs natively (NVIDIA GPUs of compute capability 8.9 or newer: Ada, Hopper); else
    why not, in a few words."""
    device = jax.devices()[0]
    if device.platform == "gpu":
        capability = getattr(device, "compute_capability", None)
        if capability is not None and tuple(map(int, str(capability).split("."))) >= (8, 9):
            return None
        return f"{device.device_kind} (compute capability {capability}) has no FP8 matmuls (8.9 or newer needed)"
    return f"the {device.platform} backend has no FP8 matmuls"


def _max(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def _limits() -> jax.Array:
    """[3] the formats' max of a matmul's input, weight and output gradient (X, W, G): E4M3's, E4M3's, E5M2's."""
    return jnp.asarray([_max(E4M3), _max(E4M3), _max(E5M2)], jnp.float32)


def quantize_dequantize(x: jax.Array, dtype, scale: jax.Array) -> jax.Array:
    """x rounded to `dtype` at `scale` and back, in x's dtype (the value an FP8 operand stands for)."""
    return quantize(x, dtype, scale).astype(x.dtype) * scale.astype(x.dtype)


def _amax(x: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(x)).astype(jnp.float32)


def quantize(x: jax.Array, dtype, scale: jax.Array) -> jax.Array:
    """x / scale rounded to the float8 `dtype` (clipped to its range)."""
    limit = _max(dtype)
    return jnp.clip(x / scale.astype(x.dtype), -limit, limit).astype(dtype)


def scaled_dot(a, b, scale_a: jax.Array, scale_b: jax.Array, dimensions, out_dtype) -> jax.Array:
    """(a scale_a) . (b scale_b) from float8 operands a and b: their product, then the scales. XLA's GPU compiler
    makes this one FP8 GEMM with the scales as runtime values (`scripts.benchmarks.fp8_gemm`: on an H100 677 TFLOP/s
    for 8192 x 4096 x 4096); the quantise-dequantise form, dot(q.astype(bf16) * s, ...), it made one only where the
    scales were constants, and the train step's come from its amax history (a bfloat16 GEMM at 497 TFLOP/s there)."""
    product = jax.lax.dot_general(a, b, dimensions, preferred_element_type=out_dtype)
    return product * (scale_a * scale_b).astype(out_dtype)


def fp8_dot(x_ND: jax.Array, w: jax.Array, scales_3: jax.Array) -> jax.Array:
    """x [N, D] W [D, *out] with float8 operands; `scales_3` (float32 [3]) are the input's, the weight's and the
    output gradient's. Its cotangent is not a gradient: it is the amaxes of the three tensors (module docstring)."""
    return _fp8_dot(x_ND, w, scales_3, (jnp.dtype(x_ND.dtype), jnp.dtype(w.dtype)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fp8_dot(x_ND, w, scales_3, dtypes):
    return _fp8_dot_fwd(x_ND, w, scales_3, dtypes)[0]


def as_quantised(scale: jax.Array, a: jax.Array) -> jax.Array:
    """`scale` as `quantize` divides `a` by it (rounded to a's dtype), in float32: the rescaling undoes exactly that."""
    return scale.astype(a.dtype).astype(jnp.float32)


def _fp8_dot_fwd(x_ND, w, scales_3, dtypes):
    sx, sw = as_quantised(scales_3[X], x_ND), as_quantised(scales_3[W], w)
    xq, wq = quantize(x_ND, E4M3, sx), quantize(w, E4M3, sw)
    y = scaled_dot(xq, wq, sx, sw, (((1,), (0,)), ((), ())), dtypes[0])
    return y, (xq, wq, sx, sw, scales_3[G], _amax(x_ND), _amax(w))


def _fp8_dot_bwd(dtypes, residuals, g):
    xq, wq, sx, sw, sg, amax_x, amax_w = residuals
    sg = as_quantised(sg, g)
    gq = quantize(g, E5M2, sg)
    out_axes = tuple(range(1, wq.ndim))
    dx = scaled_dot(gq, wq, sg, sw, ((out_axes, out_axes), ((), ())), dtypes[0])  # g W^T
    dw = scaled_dot(xq, gq, sx, sg, (((0,), (0,)), ((), ())), dtypes[1])  # x^T g
    return dx, dw, jnp.stack([amax_x, amax_w, _amax(g)])


_fp8_dot.defvjp(_fp8_dot_fwd, _fp8_dot_bwd)


# The amax a tensor is taken to have before any is recorded (a fresh run's first step): the input's and the weight's
# format max (scale 1: E4M3's range [2^-9, 448] as it is), and 1 for the output gradient. At scale 1, E5M2's range
# [2^-16, 57,344] flushes a mean loss's gradients to zero: gpt2-mini at 32,768 tokens a batch has its blocks' output
# gradients' amaxes at 2.7e-6 to 2.3e-5 in the first step, the smallest E5M2 value is 1.5e-5, and gpt2's FP8 run on an
# H100 took a first step whose loss rose (11.02 against bfloat16's 9.90). At amax 1 the range reaches 2.7e-10.
FIRST_AMAX = (_max(E4M3), _max(E4M3), 1.0)


def scales_from_history(history: jax.Array, margin: int = 0) -> jax.Array:
    """[..., 3, H] amax histories -> [..., 3] scales: the largest finite amax over the history mapped to the format's
    max divided by 2^margin (E4M3 for input and weight, E5M2 for the gradient), so that a tensor may grow 2^margin
    times past its history before it clips; FIRST_AMAX's, with no headroom, where nothing is recorded yet."""
    amax = jnp.max(jnp.where(jnp.isfinite(history), history, 0.0), axis=-1)
    limits = _limits()
    first = jnp.asarray(FIRST_AMAX, jnp.float32) / limits  # 1 for input and weight
    return jnp.where(amax > 0, amax / limits * 2.0**margin, first)


def amax_over_range(scales: jax.Array, amax: jax.Array) -> jax.Array:
    """[..., 3] each tensor's amax over the range its scale covers (the scale times the format's max): above 1 the
    tensor's largest values were clipped to the format's max. Delayed scaling clips where a tensor outgrows the
    amaxes of its history, as activations and gradients do while they grow early in training."""
    return amax / (scales * _limits())


class Fp8Recipe(NamedTuple):
    """Delayed scaling's settings (system.fp8_amax_history and system.fp8_margin): each tensor's scale comes from its
    amaxes of the last `history` steps, with `margin` powers of two of headroom."""

    history: int
    margin: int = 0


class Fp8State(eqx.Module):
    """The amax histories of every FP8 matmul: [L, 4 matmuls (MATMULS), 3 tensors (X, W, G), H steps], newest
    first; and the scales' headroom in powers of two (`margin`, system.fp8_margin: a setting, not state, so a resumed
    run takes the margin it is given)."""

    history: jax.Array
    margin: int = eqx.field(static=True, default=0)

    @staticmethod
    def create(n_layer: int, recipe: Fp8Recipe) -> Fp8State:
        return Fp8State(jnp.zeros((n_layer, len(MATMULS), 3, recipe.history), jnp.float32), recipe.margin)

    def scales(self) -> jax.Array:
        """[L, 4, 3]: the scales this step quantises with."""
        return scales_from_history(self.history, self.margin)

    def record(self, amax: jax.Array) -> Fp8State:
        """The histories with this step's amaxes ([L, 4, 3]) in front and the oldest dropped."""
        return Fp8State(jnp.concatenate([amax[..., None], self.history[..., :-1]], axis=-1), self.margin)
