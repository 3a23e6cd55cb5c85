"""GPT-2 in Equinox.

Token + learned position embeddings, pre-LayerNorm blocks (causal self-attention, 4x GELU MLP), a final LayerNorm
and an LM head tied to the token embedding. The blocks are stored *stacked*: every leaf of `GPT.blocks` has a leading
`n_layer` axis, so the layers can run under `lax.scan` (compile time independent of depth) or in a Python loop.

Shape suffixes name array axes: B batch, T time, D model width, N heads, H head size, V (padded) vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from models.attention import causal_attention, cpu_float16_to_float32

INIT_STD = 0.02  # GPT-2's init for every weight matrix and both embeddings.
REMAT_POLICIES = {
    # "block": keep the matmul outputs, recompute the cheap elementwise work in the backward pass.
    "block": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # "full": keep only each block's input, recompute the whole block in the backward pass.
    "full": jax.checkpoint_policies.nothing_saveable,
}


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The model's hyper-parameters; static (hashable) so it can live inside the jitted pytree."""

    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    context_size: int
    dropout: float = 0.0
    bias: bool = True
    vocab_multiple: int = 64
    attention: str = "xla"  # xla | cudnn | blocked (models/attention.py)
    remat: str = "none"  # none | block | full
    scan_layers: bool = True

    @property
    def padded_vocab_size(self) -> int:
        """Vocab rounded up so the head's matmul has friendly shapes; padded ids are never predicted."""
        return math.ceil(self.vocab_size / self.vocab_multiple) * self.vocab_multiple


