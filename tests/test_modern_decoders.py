"""The modern decoders as options of the one model: rotary positions, RMSNorm, SwiGLU and ReLU^2, grouped-query
attention, QK-norm, an untied head and a logit soft-cap; what follows from them (document masking, the two heads,
remat and unrolled layers, FP8, FLOPs, parameter labels, tensor parallelism, config checks); and GPT-2 unchanged.
Cached decoding: tests/test_decode.py; Hugging Face Llama: tests/test_hf.py."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import train_jax
from helpers import ROOT, build, tiny_overrides
from models import gpt_config, parameter_labels
from models.config import GPTConfig
from models.gpt import GPT
from models.mlp import mlp_activation
from models.norms import RMSNorm
from models.rope import apply_rotary, rotary_angles
from training.config import load_config
from training.distributed.sharding import MODEL_AXIS
from training.reporting.flops import flops_per_token

LLAMA = GPTConfig(
    vocab_size=259,
    n_layer=2,
    n_head=4,
    n_embd=64,
    context_size=64,
    position="rope",
    norm="rmsnorm",
    mlp="swiglu",
    n_kv_head=2,
    tie_embeddings=False,
    bias=False,
)
SPEEDRUN = dataclasses.replace(
    LLAMA, mlp="relu2", n_kv_head=None, norm_weight=False, qk_norm=True, logit_softcap=2.0, rope_theta=1000.0
)


def tokens(shape, vocab=259, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, shape), jnp.int32)


# Compiled once per config (tiny models run op by op are slower than compiling them).
init = eqx.filter_jit(GPT.init)
logits = eqx.filter_jit(lambda model, x, segments=None: model(x, segment_ids_BT=segments))


def test_rotary_attention_scores_depend_only_on_the_distance_between_query_and_key():
    q, k = jax.random.normal(jax.random.PRNGKey(0), (2, 1, 12, 2, 16))  # [B, T, N, H] each
    positions = jnp.arange(12)

    def scores(offset):
        cos, sin = rotary_angles(positions + offset, 16, 10000.0)
        return jnp.einsum("btnh,bsnh->bnts", apply_rotary(q, cos, sin), apply_rotary(k, cos, sin))

    # Every position shifted: the same scores, up to float32 angles: up to 48 rad, each off by <= 2^-23 x 48 ~ 6e-6 rad
    # in q's and in k's rotation, so a score by <= ~1.2e-5 x |q||k| (27 at most here; measured 4e-6 in all)
    qk = float(jnp.linalg.norm(q, axis=-1).max() * jnp.linalg.norm(k, axis=-1).max())
    np.testing.assert_allclose(scores(0), scores(37), atol=2e-5 * qk)
    plain = jnp.einsum("btnh,bsnh->bnts", q, k)
    assert float(jnp.abs(scores(0) - plain).max()) > 0.1  # the rotation does change them
    # a query and a key at the same position: no relative rotation; the same cos and sin on both sides, so only the
    # rotation's few roundings remain, ~1e-7 x |q||k| (<= 27): 1e-4 leaves ~30x
    np.testing.assert_allclose(
        jnp.diagonal(scores(0), axis1=-2, axis2=-1), jnp.diagonal(plain, axis1=-2, axis2=-1), atol=1e-4
    )
    cos, sin = rotary_angles(positions, 16, 10000.0)
    np.testing.assert_allclose(
        jnp.linalg.norm(apply_rotary(q, cos, sin), axis=-1), jnp.linalg.norm(q, axis=-1), rtol=1e-5
    )  # a rotation: norms kept, up to its few float32 roundings (~1e-7)


def test_rmsnorm_swiglu_and_relu2_match_their_formulas():
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (3, 5, 8)), np.float64) * 3 + 1
    # float32 layers against float64 formulas: a few roundings each, ~1e-7 relative; 1e-5 leaves ~100x
    w = np.linspace(0.5, 2.0, 8)
    rms = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(RMSNorm(jnp.asarray(w, jnp.float32))(jnp.asarray(x, jnp.float32)), rms * w, rtol=1e-5)
    np.testing.assert_allclose(RMSNorm.init(8, weight=False)(jnp.asarray(x, jnp.float32)), rms, rtol=1e-5)
    gate, up = x, np.flip(x, axis=-1)
    silu = gate / (1 + np.exp(-gate))
    np.testing.assert_allclose(
        mlp_activation("swiglu", jnp.asarray(np.stack([gate, up], -1), jnp.float32)), silu * up, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(mlp_activation("relu2", jnp.asarray(x, jnp.float32)), np.maximum(x, 0) ** 2, rtol=1e-5)
    model = eqx.filter_eval_shape(GPT.init, LLAMA, jax.random.PRNGKey(0))
    # SwiGLU's gate and up: one [D, F, 2] matrix, 8/3 x D wide
    assert model.blocks.fc.weight.shape == (2, 64, 192, 2) and model.blocks.mlp_proj.weight.shape == (2, 192, 64)


def test_grouped_query_attention_is_multi_head_attention_with_shared_key_value_heads():
    """n_kv_head=2: query heads 0, 1 share key/value head 0; 2, 3 share head 1. Multi-head attention with the same
    query weights and those two key/value heads, each repeated for its queries, is the same model; and n_kv_head =
    n_head is multi-head attention itself."""
    x = tokens((2, 24))
    gqa = init(LLAMA, jax.random.PRNGKey(1))
    w = gqa.blocks.qkv.weight  # [L, D, G + 2 = 4, K x H = 32]
    assert w.shape == (2, 64, 4, 32)
    q_LDNH = jnp.swapaxes(w[:, :, :2].reshape(2, 64, 2, 2, 16), 2, 3).reshape(2, 64, 64)  # query head n = 2 k + g
    repeat = lambda kv: jnp.repeat(kv.reshape(2, 64, 2, 16), 2, axis=2).reshape(2, 64, 64)  # noqa: E731
    qkv = jnp.stack([q_LDNH, repeat(w[:, :, 2]), repeat(w[:, :, 3])], axis=2)
    mha = dataclasses.replace(
        gqa, blocks=eqx.tree_at(lambda b: b.qkv.weight, gqa.blocks, qkv), cfg=dataclasses.replace(LLAMA, n_kv_head=None)
    )
    # two programs (grouped heads, repeated heads), float32 logits < 1 (padded rows aside): a few ulp, ~1e-7; 1e-5
    np.testing.assert_allclose(logits(gqa, x), logits(mha, x), atol=1e-5)
    same = dataclasses.replace(mha, cfg=dataclasses.replace(LLAMA, n_kv_head=4))  # n_kv_head = n_head
    assert eqx.filter_eval_shape(GPT.init, same.cfg, jax.random.PRNGKey(0)).blocks.qkv.weight.shape == qkv.shape
    assert logits.lower(same, x).as_text() == logits.lower(mha, x).as_text()  # one program: equal bit for bit
    np.testing.assert_array_equal(logits(same, x), logits(mha, x))
    blocked = dataclasses.replace(gqa, cfg=dataclasses.replace(LLAMA, attention="blocked"))
    np.testing.assert_allclose(logits(blocked, x), logits(gqa, x), atol=1e-5)  # it repeats the kv heads; as above


@pytest.mark.parametrize("attention", ["xla", "blocked"])
def test_document_masking_restarts_rotary_positions_per_document(attention, monkeypatch):
    """The same document after two different ones: with segment ids its logits agree with the document's alone
    (attention stays inside it), and the rotary angles are those of its positions counted from its start."""
    import models.gpt

    model = jax.tree.map(lambda x: 4.0 * x, init(LLAMA, jax.random.PRNGKey(0)))
    model = dataclasses.replace(model, cfg=dataclasses.replace(LLAMA, attention=attention))
    doc = tokens((1, 20), seed=1)
    windows = jnp.concatenate(
        [
            jnp.concatenate([tokens((1, 12), seed=2), doc], 1),
            jnp.concatenate([tokens((1, 5), seed=3), doc, tokens((1, 7), seed=4)], 1),
        ]
    )
    segments = jnp.asarray([[0] * 12 + [1] * 20, [0] * 5 + [1] * 20 + [2] * 7])
    masked = logits(model, windows, segments)
    alone = logits(model, jnp.tile(jnp.concatenate([doc, doc[:, :12]], 1), (2, 1)))[0, :20]  # windows' shape
    # other programs (other masks, the document elsewhere in the window): logits up to ~10, ulp ~1e-6; 1e-4 is 100 ulp
    np.testing.assert_allclose(masked[0, 12:], alone, atol=1e-4)
    np.testing.assert_allclose(masked[1, 5:25], alone, atol=1e-4)
    assert float(jnp.abs(logits(model, windows)[0, 12:] - alone).max()) > 1e-2  # without segment ids: the past
    # Rotary scores depend on distances only, so the logits above hold with any per-row offset: the positions
    # themselves say that each document starts at 0 (as the learned embedding needs, and as it runs alone).
    seen = []
    monkeypatch.setattr(models.gpt, "rotary_angles", lambda p, *a: seen.append(np.asarray(p)) or rotary_angles(p, *a))
    model.hidden(windows, segment_ids_BT=segments)  # op by op: the positions are concrete
    np.testing.assert_array_equal(seen[0], [[*range(12), *range(20)], [*range(5), *range(20), *range(7)]])


def test_dense_and_chunked_heads_remat_and_unrolled_layers_and_fp8_agree_under_every_option():
    """SwiGLU, GQA, QK-norm and a soft-cap of 2 together: the loss and its gradients are the same with the dense
    head and the layers under lax.scan, and with the chunked head (the soft-cap inside its hand-written backward
    pass), full remat and unrolled layers. FP8 runs the same model."""
    cfg = dataclasses.replace(LLAMA, qk_norm=True, logit_softcap=2.0)
    other = dataclasses.replace(
        cfg, head_loss="chunked", head_loss_chunk=16, remat="full", scan_layers=False, fused_qkv=False
    )
    model = jax.tree.map(lambda a: 3.0 * a, init(cfg, jax.random.PRNGKey(0)))
    x = tokens((2, 33))

    def loss(model, fp8_scales=None):
        log_z, target = model.loss_terms(x[:, :-1], x[:, 1:], fp8_scales=fp8_scales)
        return jnp.mean(log_z - target)

    loss_and_grads = eqx.filter_jit(eqx.filter_value_and_grad(loss))
    (a, ga), (b, gb) = (loss_and_grads(dataclasses.replace(model, cfg=c)) for c in (cfg, other))
    # Two programs: each float32 loss (~6, through a 259-way logsumexp) a few ulp off, ~5e-7 each: 1e-5 leaves ~10x
    np.testing.assert_allclose(a, b, rtol=1e-5)
    for g1, g2 in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        # an entry sums 64 tokens' terms in other orders: its error scales with the leaf's largest entries, not its
        # own size (measured <= 1e-6 x max|g|); 1e-5 x max|g| leaves 10x
        np.testing.assert_allclose(g1, g2, atol=1e-5 * float(jnp.abs(g2).max()), rtol=1e-4)
    assert float(jnp.abs(gb.lm_head).max()) > 0 and float(jnp.abs(gb.blocks.q_norm.weight).max()) > 0
    raw, capped = eqx.filter_jit(lambda m: (m.hidden(x)[0] @ m.head.T, m(x)))(model)
    # the model's cap against it written here (two programs): |capped| <= 2, a few ulp (~5e-7) apart; 1e-5 is 20x
    np.testing.assert_allclose(capped[..., :259], 2.0 * jnp.tanh(raw[..., :259] / 2.0), atol=1e-5)
    assert float(jnp.abs(raw).max()) > 4.0  # the cap really bites
    bf16 = jax.tree.map(lambda w: w.astype(jnp.bfloat16) if eqx.is_inexact_array(w) else w, model)
    fp8 = eqx.filter_jit(loss)(bf16, jnp.ones((cfg.n_layer, 4, 3)))  # 4 matmuls (SwiGLU's gate and up are one)
    assert float(fp8) == pytest.approx(float(a), rel=0.03)  # e4m3's 3 mantissa bits: close, not equal


@pytest.mark.parametrize("base", ["gpt2", "llama"])
def test_three_qkv_products_give_what_the_fused_product_gives(base):
    """`model.fused_qkv=false`: queries, keys and values from three products with the QKV weight's slices (GPT-2's
    biases; under GQA, the query rows of several heads) give the fused product's loss and gradients, from a program
    with two more products a layer."""
    gpt2 = GPTConfig(vocab_size=259, n_layer=2, n_head=4, n_embd=64, context_size=64)
    cfg = dataclasses.replace(gpt2 if base == "gpt2" else LLAMA, scan_layers=False)
    split = dataclasses.replace(cfg, fused_qkv=False)
    model = jax.tree.map(lambda a: 3.0 * a, init(cfg, jax.random.PRNGKey(0)))
    model = eqx.tree_at(lambda m: m.blocks.qkv.bias, model, replace_fn=lambda b: b + 0.1) if cfg.bias else model
    x = tokens((2, 33))

    def loss(model):
        log_z, target = model.loss_terms(x[:, :-1], x[:, 1:])
        return jnp.mean(log_z - target)

    loss_and_grads = eqx.filter_jit(eqx.filter_value_and_grad(loss))
    (a, ga), (b, gb) = (loss_and_grads(dataclasses.replace(model, cfg=c)) for c in (cfg, split))
    np.testing.assert_allclose(a, b, rtol=1e-5)  # two programs: a few ulp of a ~6 loss, as the test above
    for g1, g2 in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(g1, g2, atol=1e-5 * float(jnp.abs(g2).max()), rtol=1e-4)
    dots = [str(jax.make_jaxpr(loss)(dataclasses.replace(model, cfg=c))).count("dot_general") for c in (cfg, split)]
    assert dots[1] - dots[0] == 2 * cfg.n_layer, dots


def test_flops_per_token_counts_swiglu_gqa_and_an_untied_head():
    cfg = load_config(["model=llama-124m"])
    model = eqx.filter_eval_shape(GPT.init, gpt_config(cfg.model, 50257), jax.random.PRNGKey(0))
    d, L, T, V, F, KH = 768, 12, 1024, 50304, 2048, 4 * 64
    per_layer = d * (d + 2 * KH) + d * d + 3 * d * F + 2 * d  # q, k, v (4 heads of 64), out; gate, up, down; 2 norms
    n = L * per_layer + d + V * d  # blocks, final norm, the untied head; the token embedding is a lookup
    assert model.lm_head.shape == model.wte.shape == (V, d) and model.wpe is None
    assert flops_per_token(model, T) == 6 * n + 12 * L * d * T  # attention: 12 heads x 64 query dims, as MHA
    speedrun = eqx.filter_eval_shape(
        GPT.init, gpt_config(load_config(["model=modern-gpt"]).model, 50257), jax.random.PRNGKey(0)
    )
    n = L * (4 * d * d + 2 * 4 * d * d) + V * d  # qkv, out, ReLU^2 4x MLP; no norm weights, no biases
    assert flops_per_token(speedrun, T) == 6 * n + 12 * L * d * T


def test_parameter_labels_weight_decay_and_muon_matrices_cover_the_new_weights():
    for cfg in (LLAMA, SPEEDRUN):
        model = eqx.filter_eval_shape(GPT.init, cfg, jax.random.PRNGKey(0))
        labels, decay, matrices = model.parameter_labels(), model.weight_decay_mask(), model.block_matrices_mask()
        assert "" not in jax.tree.leaves(labels)  # every parameter has a label
        assert labels.lm_head == "head" and labels.wte == "token_embedding" and labels.wpe is None
        assert (labels.blocks.fc.weight, labels.blocks.mlp_proj.weight) == ("mlp_in", "mlp_out")  # gate+up, down
        assert labels.blocks.qkv.weight == "attn_qkv" and labels.blocks.attn_proj.weight == "attn_out"
        assert decay.lm_head and decay.wte and not any(jax.tree.leaves((decay.ln_f, decay.blocks.ln1)))
        assert jax.tree.leaves(matrices).count(True) == 4 and not matrices.lm_head
    assert jax.tree.leaves(model.parameter_labels().blocks.ln1) == []  # SPEEDRUN's norms have no weights
    qk = eqx.filter_eval_shape(GPT.init, dataclasses.replace(SPEEDRUN, norm_weight=True), jax.random.PRNGKey(0))
    qk = qk.parameter_labels()
    assert (qk.blocks.q_norm.weight, qk.blocks.k_norm.weight) == ("norm", "norm")
    # The labels models give are the vocabulary the optimizers read (core/param_labels.py), all of it in use
    from core.param_labels import LABELS

    given = (
        parameter_labels(load_config(["model=gpt2"]).model)
        | parameter_labels(load_config(["model=llama-124m"]).model)
        | parameter_labels(load_config(["model=gpt2-tiny", "model.unet_skips=true", "model.value_embeddings=1"]).model)
    )
    assert given == set(LABELS)
    assert parameter_labels(load_config(["model=llama-124m"]).model) == {
        "token_embedding",
        "head",
        "attn_qkv",
        "attn_out",
        "mlp_in",
        "mlp_out",
        "norm",
    }


# gpt2-tiny's parameters as they were before the modern options existed: names, shapes and the sum of each at init
# (key 0, vocab 259), recorded from the code of commit 593f5bc. Old checkpoints restore into this tree.
GPT2_TINY = {
    "wte": ((320, 64), -7.0245315295373985),
    "wpe": ((64, 64), 0.5009165780497824),
    "blocks.ln1.weight": ((2, 64), 128.0),
    "blocks.ln1.bias": ((2, 64), 0.0),
    "blocks.qkv.weight": ((2, 64, 3, 64), -3.646304360014014),
    "blocks.qkv.bias": ((2, 3, 64), 0.0),
    "blocks.attn_proj.weight": ((2, 64, 64), -0.7279776611327406),
    "blocks.attn_proj.bias": ((2, 64), 0.0),
    "blocks.ln2.weight": ((2, 64), 128.0),
    "blocks.ln2.bias": ((2, 64), 0.0),
    "blocks.fc.weight": ((2, 64, 256), -0.43580821774588685),
    "blocks.fc.bias": ((2, 256), 0.0),
    "blocks.mlp_proj.weight": ((2, 256, 64), 1.0353788893977764),
    "blocks.mlp_proj.bias": ((2, 64), 0.0),
    "ln_f.weight": ((64,), 64.0),
    "ln_f.bias": ((64,), 0.0),
}


def test_gpt2_keeps_its_parameter_tree_init_and_numbers():
    cfg = load_config(["model=gpt2-tiny"]).model
    model = GPT.init(gpt_config(cfg, 259, "xla"), jax.random.PRNGKey(0))
    got = {
        jax.tree_util.keystr(p, simple=True, separator="."): x
        for p, x in jax.tree_util.tree_flatten_with_path(model)[0]
    }
    assert {name: x.shape for name, x in got.items()} == {name: shape for name, (shape, _) in GPT2_TINY.items()}
    for name, (_, recorded) in GPT2_TINY.items():
        x = np.asarray(got[name], np.float64)
        if np.ptp(x) == 0:  # LayerNorm's 1s, the 0 biases: no rounding anywhere, the sum is exact
            assert x.sum() == recorded, name
        else:  # normal draws pass XLA's compiled erf_inv: an ulp (1.2e-7) an entry on another CPU; 1e-6 is 8x that
            assert abs(x.sum() - recorded) <= 1e-6 * np.abs(x).sum(), (name, x.sum(), recorded)
    x = tokens((2, 33))
    loss, out = eqx.filter_jit(lambda m: (jnp.mean(jnp.subtract(*m.loss_terms(x[:, :-1], x[:, 1:]))), m(x[:, :-1])))(
        model
    )
    # As recorded on another CPU (other compiled code, weights an ulp apart): the loss a few ulp (~5e-7) off; a
    # logit h.w is off by ~1e-6 of |h||w| ~ 1.3 (LayerNorm'd |h| = 8, |w| ~ 0.16) after 2 blocks' roundings: atol 1e-5
    assert float(loss) == pytest.approx(5.557269096374512, rel=1e-5)
    np.testing.assert_allclose(
        out[0, :2, :3],
        [
            [-0.43342313170433044, 0.32107943296432495, 0.3442275822162628],
            [-0.21488919854164124, -0.04899928718805313, -0.12281341105699539],
        ],
        rtol=1e-5,
        atol=1e-5,
    )


def test_llama_presets_have_the_gpt2_presets_widths_and_depths():
    def preset(name):
        return yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())

    shape = lambda m: [m.get(k) for k in ("n_layer", "n_head", "n_embd", "context_size", "scan_layers")]  # noqa: E731
    for llama, gpt2 in [
        ("llama-micro", "gpt2-micro"),
        ("llama-mini", "gpt2-mini"),
        ("llama-124m", "gpt2"),
        ("llama-350m", "gpt2-medium"),
        ("llama-774m", "gpt2-large"),
        ("llama-1.5b", "gpt2-xl"),
    ]:
        m = preset(llama)
        assert shape(m) == shape(preset(gpt2)) and m["name"] == llama
        assert [m[k] for k in ("position", "norm", "mlp", "tie_embeddings", "bias")] == [
            "rope",
            "rmsnorm",
            "swiglu",
            False,
            False,
        ]
        assert m["n_head"] % m["n_kv_head"] == 0 and m["n_kv_head"] < m["n_head"]
    modern = preset("modern-gpt")
    assert [
        modern[k] for k in ("position", "norm", "norm_weight", "mlp", "qk_norm", "tie_embeddings", "logit_softcap")
    ] == ["rope", "rmsnorm", False, "relu2", True, False, 30.0]


def test_tensor_parallel_layouts_reproduce_the_1_device_curve_for_a_llama_preset(data_cache):
    """llama-tiny (4 query heads over 2 key/value heads, SwiGLU, untied head) on 1 device and on data=4 x model=2
    with FSDP and accumulation: the same losses, with the new matrices split Megatron's way."""

    def curve(*extra):
        overrides = [o if o != "model=gpt2-tiny" else "model=llama-tiny" for o in tiny_overrides(data_cache, *extra)]
        parts = build(overrides + ["train.max_steps=3"])
        return [float(parts.step(s)["loss"]) for s in range(3)], parts

    reference, _ = curve("system.num_devices=1", "train.batch_size=16")
    losses, parts = curve(
        "system.num_devices=8",
        "system.mesh_model=2",
        "system.sharding=fsdp",
        "train.batch_size=8",
        "train.grad_accum_steps=2",
    )
    # two programs (sharded, accumulated) over 3 adamw steps: sums in other orders, ~1e-6 on losses ~5, grown by the
    # steps (Adam's m/sqrt(v) magnifies rounding in small gradients); 1e-4 as in tests/test_scale_out.py
    np.testing.assert_allclose(losses, reference, atol=1e-4)
    model = parts.state.model
    for array, axis in (
        (model.blocks.qkv.weight, 3),
        (model.blocks.fc.weight, 2),
        (model.blocks.mlp_proj.weight, 1),
        (model.lm_head, 0),
        (model.wte, 0),
    ):
        spec = tuple(array.sharding.spec) + (None,) * array.ndim
        assert spec[axis] == MODEL_AXIS, (array.shape, spec)
        assert array.addressable_shards[0].data.shape[axis] == array.shape[axis] // 2
    assert model.blocks.qkv.weight.shape == (2, 64, 4, 32)  # each device: one key/value head and its 2 query heads


