"""One transformer block of the model (models/gpt.py stacks `n_layer` of them) and its layers.

`Block`: pre-norm self-attention then an MLP, each added to the residual stream, with the options of GPTConfig that
act inside a block: grouped-query attention, QK-norm, rotary positions and YaRN's score factor (models/rope.py), μP's
score scale (models/mup.py), the speedrun's value embeddings (models/speedrun.py), FP8 matmuls (models/fp8.py), and a
KV cache when decoding (models/kv_cache.py). `Linear`: every matmul of the block, weight stored [in, *out].

Shape suffixes as in models/gpt.py: B batch, T time, D model width, N heads, K key/value heads, G = N / K query heads
per key/value head, H head size, F MLP width.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from models.attention import causal_attention
from models.config import GPTConfig
from models.fp8 import MATMULS, fp8_dot
from models.kv_cache import LayerCache
from models.matmul import dense
from models.mlp import mlp_activation, mlp_in_shape
from models.mup import attention_multiplier, hidden_init_std
from models.norms import LayerNorm, RMSNorm, init_norm
from models.rope import apply_rotary, yarn_score_factor
from models.speedrun import add_value_embedding

INIT_STD = 0.02  # GPT-2's init for every weight matrix and both embeddings.


class Linear(eqx.Module):
    """y = x W + b with W stored as [in, *out] (GPT-2's [in, out] layout; QKV's output is [3, D]) and applied to any
    leading axes of x."""

    weight: jax.Array
    bias: jax.Array | None

    @staticmethod
    def init(key: jax.Array, d_in: int, d_out: int | tuple[int, ...], bias: bool, std: float = INIT_STD) -> Linear:
        out = (d_out,) if isinstance(d_out, int) else tuple(d_out)
        shape = (d_in, *out)
        weight = std * jax.random.normal(key, shape, jnp.float32) if std else jnp.zeros(shape, jnp.float32)
        return Linear(weight, jnp.zeros(out, jnp.float32) if bias else None)

    def __call__(self, x: jax.Array, fp8_scales: jax.Array | None = None) -> jax.Array:
        """`fp8_scales` ([3]: input, weight, output gradient): the matmul in FP8 (models/fp8.py)."""
        # As a 2-D matmul: XLA:CPU runs the weight gradient of a [B, T, D] input (two contracting axes) ~2x slower.
        # The weight's output axes stay axes (no reshape of W), so a W split over the mesh's `model` axis stays split.
        x_ND = x.reshape(-1, x.shape[-1])
        if fp8_scales is None:
            y = dense(x_ND, self.weight)
        else:
            y = fp8_dot(x_ND, self.weight, fp8_scales)
        y = y.reshape(*x.shape[:-1], *self.weight.shape[1:])
        return y if self.bias is None else y + self.bias


class Block(eqx.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    ln1: LayerNorm | RMSNorm
    qkv: Linear  # weight [D, G + 2, K x H]: G rows of queries, then keys, then values (`qkv_shape`)
    attn_proj: Linear
    ln2: LayerNorm | RMSNorm
    fc: Linear  # weight [D, F], or SwiGLU's [D, F, 2] (gate, up: models/mlp.py)
    mlp_proj: Linear
    q_norm: LayerNorm | RMSNorm | None  # QK-norm: queries and keys normalised per head ([H]); None without
    k_norm: LayerNorm | RMSNorm | None

    @staticmethod
    def init(key: jax.Array, cfg: GPTConfig) -> Block:
        d, F = cfg.n_embd, cfg.mlp_width
        std = hidden_init_std(cfg, INIT_STD)  # GPT-2's 0.02; under μP scaled for fan-in relative to the base width
        residual_std = std / math.sqrt(2 * cfg.n_layer)  # GPT-2: keep the residual stream's variance flat.
        k1, k2, k3, k4 = jax.random.split(key, 4)
        norm = lambda width: init_norm(cfg.norm, width, cfg.bias, cfg.norm_weight)  # noqa: E731
        qk_weight = cfg.norm_weight if cfg.qk_norm_weight is None else cfg.qk_norm_weight
        qk_norm = lambda width: init_norm(cfg.norm, width, cfg.bias, qk_weight)  # noqa: E731
        return Block(
            ln1=norm(d),
            qkv=Linear.init(k1, d, qkv_shape(cfg), cfg.bias, std=std),
            attn_proj=Linear.init(k2, d, d, cfg.bias, std=residual_std),
            ln2=norm(d),
            fc=Linear.init(k3, d, mlp_in_shape(cfg.mlp, F), cfg.bias, std=std),
            mlp_proj=Linear.init(k4, F, d, cfg.bias, std=0.0 if cfg.zero_init_mlp_out else residual_std),
            q_norm=qk_norm(cfg.head_dim) if cfg.qk_norm else None,
            k_norm=qk_norm(cfg.head_dim) if cfg.qk_norm else None,
        )

    def __call__(
        self,
        x_BTD: jax.Array,
        cfg: GPTConfig,
        key: jax.Array | None,
        cache: LayerCache | None = None,
        segment_ids_BT: jax.Array | None = None,
        fp8_scales: jax.Array | None = None,
        rotary: tuple[jax.Array, jax.Array] | None = None,
        ve: tuple[jax.Array, jax.Array] | None = None,
    ) -> tuple[jax.Array, LayerCache | None]:
        """The block's output, and (decoding) the cache with this call's keys and values written in.
        `fp8_scales` ([4, 3], models/fp8.py MATMULS order): the four matmuls in FP8. `rotary`: the cos and sin of
        the tokens' rotary angles (models/rope.py), None with learned positions. `ve`: this layer's value embedding
        of each token [B, T, D] and its gate's weights [K, G] (model.value_embeddings)."""
        B, T, D = x_BTD.shape
        keys = (None, None) if key is None else tuple(jax.random.split(key, 2))
        scales = dict.fromkeys(MATMULS) if fp8_scales is None else dict(zip(MATMULS, fp8_scales))
        h_BTD = self.ln1(x_BTD)
        if cfg.fused_qkv or scales["qkv"] is not None:  # FP8's scales and amaxes are the whole product's
            q_BTNH, k_BTKH, v_BTKH = split_heads(self.qkv(h_BTD, scales["qkv"]), cfg)
        else:
            q_BTNH, k_BTKH, v_BTKH = heads(*(part(h_BTD) for part in qkv_parts(self.qkv, cfg)), cfg)
        if ve is not None:
            v_BTKH = add_value_embedding(v_BTKH, h_BTD, *ve)
        if self.q_norm is not None:
            q_BTNH, k_BTKH = self.q_norm(q_BTNH), self.k_norm(k_BTKH)
        if rotary is not None:
            q_BTNH, k_BTKH = apply_rotary(q_BTNH, *rotary), apply_rotary(k_BTKH, *rotary)
        if cfg.parametrization == "mup":  # scores scaled by 1/head_dim instead of 1/sqrt(head_dim) (models/mup.py)
            q_BTNH = q_BTNH * jnp.asarray(attention_multiplier(cfg), q_BTNH.dtype)
        elif cfg.attention_scale is not None:  # every kernel divides by sqrt(head_dim): the queries carry the rest
            q_BTNH = q_BTNH * jnp.asarray(cfg.attention_scale * math.sqrt(cfg.head_dim), q_BTNH.dtype)
        if cfg.yarn_path and rotary is not None:  # YaRN sharpens the scores as the window grows (models/rope.py)
            q_BTNH = q_BTNH * jnp.asarray(yarn_score_factor(cfg.yarn_path), q_BTNH.dtype)
        with jax.named_scope("attention"):  # the score/softmax/value kernels, for scripts/tools/profile_summary.py
            if cache is None:
                y_BTNH = causal_attention(q_BTNH, k_BTKH, v_BTKH, cfg.attention, segment_ids_BT, cfg.attention_window)
            else:
                y_BTNH, cache = cache.attend(q_BTNH, k_BTKH, v_BTKH, cfg.attention, cfg.attention_window)
        x_BTD = x_BTD + dropout(self.attn_proj(y_BTNH.reshape(B, T, D), scales["attn_proj"]), cfg.dropout, keys[0])
        h_BTF = mlp_activation(cfg.mlp, self.fc(self.ln2(x_BTD), scales["fc"]))
        return x_BTD + dropout(self.mlp_proj(h_BTF, scales["mlp_proj"]), cfg.dropout, keys[1]), cache


