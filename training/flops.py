"""Model FLOPs and MFU (model FLOPs utilisation), counted as llm.c counts them.

FLOPs per token = 6 N + 6 L C T: 6 per parameter (forward 2, backward 4) with N excluding the position embedding
(a lookup, no matmul) but including the token embedding (it is the LM head's matmul), plus attention's score and
value matmuls, 12 L C T, halved because causal attention only needs the lower triangle. L layers, C width, T context.
MFU = tokens/s x FLOPs per token / (devices x the device's peak FLOP/s).
"""

from __future__ import annotations

from typing import Any

from models.gpt import count_params

# Dense peak FLOP/s per device by compute dtype, from the vendors' data sheets. float32 matmuls on these GPUs run
# as TF32 on the tensor cores under JAX's default precision.
PEAK_FLOPS = {
    "H100 PCIe": {"bfloat16": 756e12, "float16": 756e12, "float32": 378e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 494e12},  # SXM
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 494e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 156e12},
    "L4": {"bfloat16": 121e12, "float16": 121e12, "float32": 60e12},
    "A10G": {"bfloat16": 70e12, "float16": 70e12, "float32": 35e12},
    "TPU v4": {"bfloat16": 275e12, "float16": 275e12, "float32": 275e12},
    "TPU v5 lite": {"bfloat16": 197e12, "float16": 197e12, "float32": 197e12},
}


def flops_per_token(model: Any, context: int) -> int:
    cfg = model.cfg
    n = count_params(model, exclude_position_embedding=True)
    return 6 * n + 6 * cfg.n_layer * cfg.n_embd * context


def peak_flops(device_kind: str, dtype: str, override: float | None = None) -> float | None:
    """The device's peak for `dtype`: `system.peak_flops` if set, else the table (first matching name), else None
    (CPUs and unknown devices: MFU is shown as n/a)."""
    if override:
        return float(override)
    for name, peaks in PEAK_FLOPS.items():
        if name in device_kind:
            return peaks[dtype]
    return None


def mfu(tokens_per_s: float, model: Any, context: int, peak: float, num_devices: int) -> float:
    return tokens_per_s * flops_per_token(model, context) / (peak * num_devices)
