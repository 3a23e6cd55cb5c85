"""Hugging Face interop: our GPT <-> a transformers folder (config.json + model.safetensors): a GPT-2 model as a
`GPT2LMHeadModel` (here), a Llama-style one (rotary, RMSNorm, SwiGLU) as a `LlamaForCausalLM` (models/hf_llama.py).
Export picks the architecture that expresses the model (GPT-2 first: GPT-2 runs export as they always have); import
goes by the folder's model_type and checks the run's `model` section against it.

GPT-2's layouts agree closely with ours: its Conv1D stores weights as [in, out], as our `Linear` does, and its LM head
is the token embedding, as ours is. Export writes the real (unpadded) vocabulary rows; import pads them back to the
model's multiple of `vocab_multiple`, and gives ids the checkpoint lacks (our `<PAD>` and `<GENAI>` after GPT-2's
50,257) fresh GPT-2-initialised rows. Only safetensors and JSON are read: no pickle.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError, DataError, first_line
from core.hub import hub_reachable
from models import gpt_config
from models.block import INIT_STD, Block, Linear
from models.config import GPTConfig, ModelOptions
from models.gpt import GPT
from models.hf_llama import (
    check_llama_config,
    from_llama_tensors,
    llama_config,
    llama_problem,
    pad_vocab_rows,
    to_llama_tensors,
)
from models.mlp import mlp_hidden_width
from models.norms import LayerNorm

HF_PREFIX = "hf:"
HF_FILES = ("config.json", "model.safetensors")
LAYER_NORM_EPS = 1e-5  # ours and GPT-2's
ARCHITECTURES = ("auto", "gpt2", "llama")  # what export_hf writes: auto = gpt2 where it can, else llama


class ExportedTokenizer(Protocol):
    """What the export reads of a tokenizer (data/tokenizer_base.py's Tokenizer; models/ does not import data/)."""

    @property
    def kind(self) -> str: ...

    @property
    def eos_id(self) -> int: ...

    def to_json(self) -> dict: ...


def gpt2_problem(cfg: GPTConfig) -> str | None:
    """Why `transformers.GPT2LMHeadModel` cannot express this model (its first option that says so), or None."""
    problems = (
        (cfg.position != "learned", f"model.position={cfg.position}: GPT-2 has learned positions only"),
        (cfg.norm != "layernorm", f"model.norm={cfg.norm}: GPT-2 normalises with LayerNorm only"),
        (cfg.mlp != "gelu", f"model.mlp={cfg.mlp}: GPT-2's MLP is GELU only"),
        (cfg.kv_heads != cfg.n_head, f"model.n_kv_head={cfg.kv_heads}: GPT-2 has a key/value head per query head"),
        (not cfg.norm_weight, "model.norm_weight=false: GPT-2's LayerNorm has a learned weight"),
        (cfg.qk_norm, "model.qk_norm=true: GPT-2 has no QK-norm"),
        (cfg.embedding_norm, "model.embedding_norm=true: GPT-2 does not normalise its embeddings"),
        (cfg.head_bias, "model.head_bias=true: GPT-2's LM head has no bias"),
        (
            cfg.attention_scale is not None,
            f"model.attention_scale={cfg.attention_scale}: GPT-2 scales attention by 1 / sqrt(head size)",
        ),
        (bool(cfg.yarn_windows), f"model.yarn_windows={list(cfg.yarn_windows)}: GPT-2 has learned positions"),
        (
            cfg.attention_window is not None,
            f"model.attention_window={cfg.attention_window}: GPT-2 attends to every earlier position",
        ),
        (cfg.unet_skips, "model.unet_skips=true: GPT-2 has no skip connections between blocks"),
        (cfg.smear_gate, "model.smear_gate=true: GPT-2 has no smear gate"),
        (cfg.value_embeddings > 0, f"model.value_embeddings={cfg.value_embeddings}: GPT-2 has no value embeddings"),
        (not cfg.tie_embeddings, "model.tie_embeddings=false: GPT-2's head is its token embedding"),
        (cfg.logit_softcap > 0, f"model.logit_softcap={cfg.logit_softcap}: GPT-2 has no logit soft-cap"),
        (
            cfg.width_multiplier != 1,
            "model.parametrization=mup away from its base width: GPT-2 has no readout or attention multipliers",
        ),
    )
    return next((why for bad, why in problems if bad), None)


def export_architecture(cfg: GPTConfig, requested: str = "auto") -> str:
    """`gpt2` or `llama`: the transformers architecture an export writes; a model it cannot express -> one line."""
    problems = {"gpt2": gpt2_problem(cfg), "llama": llama_problem(cfg)}
    if requested != "auto":
        if problems[requested] is not None:
            raise ConfigError(f"export as {requested}: {problems[requested]}")
        return requested
    fits = [name for name, problem in problems.items() if problem is None]
    if not fits:
        raise ConfigError(
            f"neither transformers' GPT-2 nor its Llama expresses this model: {problems['gpt2']}; {problems['llama']}"
        )
    return fits[0]


def _block_names(i: int) -> dict[str, tuple[str, str]]:
    """HF tensor name -> (our Block field, `weight` | `bias`) for layer i."""
    p = f"transformer.h.{i}."
    return {
        p + "ln_1.weight": ("ln1", "weight"),
        p + "ln_1.bias": ("ln1", "bias"),
        p + "attn.c_attn.weight": ("qkv", "weight"),
        p + "attn.c_attn.bias": ("qkv", "bias"),
        p + "attn.c_proj.weight": ("attn_proj", "weight"),
        p + "attn.c_proj.bias": ("attn_proj", "bias"),
        p + "ln_2.weight": ("ln2", "weight"),
        p + "ln_2.bias": ("ln2", "bias"),
        p + "mlp.c_fc.weight": ("fc", "weight"),
        p + "mlp.c_fc.bias": ("fc", "bias"),
        p + "mlp.c_proj.weight": ("mlp_proj", "weight"),
        p + "mlp.c_proj.bias": ("mlp_proj", "bias"),
    }


def to_hf_tensors(model: GPT) -> dict[str, np.ndarray]:
    """float32 tensors under GPT-2's names. A model without biases exports zero biases: the same function."""
    cfg = model.cfg
    tensors = {
        "transformer.wte.weight": np.asarray(model.wte[: cfg.vocab_size], np.float32),
        "transformer.wpe.weight": np.asarray(model.wpe, np.float32),
        "transformer.ln_f.weight": np.asarray(model.ln_f.weight, np.float32),
        "transformer.ln_f.bias": _bias(model.ln_f.bias, cfg.n_embd),
    }
    for i in range(cfg.n_layer):
        for name, (field, kind) in _block_names(i).items():
            module = getattr(model.blocks, field)
            value = getattr(module, kind)
            # GPT-2 stores every weight 1-D (LayerNorm) or 2-D [in, out]; our QKV's [D, 3, D] is its [D, 3D].
            shape = module.weight.shape[1:2] + (math.prod(module.weight.shape[2:]),) * (module.weight.ndim > 2)
            tensors[name] = (
                _bias(None if value is None else value[i].reshape(-1), shape[-1])
                if kind == "bias"
                else np.asarray(value[i], np.float32).reshape(shape)
            )
    return tensors


def _bias(value: jax.Array | None, width: int) -> np.ndarray:
    return np.zeros((width,), np.float32) if value is None else np.asarray(value, np.float32)


def hf_config(cfg: GPTConfig, eos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.context_size,
        "n_ctx": cfg.context_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": None if cfg.mlp_width == 4 * cfg.n_embd else cfg.mlp_width,
        "activation_function": "gelu_new",
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "initializer_range": INIT_STD,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def export_hf(model: GPT, tokenizer: ExportedTokenizer, out_dir: str | Path, architecture: str = "auto") -> list[str]:
    """Write the folder as `architecture` (ARCHITECTURES); returns the files written. Refuses a non-empty folder
    rather than mixing two models, and a model the architecture cannot express."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise DataError(f"{out} is not empty; choose a new folder for the export")
    if not isinstance(model, GPT):
        raise ConfigError(
            f"model.arch: only GPT models (arch gpt) have a transformers equivalent; got {type(model).__name__}"
        )
    llama = export_architecture(model.cfg, architecture) == "llama"
    tensors, config = (
        (to_llama_tensors(model), llama_config(model.cfg, tokenizer.eos_id))
        if llama
        else (to_hf_tensors(model), hf_config(model.cfg, tokenizer.eos_id))
    )
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    written = list(HF_FILES)
    if tokenizer.kind == "bpe":  # a HF `tokenizers` BPE already: transformers loads it as a fast tokenizer
        (out / "tokenizer.json").write_text(tokenizer.to_json()["hf_tokenizer"])
        (out / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "eos_token": "<EOS>",
                    "pad_token": "<PAD>",
                    "additional_special_tokens": ["<GENAI>"],
                    "model_max_length": model.cfg.context_size,
                },
                indent=2,
            )
        )
        written += ["tokenizer.json", "tokenizer_config.json"]
    (out / "gpt_jax_tokenizer.json").write_text(json.dumps(tokenizer.to_json()))  # ours, to import back exactly
    return written + ["gpt_jax_tokenizer.json"]


def resolve_hf(name: str, cache_dir: str) -> Path:
    """A local folder, or a Hub id downloaded (config and weights only) into `cache_dir`; offline -> one line."""
    local = Path(name).expanduser()
    if local.is_dir():
        missing = [f for f in HF_FILES if not (local / f).exists()]
        if missing:
            raise DataError(
                f"init_from=hf:{name}: the folder lacks {', '.join(missing)} (a transformers GPT-2 or "
                "Llama folder has config.json and model.safetensors)"
            )
        return local
    from huggingface_hub import snapshot_download

    try:
        if not hub_reachable():
            raise OSError("the Hugging Face Hub is unreachable")
        return Path(snapshot_download(name, allow_patterns=list(HF_FILES), cache_dir=str(Path(cache_dir) / "hf")))
    except Exception as e:  # connection, offline mode, not found, gated
        reason = first_line(e, 160)
        raise DataError(
            f"init_from=hf:{name}: not a local folder, and the Hub download failed ({reason}); offline, "
            "pass a folder with config.json and model.safetensors"
        ) from None


# transformers' GPT2Config defaults, which a config.json leaves out
GPT2_DEFAULTS = {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257}


def check_hf_config(folder: Path, model_cfg: ModelOptions) -> dict[str, Any]:
    """The folder's config, checked against the run's `model` section: one line naming what differs."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"init_from=hf:{folder}: config.json unreadable ({first_line(e, 120)}); corrupt?") from None
    if not isinstance(config, dict):
        raise DataError(f"init_from=hf:{folder}: config.json holds a {type(config).__name__}, not a model's config")
    cfg = gpt_config(model_cfg, 1)
    if config.get("model_type") == "llama":
        check_llama_config(folder, config, cfg)
        return config
    if config.get("model_type") != "gpt2":
        raise ConfigError(f"init_from=hf:{folder}: model_type {config.get('model_type')!r} is neither gpt2 nor llama")
    if (problem := gpt2_problem(cfg)) is not None:
        raise ConfigError(
            f"init_from=hf:{folder}: a GPT-2 checkpoint, but the run's {problem}; choose a gpt2 preset "
            "(e.g. model=gpt2)"
        )
    if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConfigError(f"init_from=hf:{folder}: activation {config['activation_function']} is not GPT-2's tanh GELU")
    # what transformers' GPT-2 computes otherwise than GPT-2 (and this model) where these are set: refused, since
    # the weights would load into a model that computes something else
    other = {
        "tie_word_embeddings": (True, "an untied head (lm_head.weight); this import ties it to the token embedding"),
        "scale_attn_weights": (True, "attention scores without the 1/sqrt(head_dim) scale"),
        "scale_attn_by_inverse_layer_idx": (False, "attention scores scaled by 1/layer"),
        "layer_norm_epsilon": (LAYER_NORM_EPS, f"a LayerNorm epsilon other than {LAYER_NORM_EPS:g}"),
    }
    for key, (gpt2, what) in other.items():
        if config.get(key, gpt2) != gpt2:
            raise ConfigError(f"init_from=hf:{folder}: its {key}={config[key]} is {what}, which GPT-2 does not compute")
    config = {**GPT2_DEFAULTS, **config}  # transformers' GPT2Config writes only what differs from these
    wanted = {"n_layer": model_cfg.n_layer, "n_head": model_cfg.n_head, "n_embd": model_cfg.n_embd}
    wrong = [f"{k}={config[k]} (run has {v})" for k, v in wanted.items() if config.get(k) != v]
    fix = [f"model.{k}={config[k]}" for k, v in wanted.items() if config.get(k) is not None and config[k] != v]
    theirs = config.get("n_embd") or cfg.n_embd
    inner = config.get("n_inner") or 4 * theirs
    if inner != mlp_hidden_width(cfg.mlp, theirs, cfg.mlp_hidden):  # the run's MLP at the folder's width
        wrong.append(f"n_inner={config.get('n_inner')} (run has model.mlp_hidden={cfg.mlp_width})")
        fix.append(f"model.mlp_hidden={inner}")
    if not model_cfg.bias and (nonzero := _nonzero_biases(folder, model_cfg.n_layer)):
        wrong.append(f"biases ({nonzero} is not zero; run has model.bias=false)")
        fix.append("model.bias=true")
    if config.get("n_positions", 0) < model_cfg.context_size:
        wrong.append(f"n_positions={config.get('n_positions')} < model.context_size={model_cfg.context_size}")
        fix.append(f"model.context_size={config.get('n_positions')}")
    if wrong:
        raise ConfigError(
            f"init_from=hf:{folder}: its {', '.join(wrong)}; choose the model preset with its shape, or set "
            f"{' '.join(fix)}"
        )
    return config


def _unreadable(folder: Path, e: Exception) -> DataError:
    return DataError(f"init_from=hf:{folder}: model.safetensors unreadable ({first_line(e, 120)}); corrupt?")


def _nonzero_biases(folder: Path, n_layer: int) -> str | None:
    """The first GPT-2 bias of the folder's checkpoint that is not zero, if any: a run without biases takes a
    checkpoint whose biases are all zero (its own export's), the same function. Reads those tensors alone."""
    from safetensors import safe_open

    try:
        with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
            names = set(f.keys())
            prefix = "transformer." if any(n.startswith("transformer.") for n in names) else ""
            biases = [n for i in range(n_layer) for n, (_, kind) in _block_names(i).items() if kind == "bias"]
            for name in (n.removeprefix("transformer.") for n in [*biases, "transformer.ln_f.bias"]):
                if prefix + name in names and np.any(f.get_tensor(prefix + name)):
                    return prefix + name
    except Exception as e:  # safetensors' own error type, OSError, ...: the file's bytes, not this code
        raise _unreadable(folder, e) from None
    return None


def from_hf_tensors(tensors: dict[str, np.ndarray], like: GPT, key: jax.Array) -> GPT:
    """`like`'s structure (config, padding) with GPT-2's weights; token rows GPT-2 lacks are drawn fresh."""
    cfg = like.cfg
    wte = pad_vocab_rows(tensors["transformer.wte.weight"], cfg, key, " (dataset.tokenizer=gpt2 for GPT-2)")
    wpe = tensors["transformer.wpe.weight"][: cfg.context_size]

    def stacked(field: str, kind: str) -> jax.Array | None:
        if getattr(getattr(like.blocks, field), kind) is None:
            return None
        name = next(n for n, fk in _block_names(0).items() if fk == (field, kind)).replace(".h.0.", ".h.{}.")
        shape = getattr(getattr(like.blocks, field), kind).shape  # e.g. QKV: GPT-2's [D, 3D] is our [D, 3, D]
        return jnp.asarray(np.stack([tensors[name.format(i)] for i in range(cfg.n_layer)]).reshape(shape))

    linear = lambda f: Linear(stacked(f, "weight"), stacked(f, "bias"))  # noqa: E731
    norm = lambda f: LayerNorm(stacked(f, "weight"), stacked(f, "bias"))  # noqa: E731
    blocks = Block(
        ln1=norm("ln1"),
        qkv=linear("qkv"),
        attn_proj=linear("attn_proj"),
        ln2=norm("ln2"),
        fc=linear("fc"),
        mlp_proj=linear("mlp_proj"),
        q_norm=None,
        k_norm=None,
    )
    ln_f = LayerNorm(
        jnp.asarray(tensors["transformer.ln_f.weight"]),
        None if like.ln_f.bias is None else jnp.asarray(tensors["transformer.ln_f.bias"]),
    )
    return GPT(
        wte=wte,
        wpe=jnp.asarray(wpe),
        blocks=blocks,
        ln_f=ln_f,
        ln_e=None,
        lm_head=None,
        lm_bias=None,
        skip_weights=None,
        value_embeds=None,
        ve_gates=None,
        smear=None,
        cfg=cfg,
    )


def load_hf_model(folder: Path, like: GPT, key: jax.Array) -> GPT:
    """The folder's weights in `like`'s structure (check_hf_config has matched the two)."""
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(folder / "model.safetensors"))
    except Exception as e:  # safetensors' own error type, OSError, ...: the file's bytes, not this code
        raise _unreadable(folder, e) from None
    llama = "model.embed_tokens.weight" in tensors or "embed_tokens.weight" in tensors
    # A base model's own checkpoint (GPT2Model, LlamaModel: GPT-2's on the Hub) names its tensors without the
    # prefix that the model with its LM head puts before them; transformers reads both.
    prefix = "model." if llama else "transformer."
    if not any(name.startswith(prefix) for name in tensors):
        tensors = {prefix + name: w for name, w in tensors.items()}
    try:
        model = (from_llama_tensors if llama else from_hf_tensors)(tensors, like, key)
    except KeyError as e:
        raise DataError(
            f"init_from=hf:{folder}: model.safetensors has no tensor {e.args[0]!r}; not this model's"
        ) from None
    # in the run's parameter dtype (float32), whatever the folder stores (transformers saves float16 or bfloat16 too)
    return jax.tree.map(lambda w, want: jnp.asarray(w, want.dtype), model, like)
