"""GPT-2 in Equinox, and the modern decoders as options of the same model.

GPT-2: token + learned position embeddings, pre-LayerNorm blocks (causal self-attention, 4x GELU MLP), a final
LayerNorm and an LM head tied to the token embedding. The options (GPTConfig; `model.*` keys) change one piece each:
rotary positions instead of the learned embedding (models/rope.py), RMSNorm (models/norms.py), SwiGLU or ReLU^2
MLPs (models/mlp.py), grouped-query attention (`n_kv_head` key/value heads, each shared by n_head / n_kv_head query
heads), QK-norm, an untied head and a logit soft-cap (models/lm_head.py). With every option at its default the
parameters, their names and shapes and every number computed are GPT-2's.

The blocks (models/block.py) are stored *stacked*: every leaf of `GPT.blocks` has a leading `n_layer` axis, so the
layers can run under `lax.scan` (compile time independent of depth) or in a Python loop. Decoding passes a `KVCache`
through the same blocks (`GPT.hidden(tokens, cache=...)`), so sampling always runs the model that was trained.
`GPT.TENSOR_PARALLEL_AXES` is the model's Megatron layout for the mesh's `model` axis.

Shape suffixes name array axes: B batch, T time, D model width, N heads, K key/value heads, G = N / K query heads per
key/value head, H head size, F MLP width, V (padded) vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from core import param_labels
from models.auto import resolve_scan_layers
from models.block import INIT_STD, Block, dropout
from models.config import GPTConfig
from models.kv_cache import KVCache, LayerCache
from models.lm_head import chunked_log_z_and_target_logit, log_z_and_target_logit, masked_logits
from models.mup import output_multiplier
from models.norms import LayerNorm, RMSNorm, init_norm
from models.rope import rotary_angles
from models.speedrun import GATE_CHANNELS, VALUE_EMBEDDING_STD, layer_segments, smear

REMAT_POLICIES = {
    # "block": keep the matmul outputs, recompute the cheap elementwise work in the backward pass.
    "block": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # "full": keep only each block's input, recompute the whole block in the backward pass.
    "full": jax.checkpoint_policies.nothing_saveable,
}


def with_config(model: GPT, cfg: GPTConfig) -> GPT:
    """The same parameters read under another static description, e.g. a training stage's attention window
    (train.stages): only what `cfg` changes of how the forward pass runs, never the parameters' shapes."""
    return dataclasses.replace(model, cfg=cfg)


