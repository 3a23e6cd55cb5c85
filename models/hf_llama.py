"""Hugging Face Llama interop: a Llama-style GPT (rotary positions, RMSNorm, SwiGLU; any n_kv_head, tied or untied
head, with or without biases) <-> a `transformers.LlamaForCausalLM` folder (config.json + model.safetensors).

The layouts differ where ours fuses: our QKV weight [D, G + 2, K x H] (models/block.py `qkv_shape`: query head
n = k G + g at row g) is Llama's q_proj, k_proj and v_proj, and our SwiGLU weight [D, F, 2] its gate_proj and up_proj.
torch's Linear stores [out, in], ours [in, out]. Both rotate the two halves of a head (rotate_half), so rotary needs
no permutation. Vocabulary rows are exported unpadded and padded back with fresh rows on import, as for GPT-2
(models/hf.py). Llama cannot express learned positions, LayerNorm, GELU or ReLU^2, norms without weights, QK-norm or a
logit soft-cap: `llama_problem` names the first such option, and export and import refuse it in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError, DataError
from models.block import INIT_STD, Block, Linear
from models.config import GPTConfig
from models.gpt import GPT
from models.norms import EPS, RMSNorm


def llama_problem(cfg: GPTConfig) -> str | None:
    """Why `transformers.LlamaForCausalLM` cannot express this model (its first option that says so), or None."""
    problems = (
        (cfg.position != "rope", f"model.position={cfg.position}: Llama has rotary positions only (rope)"),
        (cfg.norm != "rmsnorm", f"model.norm={cfg.norm}: Llama normalises with RMSNorm only (rmsnorm)"),
        (cfg.mlp != "swiglu", f"model.mlp={cfg.mlp}: Llama's MLP is SwiGLU only (swiglu)"),
        (not cfg.norm_weight, "model.norm_weight=false: Llama's RMSNorm has a learned weight"),
        (cfg.qk_norm, "model.qk_norm=true: Llama has no QK-norm"),
        (cfg.embedding_norm, "model.embedding_norm=true: Llama does not normalise its embeddings"),
        (cfg.head_bias, "model.head_bias=true: Llama's LM head has no bias"),
        (
            cfg.attention_scale is not None,
            f"model.attention_scale={cfg.attention_scale}: Llama scales attention by 1 / sqrt(head size)",
        ),
        (
            cfg.rope_frequencies != "standard",
            f"model.rope_frequencies={cfg.rope_frequencies}: Llama's rotary frequencies are the standard ones",
        ),
        (
            bool(cfg.yarn_windows),
            f"model.yarn_windows={list(cfg.yarn_windows)}: the export writes Llama's rotary positions unstretched",
        ),
        (
            cfg.attention_window is not None,
            f"model.attention_window={cfg.attention_window}: Llama attends to every earlier position",
        ),
        (cfg.unet_skips, "model.unet_skips=true: Llama has no skip connections between blocks"),
        (cfg.smear_gate, "model.smear_gate=true: Llama has no smear gate"),
        (cfg.value_embeddings > 0, f"model.value_embeddings={cfg.value_embeddings}: Llama has no value embeddings"),
        (cfg.logit_softcap > 0, f"model.logit_softcap={cfg.logit_softcap}: Llama has no logit soft-cap"),
        (
            cfg.width_multiplier != 1,
            "model.parametrization=mup away from its base width: Llama has no readout or attention multipliers",
        ),
    )
    return next((why for bad, why in problems if bad), None)


def llama_config(cfg: GPTConfig, eos_id: int) -> dict[str, Any]:
    theta = float(cfg.rope_theta)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.mlp_width,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.context_size,
        "rms_norm_eps": EPS,
        # transformers 5 reads rope_parameters, 4.x rope_theta (and rope_scaling: absent = none)
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": INIT_STD,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def _unfuse_qkv(w: np.ndarray, cfg: GPTConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[..., G + 2, K x H] -> queries [..., N x H] (Llama's head order), keys and values [..., K x H]."""
    G, K, H = cfg.n_head // cfg.kv_heads, cfg.kv_heads, cfg.head_dim
    lead = w.shape[:-2]
    q = np.swapaxes(w[..., :G, :].reshape(*lead, G, K, H), -3, -2).reshape(*lead, G * K * H)
    return q, w[..., G, :], w[..., G + 1, :]