class Linear(eqx.Module):
    """y = x W + b with W stored as [in, out] (GPT-2's own layout) and applied to any leading axes."""

    weight: jax.Array
    bias: jax.Array | None

    @staticmethod
    def init(key: jax.Array, d_in: int, d_out: int, bias: bool, std: float = INIT_STD) -> Linear:
        weight = std * jax.random.normal(key, (d_in, d_out), jnp.float32)
        return Linear(weight, jnp.zeros((d_out,), jnp.float32) if bias else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        # As a 2-D matmul: XLA:CPU runs the weight gradient of a [B, T, D] input (two contracting axes) ~2x slower.
        y = x.reshape(-1, x.shape[-1]) @ self.weight
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y if self.bias is None else y + self.bias


class LayerNorm(eqx.Module):
    """LayerNorm over the last axis, computed in float32 whatever the input dtype."""

    weight: jax.Array
    bias: jax.Array | None
    eps: float = eqx.field(static=True, default=1e-5)

    @staticmethod
    def init(d: int, bias: bool) -> LayerNorm:
        return LayerNorm(jnp.ones((d,), jnp.float32), jnp.zeros((d,), jnp.float32) if bias else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps) * self.weight.astype(jnp.float32)
        if self.bias is not None:
            y = y + self.bias.astype(jnp.float32)
        return y.astype(x.dtype)


class Block(eqx.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    ln1: LayerNorm
    qkv: Linear
    attn_proj: Linear
    ln2: LayerNorm
    fc: Linear
    mlp_proj: Linear

    @staticmethod
    def init(key: jax.Array, cfg: GPTConfig) -> Block:
        d = cfg.n_embd
        residual_std = INIT_STD / math.sqrt(2 * cfg.n_layer)  # GPT-2: keep the residual stream's variance flat.
        k1, k2, k3, k4 = jax.random.split(key, 4)
        return Block(
            ln1=LayerNorm.init(d, cfg.bias),
            qkv=Linear.init(k1, d, 3 * d, cfg.bias),
            attn_proj=Linear.init(k2, d, d, cfg.bias, std=residual_std),
            ln2=LayerNorm.init(d, cfg.bias),
            fc=Linear.init(k3, d, 4 * d, cfg.bias),
            mlp_proj=Linear.init(k4, 4 * d, d, cfg.bias, std=residual_std),
        )

    def __call__(self, x_BTD: jax.Array, cfg: GPTConfig, key: jax.Array | None) -> jax.Array:
        B, T, D = x_BTD.shape
        N = cfg.n_head
        keys = (None, None) if key is None else tuple(jax.random.split(key, 2))
        q_BTNH, k_BTNH, v_BTNH = (
            a.reshape(B, T, N, D // N) for a in jnp.split(self.qkv(self.ln1(x_BTD)), 3, axis=-1)
        )
        y_BTNH = causal_attention(q_BTNH, k_BTNH, v_BTNH, cfg.attention)
        x_BTD = x_BTD + _dropout(self.attn_proj(y_BTNH.reshape(B, T, D)), cfg.dropout, keys[0])
        h_BTF = jax.nn.gelu(self.fc(self.ln2(x_BTD)), approximate=True)  # GPT-2's tanh GELU
        return x_BTD + _dropout(self.mlp_proj(h_BTF), cfg.dropout, keys[1])


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; a no-op at rate 0 or without a key (inference)."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


class GPT(eqx.Module):
    wte: jax.Array  # [V, D] token embedding, also the LM head (one parameter, used twice)
    wpe: jax.Array  # [C, D] learned position embedding
    blocks: Block  # every leaf stacked along a leading n_layer axis
    ln_f: LayerNorm
    cfg: GPTConfig = eqx.field(static=True)

    @staticmethod
    def init(cfg: GPTConfig, key: jax.Array) -> GPT:
        k_wte, k_wpe, k_blocks = jax.random.split(key, 3)
        blocks = eqx.filter_vmap(lambda k: Block.init(k, cfg))(jax.random.split(k_blocks, cfg.n_layer))
        return GPT(
            wte=INIT_STD * jax.random.normal(k_wte, (cfg.padded_vocab_size, cfg.n_embd), jnp.float32),
            wpe=INIT_STD * jax.random.normal(k_wpe, (cfg.context_size, cfg.n_embd), jnp.float32),
            blocks=blocks,
            ln_f=LayerNorm.init(cfg.n_embd, cfg.bias),
            cfg=cfg,
        )

    def __call__(self, tokens_BT: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        """Float32 logits [B, T, V] over the padded vocab; padded ids get a large negative logit.

        `key` switches dropout on (training); without it the model is deterministic (evaluation, sampling).
        """
        return self.logits(self.hidden(tokens_BT, key=key))

    def hidden(self, tokens_BT: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        """The final LayerNorm's output [B, T, D], in the dtype of the parameters."""
        cfg = self.cfg
        T = tokens_BT.shape[1]
        keys = [None] * (cfg.n_layer + 1) if key is None else list(jax.random.split(key, cfg.n_layer + 1))
        x_BTD = _dropout(self.wte[tokens_BT] + self.wpe[:T], cfg.dropout, keys[0])

        block_fn = lambda block, x, k: block(x, cfg, k)  # noqa: E731
        if cfg.remat != "none":
            block_fn = jax.checkpoint(block_fn, policy=REMAT_POLICIES[cfg.remat])
        params, static = eqx.partition(self.blocks, eqx.is_array)
        layer_keys = None if key is None else jnp.stack(keys[1:])
        if cfg.scan_layers:

            def body(x, layer):
                p, k = layer
                return block_fn(eqx.combine(p, static), x, k), None

            x_BTD, _ = jax.lax.scan(body, x_BTD, (params, layer_keys))
        else:
            for i in range(cfg.n_layer):
                block = eqx.combine(jax.tree.map(lambda a: a[i], params), static)
                x_BTD = block_fn(block, x_BTD, None if key is None else layer_keys[i])
        return self.ln_f(x_BTD)

    def logits(self, h_BTD: jax.Array) -> jax.Array:
        h_BTD, wte = cpu_float16_to_float32(h_BTD, self.wte.astype(h_BTD.dtype))
        logits_BTV = jnp.einsum("btd,vd->btv", h_BTD, wte, preferred_element_type=jnp.float32)
        is_real = jnp.arange(self.cfg.padded_vocab_size) < self.cfg.vocab_size
        return jnp.where(is_real, logits_BTV, -1e9)

    def weight_decay_mask(self) -> GPT:
        """True for the matrices that multiply activations (linear weights, token embedding = head); False for
        biases, LayerNorm and the position embedding."""
        mask = jax.tree.map(lambda _: False, self)
        b = lambda m: m.blocks  # noqa: E731
        return eqx.tree_at(
            lambda m: (m.wte, b(m).qkv.weight, b(m).attn_proj.weight, b(m).fc.weight, b(m).mlp_proj.weight),
            mask,
            replace=(True,) * 5,
        )

    def block_matrices_mask(self) -> GPT:
        """True for the blocks' linear weights only (Muon's matrices; embeddings and the rest go to AdamW)."""
        mask = jax.tree.map(lambda _: False, self)
        b = lambda m: m.blocks  # noqa: E731
        return eqx.tree_at(
            lambda m: (b(m).qkv.weight, b(m).attn_proj.weight, b(m).fc.weight, b(m).mlp_proj.weight),
            mask,
            replace=(True,) * 4,
        )


def count_params(model: GPT, *, exclude_position_embedding: bool = False) -> int:
    """Number of parameters (the tied head counted once). Works on abstract models from `eqx.filter_eval_shape`."""
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(model))
    return total - (math.prod(model.wpe.shape) if exclude_position_embedding else 0)