def segment_positions(segment_ids_BT: jax.Array) -> jax.Array:
    """[B, T] position of each token within its segment: 0 where a segment starts (segments are contiguous)."""
    T = segment_ids_BT.shape[1]
    t = jnp.arange(T)
    starts_BT = jnp.concatenate(
        [jnp.ones_like(segment_ids_BT[:, :1], bool), segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1
    )
    return t - jax.lax.cummax(jnp.where(starts_BT, t, 0), axis=1)


def unstack_layers(tree: Any, n: int) -> list[Any]:
    """[n, ...] leaves -> n trees of [...] leaves, one per layer. Floating leaves are split once: the gradient of a
    split is one concatenation, where n indexings' are n zero-padded copies of the whole stack added up (each layer's
    weight gradient written n times over). Other leaves (keys, integers) are indexed."""
    leaves, treedef = jax.tree.flatten(tree)
    split = [
        [jnp.squeeze(part, 0) for part in jnp.split(leaf, n)] if jnp.issubdtype(leaf.dtype, jnp.inexact) else None
        for leaf in leaves
    ]
    return [
        jax.tree.unflatten(treedef, [leaf[i] if parts is None else parts[i] for leaf, parts in zip(leaves, split)])
        for i in range(n)
    ]


class GPT(eqx.Module):
    wte: jax.Array  # [V, D] token embedding, also the LM head when tied (one parameter, used twice)
    wpe: jax.Array | None  # [C, D] learned position embedding; None with rotary positions
    blocks: Block  # every leaf stacked along a leading n_layer axis
    ln_f: LayerNorm | RMSNorm
    ln_e: LayerNorm | RMSNorm | None  # the embeddings' norm (model.embedding_norm); None without
    lm_head: jax.Array | None  # [V, D] an untied LM head (model.tie_embeddings=false); None when tied
    lm_bias: jax.Array | None  # [V] the LM head's bias (model.head_bias), starting at 0; None without
    skip_weights: jax.Array | None  # [n_layer // 2] the U-net skips' weights (model.unet_skips); None without
    value_embeds: jax.Array | None  # [k, V, D] value-embedding tables (model.value_embeddings = k); None without
    ve_gates: jax.Array | None  # [2k, K, G] their gates' weights, layers 0..k-1 then the last k; None without
    smear: jax.Array | None  # [G + 1] the smear gate's weights w, then its lambda (model.smear_gate); None without
    cfg: GPTConfig = eqx.field(static=True)

    # Megatron's tensor-parallel layout: the axis of each array split over the mesh's `model` axis (blocks' arrays
    # are stacked, so their axis 0 is the layer). QKV and the first MLP matrix are split by output columns, so each
    # device holds whole heads (whole key/value heads with their query heads, under GQA: `qkv_shape`) and a slice of
    # the hidden units (SwiGLU's gate and up columns of a unit together: models/mlp.py); the attention output and
    # second MLP matrices by input rows (XLA adds one all-reduce after each); the token embedding, an untied head and
    # the value-embedding tables by vocabulary rows. Every other array is replicated over `model`.
    # training/distributed/sharding.py applies this to the parameters and to every optimizer and statistics buffer
    # shaped like them.
    TENSOR_PARALLEL_AXES = {
        ("wte",): 0,
        ("lm_head",): 0,
        ("lm_bias",): 0,
        ("value_embeds",): 1,
        ("blocks", "qkv", "weight"): 3,
        ("blocks", "qkv", "bias"): 2,
        ("blocks", "fc", "weight"): 2,
        ("blocks", "fc", "bias"): 1,
        ("blocks", "attn_proj", "weight"): 1,
        ("blocks", "mlp_proj", "weight"): 1,
    }

    @staticmethod
    def init(cfg: GPTConfig, key: jax.Array) -> GPT:
        """A fresh model of `cfg` drawn from `key`, as one compiled program (`_init`): called outside a jit, one
        program per config instead of one per random array and shape (a 2-layer model of width 64's first init: 1.2 s
        against 2.6 s, one of width 96 then 0.9 s against 1.4 s, on the 2-core Xeon), and the same numbers as a run's
        init (models.build_gpt), which an eager draw matches only to the last bit of float32."""
        # hashed into the program: a list (as ModelOptions holds model.yarn_windows) is not hashable
        return _init(dataclasses.replace(cfg, yarn_windows=tuple(cfg.yarn_windows)), key)

    @staticmethod
    def _draw(cfg: GPTConfig, key: jax.Array) -> GPT:
        k_wte, k_wpe, k_blocks = jax.random.split(key, 3)
        blocks = eqx.filter_vmap(lambda k: Block.init(k, cfg))(jax.random.split(k_blocks, cfg.n_layer))
        vocab_shape = (cfg.padded_vocab_size, cfg.n_embd)
        embedding = lambda k: INIT_STD * jax.random.normal(k, vocab_shape, jnp.float32)  # noqa: E731
        return GPT(
            wte=embedding(k_wte),
            wpe=(
                INIT_STD * jax.random.normal(k_wpe, (cfg.context_size, cfg.n_embd), jnp.float32)
                if cfg.position == "learned"
                else None
            ),
            blocks=blocks,
            ln_f=init_norm(cfg.norm, cfg.n_embd, cfg.bias, cfg.norm_weight),
            ln_e=init_norm(cfg.norm, cfg.n_embd, cfg.bias, cfg.norm_weight) if cfg.embedding_norm else None,
            # a key of its own that leaves GPT-2's three (and so its init) as they were
            lm_head=None if cfg.tie_embeddings else embedding(jax.random.fold_in(key, 3)),
            lm_bias=jnp.zeros((cfg.padded_vocab_size,), jnp.float32) if cfg.head_bias else None,
            skip_weights=jnp.ones((cfg.n_layer // 2,), jnp.float32) if cfg.unet_skips else None,
            # the speedrun's: tables drawn with std 0.01, gates at 0 (2 sigmoid(0) = 1); as wide as the values (the
            # key/value heads', narrower than n_embd under grouped-query attention)
            value_embeds=(
                VALUE_EMBEDDING_STD
                * jax.random.normal(
                    jax.random.fold_in(key, 4),
                    (cfg.value_embeddings, cfg.padded_vocab_size, cfg.kv_heads * cfg.head_dim),
                    jnp.float32,
                )
                if cfg.value_embeddings
                else None
            ),
            ve_gates=(
                jnp.zeros((2 * cfg.value_embeddings, cfg.kv_heads, min(GATE_CHANNELS, cfg.n_embd)), jnp.float32)
                if cfg.value_embeddings
                else None
            ),
            smear=jnp.zeros((min(GATE_CHANNELS, cfg.n_embd) + 1,), jnp.float32) if cfg.smear_gate else None,
            cfg=cfg,
        )

    def __call__(
        self, tokens_BT: jax.Array, *, key: jax.Array | None = None, segment_ids_BT: jax.Array | None = None
    ) -> jax.Array:
        """Float32 logits [B, T, V] over the padded vocab; padded ids get a large negative logit.

        `key` switches dropout on (training); without it the model is deterministic (evaluation, sampling).
        `segment_ids_BT` (document masking): tokens attend only within their segment, whose positions start at 0.
        """
        return self.logits(self.hidden(tokens_BT, key=key, segment_ids_BT=segment_ids_BT)[0])

    def init_cache(self, batch: int) -> KVCache:
        """An empty KV cache for `batch` rows, in the parameters' dtype: K key/value heads per layer."""
        cfg = self.cfg
        shape = (cfg.n_layer, batch, cfg.context_size, cfg.kv_heads, cfg.head_dim)
        zeros = jnp.zeros(shape, self.wte.dtype)
        tokens = jnp.zeros((batch, cfg.context_size), jnp.int32) if cfg.smear_gate else None  # the smear's look-back
        return KVCache(zeros, zeros, jnp.zeros((batch,), jnp.int32), empty=True, tokens=tokens)

    def hidden(
        self,
        tokens_BT: jax.Array,
        *,
        key: jax.Array | None = None,
        cache: KVCache | None = None,
        segment_ids_BT: jax.Array | None = None,
        fp8_scales: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """The final norm's output [B, T, D] (under μP times the readout multiplier), in the dtype of the parameters.
        With a `cache`, the tokens sit at positions `cache.lengths` onwards, attend to what the cache holds, and the
        cache comes back with their keys and values added and every row `T` positions longer. `fp8_scales`
        ([L, 4, 3], models/fp8.py): the blocks' matmuls in FP8 (training only)."""
        cfg = self.cfg
        T = tokens_BT.shape[1]
        keys = [None] * (cfg.n_layer + 1) if key is None else list(jax.random.split(key, cfg.n_layer + 1))
        if segment_ids_BT is not None:
            positions = segment_positions(segment_ids_BT)
        else:
            positions = jnp.arange(T) if cache is None else cache.lengths[:, None] + jnp.arange(T)
        x_BTD = self.wte[tokens_BT]
        if self.smear is not None:
            x_BTD, cache = smear(x_BTD, tokens_BT, positions, cache, self.smear, self.wte)
        rotary = None
        if self.wpe is not None:
            x_BTD = x_BTD + self.wpe[positions]
        else:  # rotary: the same positions (restarting per document) turn the queries and keys in every block
            rotary = rotary_angles(positions, cfg.head_dim, cfg.rope_theta, cfg.rope_frequencies, cfg.yarn_path)
        if self.ln_e is not None:
            x_BTD = self.ln_e(x_BTD)
        x_BTD = dropout(x_BTD, cfg.dropout, keys[0])

        def block_fn(block, x, k, kv, scales, ve):
            layer_cache = None if cache is None else LayerCache(kv[0], kv[1], cache.lengths, cache.empty)
            x, layer_cache = block(x, cfg, k, layer_cache, segment_ids_BT, scales, rotary, ve)
            return x, None if layer_cache is None else (layer_cache.k, layer_cache.v)

        if cfg.remat != "none" and cache is None:
            block_fn = jax.checkpoint(block_fn, policy=REMAT_POLICIES[cfg.remat])
        params, static = eqx.partition(self.blocks, eqx.is_array)
        layer_keys = None if key is None else jnp.stack(keys[1:])
        kv_L = None if cache is None else (cache.k, cache.v)
        # Decoding always scans: unrolled, each token would copy every layer's slice of the stacked cache out and
        # back (measured: a gpt2-mini decode step 20.7 ms unrolled vs 5.2 ms scanned on CPU).
        scanned = resolve_scan_layers(cfg.scan_layers) or cache is not None

        def layers(lo: int, hi: int, x, collect: bool, skip, ve):
            """Blocks lo..hi-1 on x: the last x, with `collect` each block's output stacked ([hi - lo, B, T, D]),
            and their keys and values (decoding). `skip` (weights [hi - lo], inputs [hi - lo, B, T, D]): each
            block's input adds its weighted skip first. `ve` (value embeddings [hi - lo, B, T, D], gates)."""
            whole = (lo, hi) == (0, cfg.n_layer)
            cut = lambda tree: tree if tree is None or whole else jax.tree.map(lambda a: a[lo:hi], tree)  # noqa: E731

            def body(x, layer):
                p, k, kv, scales, skip, ve = layer
                if skip is not None:
                    x = x + skip[0].astype(x.dtype) * skip[1]
                x, kv = block_fn(eqx.combine(p, static), x, k, kv, scales, ve)
                return x, (x if collect else None, kv)

            xs = (cut(params), cut(layer_keys), cut(kv_L), cut(fp8_scales), skip, ve)
            if scanned:
                x, (outs, kv) = jax.lax.scan(body, x, xs)
                return x, outs, kv
            outs, per_layer = [], unstack_layers(xs, hi - lo)
            for layer in per_layer:
                x, (out, _) = body(x, layer)
                outs.append(out)
            return x, jnp.stack(outs) if collect else None, None

        # Each token's rows of the value-embedding tables, [tables, B, T, D] (model.value_embeddings)
        ve_kBTD = None if self.value_embeds is None else self.value_embeds[:, tokens_BT].astype(x_BTD.dtype)
        firsts, mirrored, kvs = [], None, []  # the U-net's first-half outputs; the last half's skips
        for seg in layer_segments(cfg):
            skip = ve = None
            if seg.skips is not None:
                mirrored = jnp.concatenate(firsts)[::-1] if mirrored is None else mirrored
                skip = (self.skip_weights[slice(*seg.skips)], mirrored[slice(*seg.skips)])
            if seg.tables is not None:
                ve = (ve_kBTD[slice(*seg.tables)], self.ve_gates[slice(*seg.gates)])
            x_BTD, out, kv = layers(seg.lo, seg.hi, x_BTD, seg.collect, skip, ve)
            firsts += [out] if seg.collect else []
            kvs.append(kv)
        if cache is not None and len(kvs) > 1:
            kv_L = jax.tree.map(lambda *a: jnp.concatenate(a), *kvs)
        elif cache is not None:
            kv_L = kvs[0]
        if cache is not None:
            cache = KVCache(kv_L[0], kv_L[1], cache.lengths + T, tokens=cache.tokens)
        h_BTD = self.ln_f(x_BTD)
        if cfg.parametrization == "mup":  # the readout's 1/m (models/mup.py): every head and loss reads h
            h_BTD = h_BTD * jnp.asarray(output_multiplier(cfg), h_BTD.dtype)
        return h_BTD, cache

    @property
    def head(self) -> jax.Array:
        """The LM head's [V, D] weight: the token embedding when tied."""
        return self.wte if self.lm_head is None else self.lm_head

    def logits(self, h_BTD: jax.Array) -> jax.Array:
        cfg = self.cfg
        return masked_logits(
            h_BTD,
            self.head.astype(h_BTD.dtype),
            cfg.vocab_size,
            cfg.logit_softcap,
            cfg.logit_softcap_form,
            self.lm_bias,
            cfg.logits_dtype,
        )

    def loss_terms(
        self,
        tokens_BT: jax.Array,
        targets_BT: jax.Array,
        *,
        key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        fp8_scales: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """log Z and the target's logit per token ([B, T] float32): the cross-entropy is their difference. The head
        and the loss run as `cfg.head_loss` says (models/lm_head.py); training and evaluation both come here."""
        h_BTD = self.hidden(tokens_BT, key=key, segment_ids_BT=segment_ids_BT, fp8_scales=fp8_scales)[0]
        with jax.named_scope("lm_head_loss"):
            if self.cfg.head_loss == "chunked":
                return chunked_log_z_and_target_logit(
                    h_BTD,
                    self.head.astype(h_BTD.dtype),
                    targets_BT,
                    self.cfg.vocab_size,
                    self.cfg.head_loss_chunk,
                    self.cfg.logit_softcap,
                    self.cfg.logit_softcap_form,
                    self.lm_bias,
                    self.cfg.logits_dtype,
                )
            return log_z_and_target_logit(self.logits(h_BTD), targets_BT)

    def _select(self, *names: str) -> Callable[[GPT], tuple[jax.Array, ...]]:
        """A `tree_at` selector of the parameters with these dotted names ("blocks.fc.weight") that this model has
        (an option's absent parameter, e.g. wpe under rotary positions, is skipped)."""

        def get(m: GPT, name: str) -> jax.Array | None:  # the parameter, or None where the model lacks it
            for part in name.split("."):
                m = None if m is None else getattr(m, part)
            return m

        present = [n for n in names if get(self, n) is not None]
        return lambda m: tuple(get(m, n) for n in present)

    def _mark(self, default: bool | str, where: dict[bool | str, tuple[str, ...]]) -> GPT:
        """A tree shaped like the model: each key of `where` at the parameters it names, `default` elsewhere."""
        tree = jax.tree.map(lambda _: default, self)
        for mark, names in where.items():
            select = self._select(*names)
            if select(self):
                tree = eqx.tree_at(select, tree, replace=(mark,) * len(select(self)))
        return tree

    def weight_decay_mask(self) -> GPT:
        """True for the matrices that multiply activations (linear weights, token and value embeddings, a head);
        False for biases, norms and the position embedding."""
        return self._mark(False, {True: ("wte", "lm_head", "value_embeds", *BLOCK_MATRICES)})

    def parameter_labels(self) -> GPT:
        """Each parameter's label for the optimizer's groups (optimizers/groups.py): token_embedding (also the LM
        head when tied), head (an untied LM head), position, attn_qkv, attn_out, mlp_in (SwiGLU's gate and up),
        mlp_out, norm (norm weights, QK-norm's and the embeddings' too), bias (every bias, the LM head's too), scalar
        (the U-net skips' weights, the value embeddings' gates, the smear gate), value_embedding (the value-embedding
        tables)."""
        norms = ("blocks.ln1", "blocks.ln2", "blocks.q_norm", "blocks.k_norm", "ln_f", "ln_e")
        return self._mark(
            "",
            {
                "token_embedding": ("wte",),
                "head": ("lm_head",),
                "position": ("wpe",),
                **{label: (path,) for label, path in BLOCK_MATRIX_PATHS.items()},
                "norm": tuple(f"{n}.weight" for n in norms),
                "scalar": ("skip_weights", "ve_gates", "smear"),
                "value_embedding": ("value_embeds",),
                "bias": tuple(f"blocks.{f}.bias" for f in ("qkv", "attn_proj", "fc", "mlp_proj"))
                + tuple(f"{n}.bias" for n in norms)
                + ("lm_bias",),
            },
        )

    def block_matrices_mask(self) -> GPT:
        """True for the blocks' linear weights only (Muon's matrices; embeddings and the rest go to AdamW)."""
        return self._mark(False, {True: BLOCK_MATRICES})


# GPT.init's program, one per config (hashed into it: the shapes and options) and key shape
_init = eqx.filter_jit(GPT._draw)


# Where each block matrix (core/param_labels.py) is in the model, in the labels' order.
BLOCK_MATRIX_PATHS = dict(
    zip(
        param_labels.BLOCK_MATRICES,
        ("blocks.qkv.weight", "blocks.attn_proj.weight", "blocks.fc.weight", "blocks.mlp_proj.weight"),
        strict=True,
    )
)
BLOCK_MATRICES = tuple(BLOCK_MATRIX_PATHS.values())


def count_params(model: GPT, *, exclude_position_embedding: bool = False) -> int:
    """Number of parameters (the tied head counted once). Works on abstract models from `eqx.filter_eval_shape`."""
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(model))
    return total - (math.prod(model.wpe.shape) if exclude_position_embedding and model.wpe is not None else 0)


def matmul_params(model: GPT) -> int:
    """The parameters each token multiplies (training/reporting/flops.py's N): all but the lookup tables, i.e. the
    position embedding, the value-embedding tables and, when the head is untied, the token embedding (tied, it is the
    head's matmul)."""
    lookups = 0 if model.lm_head is None else math.prod(model.wte.shape)
    lookups += 0 if model.value_embeds is None else math.prod(model.value_embeds.shape)
    return count_params(model, exclude_position_embedding=True) - lookups
