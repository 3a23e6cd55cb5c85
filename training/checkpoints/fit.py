"""Whether a checkpoint fits the run that loads it, checked from its metadata before anything is restored: the same
model (its parameters' shapes) and the same optimizer state's structure (gradient accumulation or none); and
mode=eval's batches, the validation set the run logged."""

from __future__ import annotations

import dataclasses

from core.errors import CheckpointError, ConfigError
from training.config import Config
from training.config.legacy import model_arch

# Keys that fix the parameters' shapes and which parameters there are: a checkpoint only loads into a model with the
# same values (a model without one of the checkpoint's arrays, e.g. rotary positions against a learned embedding,
# would drop it without a word).
MODEL_SHAPE_KEYS = (
    "arch",
    "n_layer",
    "n_head",
    "n_embd",
    "context_size",
    "bias",
    "vocab_multiple",
    "position",
    "norm",
    "norm_weight",
    "mlp",
    "fused_qkv",
    "qk_norm",
    "tie_embeddings",
    "head_bias",
    "unet_skips",
    "value_embeddings",
    "smear_gate",
)


def check_same_model(cfg: Config, meta: dict, where: str) -> None:
    """`meta`: the checkpoint's metadata; `where`: the checkpoint, as messages name it."""
    saved_model = dict(meta.get("config", {}).get("model", {}))
    if "arch" in saved_model:
        saved_model["arch"] = model_arch(saved_model["arch"])
    diffs = [
        f"{k} {saved_model.get(k)} (checkpoint) vs {getattr(cfg.model, k)}"
        for k in MODEL_SHAPE_KEYS
        if k in saved_model and saved_model[k] != getattr(cfg.model, k)
    ]
    if diffs:
        raise CheckpointError(
            f"checkpoint {where} holds a different model: {'; '.join(diffs)}. "
            f"Use the same model settings (the checkpoint's are model={saved_model.get('name')})"
        )


def check_same_accumulation(cfg: Config, meta: dict) -> None:
    """Gradient accumulation wraps the optimizer (optax.MultiSteps, with its accumulator), one step of it none: its
    state restores only on the same side. Blamed on the optimizer at restore time ("a different optimizer?")."""
    saved = meta.get("config", {}).get("train", {}).get("grad_accum_steps", 1)
    mine = cfg.train.grad_accum_steps
    if not cfg.checkpoint.overwrite_optimizer and (saved > 1) != (mine > 1):
        keep = "1" if saved == 1 else "it above 1"
        raise ConfigError(
            f"config: train.grad_accum_steps: {mine} where the checkpoint's optimizer state was saved with {saved}; "
            f"accumulation (above 1) keeps another optimizer state than none: keep {keep}, or start a fresh "
            "optimizer with checkpoint.overwrite_optimizer=True"
        )


def eval_as_logged(cfg: Config, meta: dict, processes: int) -> Config:
    """mode=eval in `processes` processes scores the validation batches the checkpoint's run logged: `train.batch_size`
    sequences from each of its processes, the same global batches shared out over these (in another count, the
    per-process batch of the saved config gave another set, and another loss, without a word)."""
    saved = meta.get("process_count") or 1
    if saved == processes:
        return cfg
    rows = cfg.train.batch_size * saved
    if rows % processes:
        raise ConfigError(
            f"mode=eval: the checkpoint's run evaluated batches of {rows} sequences ({saved} process(es) x "
            f"train.batch_size={cfg.train.batch_size}), which {processes} processes cannot share evenly; evaluate in "
            f"{saved} process(es)"
        )
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=rows // processes))