def test_a_gpt2_checkpoint_from_before_the_options_restores(tmp_path):
    """Checkpoints written before the model had optional parameters hold GPT-2's arrays under the same names but no
    entry for the fields a GPT-2 model leaves None (lm_head, q_norm, k_norm): they restore
    (training/checkpoints/checkpointer.py), and a checkpoint of another model still does not."""
    import orbax.checkpoint as ocp

    from core.errors import CheckpointError
    from training.checkpoints.checkpointer import Checkpointer

    model = init(gpt_config(load_config(["model=gpt2-tiny"]).model, 259), jax.random.PRNGKey(0))
    params = dict(jax.tree_util.tree_flatten_with_path(model)[0])
    old = {}  # the old GPT's tree: its arrays, and no None-valued fields the new one has
    for path, x in params.items():
        *parents, name = [k.name for k in path]
        node = old
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = x
    with ocp.CheckpointManager(tmp_path / "old", item_names=("model",)) as manager:
        manager.save(3, args=ocp.args.Composite(model=ocp.args.StandardSave(old)))
    like = jax.tree.map(jnp.zeros_like, model)
    restored = Checkpointer(tmp_path / "old", read_only=True).restore_model(3, like)
    assert restored.lm_head is None and restored.blocks.q_norm is None
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(model)):
        np.testing.assert_array_equal(a, b)
    for other in (LLAMA, dataclasses.replace(model.cfg, bias=False)):  # the second: a subset of its arrays
        like = jax.tree.map(
            lambda a: jnp.zeros(a.shape, a.dtype), eqx.filter_eval_shape(GPT.init, other, jax.random.PRNGKey(0))
        )
        with pytest.raises(CheckpointError, match="its model does not restore"):
            Checkpointer(tmp_path / "old", read_only=True).restore_model(3, like)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.n_kv_head=3"], "model.n_kv_head: 3 must divide model.n_head=2"),
        (
            ["model.position=rope", "model.n_head=8", "model.n_embd=72"],
            "model.position: rope turns pairs of a head's dimensions: the head size n_embd / n_head = 72 / 8 = 9 "
            "must be even",
        ),
        (
            ["model.n_kv_head=1", "system.num_devices=2", "system.mesh_model=2"],
            "system.mesh_model: 2 must divide model.n_kv_head=1",
        ),
    ],
)
def test_a_bad_combination_is_one_config_line_and_exit_2(overrides, message, tmp_path, capsys, data_cache):
    code = train_jax.command_line(tiny_overrides(data_cache, f"logging.run_dir={tmp_path / 'run'}", *overrides))
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [err] and err.startswith(f"error: config: {message}"), err