def qkv_shape(cfg: GPTConfig) -> tuple[int, int]:
    """The QKV weight's output shape [G + 2, K x H]: GPT-2's [3, D] when every query head has its own key/value head.
    Query head n = k G + g sits at row g, columns of head k: splitting the last axis over the mesh's `model` axis
    hands each device whole key/value heads together with the query heads they serve (Megatron's GQA layout)."""
    return cfg.n_head // cfg.kv_heads + 2, cfg.kv_heads * cfg.head_dim


def split_heads(qkv_BTRE: jax.Array, cfg: GPTConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """[B, T, G + 2, K x H] -> queries [B, T, N, H] (head n = k G + g: it shares key/value head n // G, as
    jax.nn.dot_product_attention and transformers pair them), keys and values [B, T, K, H]."""
    G = cfg.n_head // cfg.kv_heads
    # One split, not three slices: its gradient is one concatenation, where three slices' are three zero-padded
    # copies of the whole [B, T, G + 2, K x H] added up (with unstack_layers: gpt2-mini's CPU step 1.02-1.05x faster,
    # BENCHMARKS.md).
    return heads(*jnp.split(qkv_BTRE, [G, G + 1], axis=2), cfg)


def qkv_parts(qkv: Linear, cfg: GPTConfig) -> tuple[Linear, Linear, Linear]:
    """The QKV layer as three: its weight's (and bias's) query rows [D, G, K x H], key row and value row [D, 1, K x H]
    (`model.fused_qkv=false`). Each slice keeps the weight's last axis, so a weight split over the mesh's `model`
    axis stays split."""
    G = cfg.n_head // cfg.kv_heads
    weights = jnp.split(qkv.weight, [G, G + 1], axis=1)
    biases = (None,) * 3 if qkv.bias is None else jnp.split(qkv.bias, [G, G + 1], axis=0)
    return tuple(Linear(w, b) for w, b in zip(weights, biases))


def heads(
    q_BTGE: jax.Array, k_BT1E: jax.Array, v_BT1E: jax.Array, cfg: GPTConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The query rows [B, T, G, K x H] and key and value rows [B, T, 1, K x H] as `split_heads`' heads."""
    B, T = q_BTGE.shape[:2]
    N, K, H = cfg.n_head, cfg.kv_heads, cfg.head_dim
    G = N // K
    if G == 1:  # multi-head attention: GPT-2's [3, D] rows
        q_BTNH = q_BTGE.reshape(B, T, N, H)
    else:
        q_BTNH = jnp.swapaxes(q_BTGE.reshape(B, T, G, K, H), 2, 3).reshape(B, T, N, H)
    return q_BTNH, k_BT1E.reshape(B, T, K, H), v_BT1E.reshape(B, T, K, H)


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; a no-op at rate 0 or without a key (inference)."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)
