"""Model FLOPs and MFU (model FLOPs utilisation): the one definition the log, summary.json and bench.py use.

FLOPs per token = 6 N + a L C T, with N the parameters each token multiplies (models/gpt.py `matmul_params`): all but
the lookup tables, i.e. without the position embedding, and without the token embedding when the LM head is a matrix
of its own (tied, the embedding is the head's matmul); 6 per parameter (forward 2, backward 4). SwiGLU's three
matrices and grouped-query attention's narrower keys and values are counted by their parameters. L layers, C width,
T context; the second term is attention's score and value matmuls, which have no parameters (each of the n_head query
heads scores T keys of H = C / n_head dimensions, however many key/value heads they share):
  palm  a = 12: every query scores every key, as PaLM (appendix B) and nanoGPT count. The pipeline's MFU.
  llmc  a = 6: causal attention only needs the lower triangle, as llm.c counts.
MFU = tokens/s x FLOPs per token / (devices x the device's peak FLOP/s). Recomputation (remat) is not counted: MFU
measures the model's work, not the hardware's.
"""

from __future__ import annotations

from models.gpt import GPT, matmul_params

ATTENTION_FLOPS = {"palm": 12, "llmc": 6}  # a in 6 N + a L C T, per convention
MFU_CONVENTION = "palm"
MFU_FORMULA = {"palm": "6N + 12*L*C*T (PaLM, nanoGPT)", "llmc": "6N + 6*L*C*T (llm.c: causal attention halved)"}

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


def flops_per_token(model: GPT, context: int, convention: str = MFU_CONVENTION) -> int:
    cfg = model.cfg
    n = matmul_params(model)
    return 6 * n + ATTENTION_FLOPS[convention] * cfg.n_layer * cfg.n_embd * context


def peak_flops(device_kind: str, dtype: str, override: float | None = None) -> float | None:
    """The device's peak for `dtype`: `system.peak_flops` if set, else the table (first matching name), else None
    (CPUs and unknown devices: MFU is shown as n/a)."""
    if override:
        return float(override)
    for name, peaks in PEAK_FLOPS.items():
        if name in device_kind:
            # fp8 against the bfloat16 peak: its MFU says how much faster than bfloat16 the model trains
            return peaks["bfloat16" if dtype == "fp8" else dtype]
    return None


def mfu(tokens_per_s: float, flops: int, peak: float | None, num_devices: int) -> float | None:
    """The share of `num_devices` devices' peak that `tokens_per_s` tokens of `flops` FLOPs each use; None when the
    peak is unknown."""
    if peak is None or not tokens_per_s == tokens_per_s:  # unknown peak, or no rate measured yet (NaN)
        return None
    return tokens_per_s * flops / (peak * num_devices)
