"""The earlier spellings, in one place: keys whose spelling changed (a saved config written before the change is
upgraded to today's keys, and a command line that still uses the old key is told the new one), and the earlier
pipelines' values that are still read (piano-gpt's `eval_only=true` and `init_from=scratch_next_token`, trainit's
`checkpoint.load_file=iter_<step>.ckpt`, this pipeline's `model.arch=gpt2` from before the builder served Llama-style
models too), each turned into today's at the door and said once in the log; past the door no code knows them."""

from __future__ import annotations

import copy
import re
import sys

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


SCRATCH = "scratch_next_token"  # piano-gpt's init_from for fresh weights
ARCHS = {"gpt2": "gpt"}  # model.arch's earlier names -> the builder's


def model_arch(arch: str) -> str:
    """Today's name of a model builder (a checkpoint's saved model.arch may be an earlier one)."""
    return ARCHS.get(arch, arch)


_said: set[str] = set()  # the keys whose earlier value this process has said it reads


def read_earlier_values(composed: DictConfig) -> DictConfig:
    """`composed` (Hydra's config, or a saved one) with the earlier pipelines' values in today's spelling:
    eval_only=true -> mode=eval (piano-gpt), init_from=scratch_next_token -> null (piano-gpt's fresh weights),
    checkpoint.load_file=iter_<step>.ckpt -> <step> (trainit's file name for a step). A copy when one is found."""
    if isinstance(composed, dict):
        composed = OmegaConf.create(composed)
    load_file = OmegaConf.select(composed, "checkpoint.load_file")
    earlier = isinstance(load_file, str) and re.fullmatch(r"iter_(\d+)\.ckpt", load_file)
    arch = OmegaConf.select(composed, "model.arch")
    if not (
        earlier
        or OmegaConf.select(composed, "eval_only")
        or OmegaConf.select(composed, "init_from") == SCRATCH
        or arch in ARCHS
    ):
        return composed
    composed = copy.deepcopy(composed)
    with open_dict(composed):
        if OmegaConf.select(composed, "eval_only"):
            composed.mode, composed.eval_only = "eval", False
            _say("eval_only=true", "mode=eval")
        if OmegaConf.select(composed, "init_from") == SCRATCH:
            composed.init_from = None
            _say("init_from=scratch_next_token", "init_from=null (fresh weights)")
        if arch in ARCHS:
            composed.model.arch = ARCHS[arch]
            _say(f"model.arch={arch}", f"model.arch={ARCHS[arch]}")
        if earlier:
            composed.checkpoint.load_file = earlier.group(1)
            _say(f"checkpoint.load_file={load_file}", f"checkpoint.load_file={earlier.group(1)}")
    return composed


def _say(earlier: str, today: str) -> None:
    key = earlier.split("=")[0]
    if key not in _said:
        _said.add(key)
        print(f"note: {earlier} is an earlier pipeline's spelling: read as {today}", file=sys.stderr)
