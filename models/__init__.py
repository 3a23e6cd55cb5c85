"""Models: the Equinox GPT-2 and its modern-decoder options (gpt.py, attention.py, rope.py, norms.py, mlp.py,
lm_head.py), what `auto` settings mean on this backend (auto.py), generation (sampling.py, decode.py with a KV cache:
kv_cache.py) and transformers interop (hf.py: GPT-2, hf_llama.py: Llama). This module is the registry: `model.arch`
names a builder `(run config, vocab_size, key) -> model`. Models import only core/; the tokenizer's vocabulary size is
all they know of the data."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import equinox as eqx
import jax
import jax.numpy as jnp

from models.auto import resolve_attention, resolve_head_loss, resolve_logits_dtype, resolve_scan_layers
from models.config import GPTConfig, ModelOptions
from models.gpt import GPT


class SystemSection(Protocol):
    @property
    def dtype(self) -> str: ...

    @property
    def deterministic(self) -> bool: ...


class OptimizerSection(Protocol):
    @property
    def name(self) -> str: ...


class RunConfig(Protocol):
    """What a builder reads of the run's config (training/config/root.py's Config): the `model` section, the
    compute dtype, whether the run is on deterministic kernels (the attention kernel depends on it) and the
    optimizer's name (sophia differentiates the loss twice). A protocol, as models/ does not import training/."""

    @property
    def model(self) -> ModelOptions: ...

    @property
    def system(self) -> SystemSection: ...

    @property
    def optimizer(self) -> OptimizerSection: ...


Builder = Callable[[RunConfig, int, jax.Array], GPT]  # (run config, vocab_size, key) -> model


def build_gpt(cfg: RunConfig, vocab_size: int, key: jax.Array) -> GPT:
    attention = resolve_attention(cfg.model.attention, cfg.system.dtype, cfg.system.deterministic)
    model_cfg = gpt_config(cfg.model, vocab_size, attention)
    resolved = {
        "scan_layers": resolve_scan_layers(cfg.model.scan_layers),
        "head_loss": resolve_head_loss(cfg.model.head_loss, differentiated_twice=cfg.optimizer.name == "sophia"),
        "logits_dtype": resolve_logits_dtype(cfg.model.logits_dtype),
    }
    return init_gpt(dataclasses.replace(model_cfg, **resolved), key)


# One executable for the whole init instead of one per random array (0.6 s of a small run's start-up, BENCHMARKS.md
# "Start-up of a short run"): compiled once, then read from the compilation cache. GPT.init is that program.
init_gpt = GPT.init


FLOAT_OPTIONS = tuple(f.name for f in dataclasses.fields(ModelOptions) if f.type == "float")


def gpt_config(model_cfg: ModelOptions, vocab_size: int, attention: str = "xla") -> GPTConfig:
    """The model's static description: every option of the `model` section (the fields of models/config.py's
    ModelOptions, read by name: a new option needs no line here), the tokenizer's vocab size and the attention
    kernel resolved for this run."""
    options = {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(ModelOptions)}
    # YAML writes 500000 for a float field as an int: the static config (hashed into compiled programs) holds floats
    options |= {name: float(options[name]) for name in FLOAT_OPTIONS if options[name] is not None}
    options["yarn_windows"] = tuple(options["yarn_windows"])
    return GPTConfig(**options | {"attention": attention}, vocab_size=vocab_size)


def parameter_labels(model_cfg: ModelOptions) -> set[str]:
    """The labels of the parameters a model of this config has (GPT.parameter_labels), from its shapes alone: no
    array is made and no device is touched (the config is checked before jax.distributed starts)."""
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    model = eqx.filter_eval_shape(GPT.init, gpt_config(model_cfg, model_cfg.vocab_multiple), key)
    return set(jax.tree.leaves(model.parameter_labels()))


MODEL_BUILDERS: dict[str, Builder] = {"gpt": build_gpt}  # GPT-2, Llama-style, modern
