"""Whether a checkpoint fits the run that loads it, checked from its metadata before anything is restored: the same
model (its parameters' shapes), the same optimizer state's structure (gradient accumulation or none) and the same
stages up to its step; and mode=eval's batches, the validation set the run logged."""

from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from core.errors import CheckpointError, ConfigError
from training.config import Config, finish, schedule_steps
from training.config.legacy import model_arch, upgrade_saved
from training.config.stages import plan_stages

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


def check_same_stages(cfg: Config, meta: dict, step: int) -> None:
    """A resumed run under its own config (checkpoint.overwrite_config=True) whose train.stages put the checkpoint's
    steps in other stages: their ends are fractions of the schedule's steps, so a longer train.max_steps moves them
    (steps the checkpoint trained in stage 2 fall in stage 1 again: its window and lr multiplier, silently; or its
    batch, read as a data position the checkpoint never had). Refused, naming the stages."""
    try:
        saved = finish(upgrade_saved(OmegaConf.create(meta["config"])), saved=True)
    except Exception:  # a config too old to plan: the restore says what does not fit
        return
    if not (cfg.train.stages or saved.train.stages):
        return
    before, now = ([s for s in plan_stages(c) if s.first_step < step] for c in (saved, cfg))
    if before == now:
        return

    def starts(stages: list) -> str:
        return ", ".join(str(s.first_step) for s in stages)

    keep = (
        f"keep the schedule at {schedule_steps(saved)} steps, or "
        if schedule_steps(saved) != schedule_steps(cfg)
        else ""
    )
    raise ConfigError(
        f"config: train.stages: the checkpoint's {step} steps trained in stages starting at steps {starts(before)} "
        f"(their `until` fractions of {schedule_steps(saved)} schedule steps), where this run's stages over "
        f"{schedule_steps(cfg)} start at {starts(now)} (or set another batch, window or lr multiplier): {keep}give "
        f"train.stages whose stages before step {step} are the checkpoint's (its config.yaml has them)"
    )


def eval_as_logged(cfg: Config, meta: dict, processes: int, local_devices: int | None = None) -> Config:
    """mode=eval in `processes` processes scores the validation batches the checkpoint's run logged: `train.batch_size`
    sequences from each of its processes, the same global batches shared out over these (in another count, the
    per-process batch of the saved config gave another set, and another loss, without a word). `local_devices`: each
    process's, over which its share is split (the config's check saw the saved batch, not this share)."""
    saved = meta.get("process_count") or 1
    if saved == processes:
        return cfg
    rows = cfg.train.batch_size * saved
    logged = f"the checkpoint's run evaluated batches of {rows} sequences ({saved} process(es) x train.batch_size="
    if rows % processes:
        raise ConfigError(
            f"mode=eval: {logged}{cfg.train.batch_size}), which {processes} processes cannot share evenly; evaluate "
            f"in {saved} process(es)"
        )
    share = rows // processes
    data_devices = (cfg.system.num_devices or local_devices or 1) // cfg.system.mesh_model
    if share % data_devices:
        raise ConfigError(
            f"mode=eval: {logged}{cfg.train.batch_size}), {share} per process in {processes}, which its "
            f"{data_devices} devices cannot share evenly; evaluate in {saved} process(es), or on devices that divide "
            f"{share} per process"
        )
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=share))