def _fuse_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: GPTConfig) -> np.ndarray:
    """`_unfuse_qkv`'s inverse."""
    G, K, H = cfg.n_head // cfg.kv_heads, cfg.kv_heads, cfg.head_dim
    lead = q.shape[:-1]
    q = np.swapaxes(q.reshape(*lead, K, G, H), -3, -2).reshape(*lead, G, K * H)
    return np.concatenate([q, k[..., None, :], v[..., None, :]], axis=-2)


def _layer_names(i: int) -> dict[str, str]:
    p = f"model.layers.{i}."
    attention, mlp = p + "self_attn.", p + "mlp."
    return {
        "ln1": p + "input_layernorm.weight",
        "ln2": p + "post_attention_layernorm.weight",
        "q": attention + "q_proj",
        "k": attention + "k_proj",
        "v": attention + "v_proj",
        "o": attention + "o_proj",
        "gate": mlp + "gate_proj",
        "up": mlp + "up_proj",
        "down": mlp + "down_proj",
    }


def to_llama_tensors(model: GPT) -> dict[str, np.ndarray]:
    """float32 tensors under Llama's names (torch layout: Linear weights [out, in])."""
    cfg = model.cfg
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    tensors = {
        "model.embed_tokens.weight": f32(model.wte[: cfg.vocab_size]),
        "model.norm.weight": f32(model.ln_f.weight),
    }
    if model.lm_head is not None:  # tied: transformers takes the head from the embedding
        tensors["lm_head.weight"] = f32(model.lm_head[: cfg.vocab_size])
    blocks = jax.tree.map(f32, model.blocks)
    for i in range(cfg.n_layer):
        n, b = _layer_names(i), jax.tree.map(lambda a: a[i], blocks)
        kinds = ("weight", "bias") if cfg.bias else ("weight",)
        for kind in kinds:
            qkv, fc = getattr(b.qkv, kind), getattr(b.fc, kind)
            parts = dict(
                zip("qkv", _unfuse_qkv(qkv, cfg)),
                o=getattr(b.attn_proj, kind),
                gate=fc[..., 0],
                up=fc[..., 1],
                down=getattr(b.mlp_proj, kind),
            )
            for name, x in parts.items():
                tensors[f"{n[name]}.{kind}"] = np.ascontiguousarray(x.T)  # a bias's .T is itself
        tensors[n["ln1"]], tensors[n["ln2"]] = b.ln1.weight, b.ln2.weight
    return tensors


