"""The model's options are defined once (models/config.py `ModelOptions`): each one, set away from its default on the
command line, reaches the model's static config, `--help`, `--cfg job`, the config a checkpoint saves (and a resume
reads back), and the Hugging Face export, which writes it into its config, refuses the model in one line naming it,
or (for the options that change how the model computes, not what) has nothing to say about it. An option added
without a value in CHANGED below fails here until someone decides how each of these places treats it."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from core.errors import ConfigError
from models import gpt_config
from models.config import ModelOptions
from models.hf import export_architecture, hf_config
from models.hf_llama import llama_config
from training import config as config_lib
from training.config.help import help_text
from training.config.root import Config

OPTIONS = [f.name for f in dataclasses.fields(ModelOptions)]
# Each option at a value away from its default (on gpt2-tiny's and llama-tiny's shapes), with what it needs beside it.
CHANGED = {
    "n_layer": {"n_layer": 3},
    "n_head": {"n_head": 4, "n_kv_head": None},
    "n_embd": {"n_embd": 96},
    "context_size": {"context_size": 32},
    "dropout": {"dropout": 0.1},
    "bias": {"bias": True},
    "vocab_multiple": {"vocab_multiple": 128},
    "attention": {"attention": "blocked"},
    "attention_window": {"attention_window": 8},
    "yarn_windows": {"position": "rope", "attention_window": 8, "yarn_windows": [4]},
    "remat": {"remat": "full"},
    "scan_layers": {"scan_layers": False},
    "head_loss": {"head_loss": "chunked"},
    "head_loss_chunk": {"head_loss_chunk": 1024},
    "logits_dtype": {"logits_dtype": "compute"},
    "fused_qkv": {"fused_qkv": False},
    "position": {"position": "learned"},
    "rope_theta": {"rope_theta": 500000.0},
    "rope_frequencies": {"rope_frequencies": "half_truncated"},
    "norm": {"norm": "layernorm"},
    "norm_weight": {"norm_weight": False},
    "mlp": {"mlp": "relu2"},
    "mlp_hidden": {"mlp_hidden": 128},
    "n_kv_head": {"n_kv_head": 1},
    "qk_norm": {"qk_norm": True},
    "qk_norm_weight": {"qk_norm": True, "qk_norm_weight": False},
    "attention_scale": {"attention_scale": 0.12},
    "tie_embeddings": {"tie_embeddings": True},
    "embedding_norm": {"embedding_norm": True},
    "head_bias": {"head_bias": True},
    "logit_softcap": {"logit_softcap": 30.0},
    "logit_softcap_form": {"logit_softcap": 30.0, "logit_softcap_form": "algebraic"},
    "unet_skips": {"unet_skips": True},
    "zero_init_mlp_out": {"zero_init_mlp_out": True},
    "value_embeddings": {"value_embeddings": 1},
    "smear_gate": {"smear_gate": True},
    "parametrization": {"parametrization": "mup", "mup_base_width": 32},
    "mup_base_width": {"parametrization": "mup", "mup_base_width": 32},
}
# How the model computes or where its weights start, not what it computes: an export has nothing to write for them.
COMPUTE_ONLY = {
    "attention",
    "remat",
    "scan_layers",
    "head_loss",
    "head_loss_chunk",
    "logits_dtype",
    "fused_qkv",
    "vocab_multiple",
    "zero_init_mlp_out",
}
BASES = ("gpt2-tiny", "llama-tiny")  # an export as GPT-2 and one as Llama
# Options that do not act on a base's model: rotary frequencies without rotary positions; Llama has no dropout.
IRRELEVANT = {("gpt2-tiny", "rope_theta"), ("gpt2-tiny", "rope_frequencies"), ("llama-tiny", "dropout")}


def changed(base: str, option: str) -> Config:
    values = CHANGED[option]
    overrides = [f"model={base}"] + [f"model.{k}={'null' if v is None else v}" for k, v in values.items()]
    return config_lib.load_config(overrides)


def exported(cfg: Config) -> dict | str:
    """The export's config for this model, or the line it refuses it with."""
    model = gpt_config(cfg.model, 259)
    try:
        architecture = export_architecture(model)
    except ConfigError as e:
        return str(e)
    return (hf_config if architecture == "gpt2" else llama_config)(model, 0)


def test_every_option_has_a_changed_value_and_the_schema_adds_only_the_runs_label_and_builder():
    assert sorted(CHANGED) == sorted(OPTIONS)
    schema = [f.name for f in dataclasses.fields(config_lib.ModelConfig)]
    assert sorted(set(schema) - set(OPTIONS)) == ["arch", "name"]


@pytest.mark.parametrize("option", OPTIONS)
def test_an_option_reaches_the_model_help_cfg_checkpoints_and_the_export(option):
    configs = {}
    for base in BASES:
        try:
            configs[base] = changed(base, option)
        except ConfigError as e:  # unread on this base (rotary keys without rotary positions): refused at the door
            assert (base, option) in IRRELEVANT and str(e).startswith(f"config: model.{option}: read only by"), e
    # the model's static config, and through it the model (GPT.init reads nothing else)
    moved = []
    for base, cfg in configs.items():
        value = getattr(cfg.model, option)
        static = getattr(gpt_config(cfg.model, 259, cfg.model.attention), option)
        assert static == (tuple(value) if isinstance(value, list) else value), base  # lists: tuples (hashable)
        moved.append(value != getattr(config_lib.load_config([f"model={base}"]).model, option))
    assert any(moved), option  # away from the default of at least one base
    # --help names it with a meaning; --cfg job prints it
    line = next(line for line in help_text(Config).splitlines() if line.startswith(f"  model.{option}:"))
    assert len(line.split(" -- ", 1)[1]) > 10, line  # a meaning, from the field's comment in models/config.py
    cfg = configs.get("gpt2-tiny") or configs["llama-tiny"]
    printed = OmegaConf.to_container(OmegaConf.create(config_lib.to_yaml(cfg)))
    assert printed["model"][option] == getattr(cfg.model, option)
    # the config a checkpoint saves (config.yaml, and its metadata) reads back with the same value
    reread = config_lib.to_config(OmegaConf.create(config_lib.to_yaml(cfg)))
    assert getattr(reread.model, option) == getattr(cfg.model, option)
    # the export: its config changes with it, or it refuses the model naming it, or the option is compute-only
    if option in COMPUTE_ONLY:
        for base, cfg in configs.items():
            assert exported(cfg) == exported(config_lib.load_config([f"model={base}"])), (base, option)
        return
    for base, cfg in configs.items():
        default = config_lib.load_config([f"model={base}"])
        if getattr(cfg.model, option) == getattr(default.model, option) or (base, option) in IRRELEVANT:
            continue
        before, after = exported(default), exported(cfg)
        assert after != before, (base, option)
        assert isinstance(after, dict) or any(f"model.{name}" in after for name in CHANGED[option]), (base, after)
