"""Keys whose spelling changed, in one place: a saved config (a checkpoint's config.yaml) written before the change is
upgraded to today's keys, and a command line that still uses the old key is told the new one."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

# old key -> what replaced it (said in the unknown-key error)
RENAMED = {
    "optimizer.lr_config.min_lr": "optimizer.lr_config.min_lr_ratio, the floor as a fraction of the lr (min_lr / lr)",
}


def renamed_hint(key: str) -> str:
    """'; it is now ...' for a key that was renamed, else ''."""
    return f"; it is now {RENAMED[key]}" if key in RENAMED else ""


def upgrade_saved(saved: DictConfig) -> DictConfig:
    """A saved config in today's keys: an absolute `optimizer.lr_config.min_lr` (before each preset owned its
    schedule) becomes the same floor as `min_lr_ratio` of its lr."""
    lr_config = OmegaConf.select(saved, "optimizer.lr_config")
    if isinstance(lr_config, DictConfig) and "min_lr" in lr_config:
        with open_dict(lr_config):
            floor, peak = lr_config.pop("min_lr"), lr_config.get("lr", 0.0)
            lr_config["min_lr_ratio"] = min(floor / peak, 1.0) if peak > 0 else 0.0
    return saved