def check_llama_config(folder: Path, config: dict[str, Any], cfg: GPTConfig) -> None:
    """The folder's Llama config against the run's model: one line naming every difference."""
    at = f"init_from=hf:{folder}"
    if not (Path(folder) / "gpt_jax_tokenizer.json").exists():
        raise ConfigError(
            f"{at}: a Llama folder not exported by this pipeline (no gpt_jax_tokenizer.json): its "
            "tokenizer is none this pipeline has; export Llama-style runs with scripts/tools/export_hf.py"
        )
    if (problem := llama_problem(cfg)) is not None:
        raise ConfigError(
            f"{at}: a Llama checkpoint, but the run's {problem}; choose a llama preset (e.g. model=llama-124m)"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{at}: hidden_act {config['hidden_act']} is not SwiGLU's silu")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(
            f"{at}: its rope scaling {rope.get('rope_type', rope.get('type'))!r} is not supported (plain rotary only)"
        )
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    theirs = {
        "num_hidden_layers": ("model.n_layer", config.get("num_hidden_layers"), cfg.n_layer),
        "num_attention_heads": ("model.n_head", heads, cfg.n_head),
        "num_key_value_heads": ("model.n_kv_head", config.get("num_key_value_heads", heads), cfg.kv_heads),
        "hidden_size": ("model.n_embd", hidden, cfg.n_embd),
        "head_dim": (
            "model.n_embd / model.n_head",
            config.get("head_dim") or (hidden // heads if heads else None),
            cfg.head_dim,
        ),
        "intermediate_size": ("model.mlp_hidden", config.get("intermediate_size"), cfg.mlp_width),
        "rope_theta": (
            "model.rope_theta",
            float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
            float(cfg.rope_theta),
        ),
        "tie_word_embeddings": ("model.tie_embeddings", config.get("tie_word_embeddings", False), cfg.tie_embeddings),
        "attention_bias": ("model.bias", config.get("attention_bias", False), cfg.bias),
        "mlp_bias": ("model.bias", config.get("mlp_bias", False), cfg.bias),
        "rms_norm_eps": ("the pipeline's RMSNorm epsilon", config.get("rms_norm_eps", 1e-6), EPS),
    }
    wrong = [f"{k}={v} (run has {key}={ours})" for k, (key, v, ours) in theirs.items() if v != ours]
    if wrong:
        raise ConfigError(f"{at}: its {', '.join(wrong)}; choose the matching model preset or set those keys")


def pad_vocab_rows(rows: np.ndarray, cfg: GPTConfig, key: jax.Array, advice: str = "") -> jax.Array:
    """An imported embedding or head (rows of token ids) padded to the model's `padded_vocab_size` with fresh rows
    (exports leave the padding out). Up to two rows fewer than the tokenizer has ids are the `<PAD>` and `<GENAI>`
    that the byte and GPT-2 tokenizers add after a vocabulary's own ids (GPT-2's 50,257 rows, 50,259 ids); any other
    count is another tokenizer's vocabulary, every id meaning something else: a DataError. GPT-2's and Llama's
    imports both read it."""
    if not cfg.vocab_size - 2 <= rows.shape[0] <= cfg.vocab_size:
        raise DataError(
            f"the checkpoint has {rows.shape[0]} token rows, and the tokenizer {cfg.vocab_size} ids: it was trained "
            f"with another tokenizer; use that one{advice}"
        )
    fresh = INIT_STD * np.asarray(jax.random.normal(key, (cfg.padded_vocab_size - rows.shape[0], cfg.n_embd)))
    return jnp.asarray(np.concatenate([rows, fresh.astype(np.float32)]))


def from_llama_tensors(tensors: dict[str, np.ndarray], like: GPT, key: jax.Array) -> GPT:
    """`like`'s structure (config, padding) with a Llama's weights; token rows it lacks are drawn fresh."""
    cfg = like.cfg
    k_wte, k_head = jax.random.split(key)

    def vocab(name: str, k: jax.Array) -> jax.Array:
        return pad_vocab_rows(tensors[name], cfg, k)

    names = [_layer_names(i) for i in range(cfg.n_layer)]

    def stacked(part: str, kind: str = "weight") -> np.ndarray:
        """[L, in, out] for a weight (ours, from torch's [out, in]), [L, out] for a bias or a norm's weight."""
        if part in ("ln1", "ln2"):
            return np.stack([tensors[n[part]] for n in names])
        x = np.stack([tensors[f"{n[part]}.{kind}"] for n in names])
        return np.swapaxes(x, 1, 2) if kind == "weight" else x

    def qkv(kind: str) -> jax.Array:
        return jnp.asarray(_fuse_qkv(stacked("q", kind), stacked("k", kind), stacked("v", kind), cfg))

    def swiglu(kind: str) -> jax.Array:  # gate and up side by side: [.., F, 2]
        return jnp.asarray(np.stack([stacked("gate", kind), stacked("up", kind)], axis=-1))

    def linear(make: Callable[[str], jax.Array]) -> Linear:
        return Linear(make("weight"), make("bias") if cfg.bias else None)

    blocks = Block(
        ln1=RMSNorm(jnp.asarray(stacked("ln1"))),
        qkv=linear(qkv),
        attn_proj=linear(lambda kind: jnp.asarray(stacked("o", kind))),
        ln2=RMSNorm(jnp.asarray(stacked("ln2"))),
        fc=linear(swiglu),
        mlp_proj=linear(lambda kind: jnp.asarray(stacked("down", kind))),
        q_norm=None,
        k_norm=None,
    )
    head = None if cfg.tie_embeddings else vocab("lm_head.weight", k_head)
    return GPT(
        wte=vocab("model.embed_tokens.weight", k_wte),
        wpe=None,
        blocks=blocks,
        ln_f=RMSNorm(jnp.asarray(tensors["model.norm.weight"])),
        ln_e=None,
        lm_head=head,
        lm_bias=None,
        skip_weights=None,
        value_embeds=None,
        ve_gates=None,
        smear=None,
        cfg=cfg,
    )
