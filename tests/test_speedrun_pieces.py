"""The modded-nanogpt speedrun's pieces as model options (models/config.py), each against a NumPy reference of its
math, each leaving the model as it was when off."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import build, tiny_overrides
from models.config import GPTConfig
from models.decode import generate, generate_no_cache
from models.gpt import GPT

BASE = GPTConfig(vocab_size=61, n_layer=4, n_head=2, n_embd=32, context_size=16, bias=False)
hidden = eqx.filter_jit(lambda model, x: model.hidden(x)[0])


def tokens(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 61, shape), jnp.int32)


def blocks_one_by_one(model: GPT, tokens_BT, between) -> np.ndarray:
    """The final norm's output with each block run on its own (the model's Block, layer i's weights), and
    `between(i, x, outputs)` -> the block's input from the last output and every earlier block's output (NumPy)."""
    params, static = eqx.partition(model.blocks, eqx.is_array)
    x = np.asarray(model.wte[tokens_BT] + model.wpe[jnp.arange(tokens_BT.shape[1])])
    outputs, run = [], eqx.filter_jit(lambda block, x: block(x, model.cfg, None)[0])
    for i in range(model.cfg.n_layer):
        block = eqx.combine(jax.tree.map(lambda a: a[i], params), static)
        x = np.asarray(run(block, jnp.asarray(between(i, x, outputs))))
        outputs.append(x)
    return np.asarray(model.ln_f(jnp.asarray(x)))


@pytest.mark.parametrize("n_layer", [4, 5])
@pytest.mark.parametrize("scan", [True, False])
def test_unet_skips_add_the_mirrored_first_half_outputs_with_their_weights(n_layer, scan):
    cfg = dataclasses.replace(BASE, n_layer=n_layer, unet_skips=True, scan_layers=scan)
    model = GPT.init(cfg, jax.random.PRNGKey(0))
    n = n_layer // 2
    assert model.skip_weights.shape == (n,) and np.all(np.asarray(model.skip_weights) == 1.0)  # the speedrun's init
    weights = np.array([0.3, -0.7][:n], np.float32)  # away from 1, so that a weight left out shows
    model = eqx.tree_at(lambda m: m.skip_weights, model, jnp.asarray(weights))

    def between(i, x, outputs):  # block i >= L - n adds w[i - (L - n)] times block (L - 1 - i)'s output
        first_of_last_half = n_layer - n
        return x + weights[i - first_of_last_half] * outputs[n_layer - 1 - i] if i >= first_of_last_half else x

    x = tokens((2, 16))
    reference = blocks_one_by_one(model, x, between)
    np.testing.assert_allclose(hidden(model, x), reference, rtol=1e-5, atol=1e-5)
    plain = blocks_one_by_one(model, x, lambda i, x, outputs: x)
    assert np.abs(reference - plain).max() > 1e-2  # the skips change the output


def test_without_unet_skips_the_model_has_no_skip_weights_and_runs_its_blocks_in_a_row():
    model = GPT.init(BASE, jax.random.PRNGKey(0))
    assert model.skip_weights is None
    x = tokens((2, 16))
    reference = blocks_one_by_one(model, x, lambda i, x, outputs: x)
    np.testing.assert_allclose(hidden(model, x), reference, rtol=1e-5, atol=1e-5)


def test_cached_decoding_with_unet_skips_equals_decoding_without_the_cache():
    cfg = dataclasses.replace(BASE, n_layer=5, unet_skips=True)
    model = jax.tree.map(lambda a: 8.0 * a, GPT.init(cfg, jax.random.PRNGKey(3)))
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 9, 10]]
    cached = generate(model, prompts, 8, temperature=0.0)
    assert cached == generate_no_cache(model, prompts, 8, temperature=0.0)
    assert len({t for row in cached for t in row}) > 3


def test_zero_init_mlp_out_starts_each_block_as_attention_alone_and_the_projection_learns():
    default = GPT.init(BASE, jax.random.PRNGKey(0))
    model = GPT.init(dataclasses.replace(BASE, zero_init_mlp_out=True), jax.random.PRNGKey(0))
    assert np.all(np.asarray(model.blocks.mlp_proj.weight) == 0.0)
    # every other weight starts as the default model's (the same keys draw them)
    leaves = lambda m: jax.tree.leaves(eqx.tree_at(lambda m: m.blocks.mlp_proj.weight, m, 0.0))  # noqa: E731
    for a, b in zip(leaves(default), leaves(model), strict=True):
        np.testing.assert_array_equal(a, b)
    # the MLP adds nothing yet: its first matrix may hold anything
    scrambled = eqx.tree_at(lambda m: m.blocks.fc.weight, model, 5.0 * model.blocks.fc.weight[::-1])
    x = tokens((2, 16))
    np.testing.assert_array_equal(hidden(model, x), hidden(scrambled, x))
    # and the projection's gradient is not zero: it learns
    grads = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.mean(jnp.subtract(*m.loss_terms(x[:, :-1], x[:, 1:])))))(model)
    assert np.abs(np.asarray(grads.blocks.mlp_proj.weight)).max() > 1e-6


def test_the_skip_weights_are_scalars_trained_by_adam_under_muon_without_weight_decay(data_cache):
    parts = build(
        tiny_overrides(data_cache, "model.unet_skips=true", "optimizer=muon", "optimizer.groups.adam.lr_multiplier=5")
    )
    model = parts.state.model
    assert model.parameter_labels().skip_weights == "scalar"
    assert model.weight_decay_mask().skip_weights is False and model.block_matrices_mask().skip_weights is False
    before = np.asarray(model.skip_weights)
    for step in range(3):
        metrics = parts.step(step)
    after = np.asarray(parts.state.model.skip_weights)
    assert np.isfinite(float(metrics["loss"])) and np.abs(after - before).min() > 0


def numpy_block(x, p, n_head, ve=None, gate=None):
    """GPT-2's pre-norm block (no biases) in float64 NumPy, layer weights `p`; with a value embedding `ve` [B, T, D]
    and its gate's weights [N, G]: each head's values add 2 sigmoid(w_n . h[:G]) ve (h the normed input)."""

    def norm(x, w):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * w

    B, T, D = x.shape
    H = D // n_head
    h = norm(x, p["ln1"])
    q, k, v = (np.einsum("btd,de->bte", h, p["qkv"][:, i]).reshape(B, T, n_head, H) for i in range(3))
    if ve is not None:
        g = 2 / (1 + np.exp(-np.einsum("btg,ng->btn", h[..., : gate.shape[-1]], gate)))
        v = v + g[..., None] * ve.reshape(B, T, n_head, H)
    scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    x = x + np.einsum("bnts,bsnh->btnh", weights, v).reshape(B, T, D) @ p["attn_proj"]
    u = norm(x, p["ln2"]) @ p["fc"]
    gelu = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))
    return x + gelu @ p["mlp_proj"]


def numpy_layer_weights(model: GPT, i: int) -> dict:
    b = model.blocks
    pick = lambda a: np.asarray(a[i], np.float64)  # noqa: E731
    return {
        "ln1": pick(b.ln1.weight),
        "qkv": pick(b.qkv.weight),
        "attn_proj": pick(b.attn_proj.weight),
        "ln2": pick(b.ln2.weight),
        "fc": pick(b.fc.weight),
        "mlp_proj": pick(b.mlp_proj.weight),
    }


@pytest.mark.parametrize("n_layer, k", [(4, 2), (5, 1), (4, 0)])
@pytest.mark.parametrize("scan", [True, False])
def test_value_embeddings_are_gated_into_the_values_of_the_first_and_last_k_blocks(n_layer, k, scan):
    cfg = dataclasses.replace(BASE, n_layer=n_layer, value_embeddings=k, scan_layers=scan)
    model = GPT.init(cfg, jax.random.PRNGKey(0))
    if not k:
        assert model.value_embeds is None and model.ve_gates is None
    else:
        assert model.value_embeds.shape == (k, 64, 32) and model.ve_gates.shape == (2 * k, 2, 12)
        assert np.all(np.asarray(model.ve_gates) == 0.0)  # a gate of 2 sigmoid(0) = 1 at the start
        rng = np.random.default_rng(1)  # tables and gates away from their init, so that each shows
        model = eqx.tree_at(
            lambda m: (m.value_embeds, m.ve_gates),
            model,
            (jnp.asarray(rng.normal(0, 0.5, (k, 64, 32)), jnp.float32), jnp.asarray(rng.normal(0, 1, (2 * k, 2, 12)))),
        )
    x = tokens((2, 16))
    tok = np.asarray(x)
    h = np.asarray(model.wte, np.float64)[tok] + np.asarray(model.wpe, np.float64)[:16]
    for i in range(n_layer):
        table = i if i < k else i - (n_layer - k) if i >= n_layer - k else None
        gate = None if table is None else np.asarray(model.ve_gates[table if i < k else k + table], np.float64)
        ve = None if table is None else np.asarray(model.value_embeds[table], np.float64)[tok]
        h = numpy_block(h, numpy_layer_weights(model, i), 2, ve, gate)
    w = np.asarray(model.ln_f.weight, np.float64)
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(hidden(model, x), want, rtol=1e-4, atol=1e-4)  # float32 against float64


@pytest.mark.parametrize("n_kv_head", [None, 1])
def test_cached_decoding_with_value_embeddings_equals_decoding_without_the_cache(n_kv_head):
    """Also under grouped-query attention, where the values (and so the tables) are one key/value head wide."""
    cfg = dataclasses.replace(BASE, n_layer=4, value_embeddings=2, unet_skips=True, n_kv_head=n_kv_head)
    model = jax.tree.map(lambda a: 8.0 * a, GPT.init(cfg, jax.random.PRNGKey(3)))
    assert model.value_embeds.shape == (2, 64, 16 if n_kv_head else 32)
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 9, 10]]
    cached = generate(model, prompts, 8, temperature=0.0)
    assert cached == generate_no_cache(model, prompts, 8, temperature=0.0)


def test_value_embeddings_are_embeddings_to_the_optimizer_and_lookups_to_the_flops():
    from models.gpt import matmul_params

    plain = GPT.init(BASE, jax.random.PRNGKey(0))
    model = GPT.init(dataclasses.replace(BASE, value_embeddings=2), jax.random.PRNGKey(0))
    labels, decayed = model.parameter_labels(), model.weight_decay_mask()
    assert (labels.value_embeds, labels.ve_gates) == ("value_embedding", "scalar")
    assert decayed.value_embeds is True and decayed.ve_gates is False
    assert model.block_matrices_mask().value_embeds is False
    assert matmul_params(model) == matmul_params(plain) + 4 * 2 * 12  # the gates multiply; the tables are looked up


def test_too_many_value_embedding_tables_are_one_line():
    from core.errors import ConfigError
    from training.config import load_config

    with pytest.raises(ConfigError, match=r"model.value_embeddings: .* needs 0 <= 2 k <= n_layer=2; got 2"):
        load_config(["model=gpt2-tiny", "model.value_embeddings=2"])


def test_half_truncated_rope_turns_a_quarter_of_the_pairs_by_the_speedruns_frequencies():
    from models.rope import apply_rotary, rotary_angles

    positions = jnp.arange(12)
    cos, sin = rotary_angles(positions, 16, 1024.0, "half_truncated")
    frequencies = np.concatenate([(1 / 1024) ** np.linspace(0, 1, 4), np.zeros(4)])  # the speedrun's Rotary
    angles = np.arange(12)[:, None] * frequencies
    np.testing.assert_allclose(cos[:, 0], np.cos(angles), atol=1e-6)
    np.testing.assert_allclose(sin[:, 0], np.sin(angles), atol=1e-6)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 12, 3, 16)), jnp.float32)
    turned = np.asarray(apply_rotary(x, cos, sin))
    untouched = np.r_[4:8, 12:16]  # pairs 4..7: dimension i of each half, i >= H/4
    np.testing.assert_array_equal(turned[..., untouched], np.asarray(x)[..., untouched])
    assert np.abs(turned[:, 1:, :, :4] - np.asarray(x)[:, 1:, :, :4]).min() > 0  # the first quarter turns
    standard = np.asarray(apply_rotary(x, *rotary_angles(positions, 16, 1024.0)))
    assert np.abs(standard[..., untouched] - np.asarray(x)[..., untouched]).max() > 1e-2


@pytest.mark.parametrize("form", ["tanh", "algebraic", "sigmoid"])
def test_each_soft_cap_form_bounds_the_logits_and_the_chunked_head_follows_it(form):
    from models.lm_head import chunked_log_z_and_target_logit, log_z_and_target_logit, masked_logits

    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.standard_normal((2, 8, 16)) * 4, jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 61, (2, 8)))
    raw = np.einsum("btd,vd->btv", np.asarray(h, np.float64), np.asarray(w, np.float64))
    capped = {
        "tanh": 5 * np.tanh(raw / 5),
        "algebraic": 5 * raw / np.sqrt(raw**2 + 25),
        "sigmoid": 5 / (1 + np.exp(-(raw + 5) / 7.5)),
    }[form]
    logits = np.asarray(masked_logits(h, w, 61, 5.0, form))
    np.testing.assert_allclose(logits[..., :61], capped[..., :61], rtol=1e-5, atol=1e-5)
    assert np.abs(logits[..., :61]).max() < 5 < np.abs(raw).max()
    assert (logits[..., :61].min() > 0) == (form == "sigmoid")

    def dense(h, w):
        log_z, target = log_z_and_target_logit(masked_logits(h, w, 61, 5.0, form), targets)
        return jnp.mean(log_z - target)

    def chunked(h, w):
        log_z, target = chunked_log_z_and_target_logit(h, w, targets, 61, 4, 5.0, form)
        return jnp.mean(log_z - target)

    (loss, grads), (loss_c, grads_c) = (jax.value_and_grad(f, (0, 1))(h, w) for f in (dense, chunked))
    assert float(loss_c) == pytest.approx(float(loss), rel=1e-6)
    for g, g_c in zip(grads, grads_c, strict=True):
        np.testing.assert_allclose(g_c, g, rtol=1e-5, atol=1e-7)


SPEEDRUN_MUON = [
    "optimizer=muon",
    "optimizer.orthogonalizer=polar_express",
    "optimizer.normuon_beta2=0.95",
    "optimizer.cautious_weight_decay=true",
    "optimizer.momentum_warmup=0.5",
    "optimizer.momentum_cooldown=0.25",  # the run's last quarter: the pipeline gives Muon the run's length
]


def test_the_speedrun_micro_preset_trains_with_the_speedruns_muon(data_cache):
    overrides = tiny_overrides(data_cache, "model.context_size=64", "train.batch_size=4", *SPEEDRUN_MUON)
    overrides[0] = "model=speedrun-micro"
    parts = build(overrides)
    model = parts.state.model
    cfg = model.cfg
    assert (cfg.unet_skips, cfg.value_embeddings, cfg.zero_init_mlp_out, cfg.rope_frequencies) == (
        True,
        1,
        True,
        "half_truncated",
    )
    assert model.skip_weights.shape == (2,) and model.value_embeds.shape[0] == 1
    losses = [float(parts.step(step)["loss"]) for step in range(6)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.1


def smeared(model: GPT, tok: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The smear gate in NumPy: x_t + lambda sigmoid(w . x_t[:G]) x_{t-1} on the token embeddings, nothing where
    `starts` (a sequence's or a document's first token)."""
    x = np.asarray(model.wte, np.float64)[tok]
    w, lam = np.asarray(model.smear[:-1], np.float64), float(model.smear[-1])
    gate = lam / (1 + np.exp(-(x[..., : len(w)] @ w)))
    previous = np.concatenate([x[:, :1], x[:, :-1]], axis=1)
    return x + np.where(starts[..., None], 0.0, gate[..., None] * previous)


def with_smear(seed=0, **options) -> GPT:
    model = GPT.init(dataclasses.replace(BASE, smear_gate=True, **options), jax.random.PRNGKey(0))
    assert np.all(np.asarray(model.smear) == 0.0) and model.smear.shape == (13,)  # 12 channels' w, then lambda
    rng = np.random.default_rng(seed)
    return eqx.tree_at(lambda m: m.smear, model, jnp.asarray(rng.normal(0, 1, 13), jnp.float32))


def test_the_smear_gate_adds_a_gated_share_of_the_previous_tokens_embedding():
    model = with_smear()
    x = tokens((2, 16))
    tok = np.asarray(x)
    starts = np.zeros((2, 16), bool)
    starts[:, 0] = True
    embedded = smeared(model, tok, starts) + np.asarray(model.wpe, np.float64)[:16]
    params, static = eqx.partition(model.blocks, eqx.is_array)
    h = embedded
    for i in range(model.cfg.n_layer):
        block = eqx.combine(jax.tree.map(lambda a: a[i], params), static)
        h = np.asarray(block(jnp.asarray(h, jnp.float32), model.cfg, None)[0], np.float64)
    np.testing.assert_allclose(hidden(model, x), np.asarray(model.ln_f(jnp.asarray(h, jnp.float32))), atol=1e-4)
    plain = eqx.tree_at(lambda m: m.smear, model, jnp.zeros(13))  # lambda 0: the embeddings alone
    assert np.abs(np.asarray(hidden(plain, x)) - np.asarray(hidden(model, x))).max() > 1e-3


def test_the_smear_gate_looks_back_within_a_document_only():
    model = with_smear(position="rope", scan_layers=True)
    x = tokens((1, 16))
    segments = jnp.asarray([[0] * 5 + [1] * 11])
    got = np.asarray(eqx.filter_jit(lambda m, x, s: m.hidden(x, segment_ids_BT=s)[0])(model, x, segments))
    # the second document alone, from its own start, gives the same hidden states as inside the packed row
    alone = np.asarray(hidden(model, x[:, 5:]))
    np.testing.assert_allclose(got[:, 5:], alone, atol=1e-5)


def test_cached_decoding_with_the_smear_gate_equals_decoding_without_the_cache():
    model = jax.tree.map(lambda a: 8.0 * a, with_smear(seed=3, n_layer=2))
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 9, 10]]
    cached = generate(model, prompts, 8, temperature=0.0)
    assert cached == generate_no_cache(model, prompts, 8, temperature=0.0)
    assert model.parameter_labels().smear == "scalar" and model.weight_decay_mask().smear is False


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["model=gpt2-tiny", "model.unet_skips=true", "model.n_layer=1"], "model.unet_skips: joins the first half's"),
        (
            ["model=llama-tiny", "model.rope_frequencies=half_truncated", "model.n_embd=72", "model.n_head=4"],
            "model.rope_frequencies: half_truncated turns a quarter of a head's dimensions in pairs: the head size 18",
        ),
        (["model=gpt2-tiny", "model.attention_scale=0"], r"model.attention_scale: must be > 0 or null"),
        (
            ["model=gpt2-tiny", "model.attention_scale=0.12", "model.parametrization=mup"],
            "model.attention_scale: parametrization=mup scales the scores",
        ),
    ],
)
def test_speedrun_options_that_cannot_work_are_one_line(overrides, line):
    from core.errors import ConfigError
    from training.config import load_config

    with pytest.raises(ConfigError, match=line):
        load_config(overrides)


def test_muons_speedrun_knobs_refuse_what_they_cannot_do():
    from core.errors import ConfigError
    from optimizers import OPTIMIZERS

    model = GPT.init(BASE, jax.random.PRNGKey(0))
    hyper = dict(momentum=0.95, nesterov=True, beta1=0.9, beta2=0.95, weight_decay=0.1)
    with pytest.raises(ConfigError, match=r"optimizer.normuon_beta2: must be in \[0, 1\) or null \(off\); got 1.5"):
        OPTIMIZERS["muon"](model, normuon_beta2=1.5, **hyper)
    with pytest.raises(ConfigError, match="optimizer.orthogonalize_embeddings: NorMuon and cautious weight decay"):
        OPTIMIZERS["muon"](model, cautious_weight_decay=True, orthogonalize_embeddings=True, **hyper)
    with pytest.raises(ConfigError, match="optimizer.momentum_warmup, momentum_start: .* got 10, 1.0"):
        OPTIMIZERS["muon"](model, momentum_warmup=10, momentum_start=1.0, **hyper)


@pytest.mark.parametrize("scale", [0.12, 0.5])
def test_attention_scale_multiplies_the_scores_as_scaled_queries_would(scale):
    """Scores q.k times `scale` instead of 1/sqrt(head size): the same as the default model with its query weights
    times scale sqrt(head size) (the optimization track's fixed 0.12)."""
    cfg = dataclasses.replace(BASE, position="rope", norm="rmsnorm", qk_norm=True)
    model = GPT.init(dataclasses.replace(cfg, attention_scale=scale), jax.random.PRNGKey(0))
    factor = scale * np.sqrt(cfg.head_dim)
    # QK-norm normalises the queries after their matmul: scale them after it, through the norm's weight
    scaled = eqx.tree_at(lambda m: m.blocks.q_norm.weight, model, model.blocks.q_norm.weight * factor)
    default = dataclasses.replace(scaled, cfg=cfg)
    x = tokens((2, 16))
    np.testing.assert_allclose(hidden(model, x), hidden(default, x), rtol=2e-5, atol=2e-5)
    unscaled = dataclasses.replace(model, cfg=cfg)  # the same weights at 1/sqrt(head size)
    assert np.abs(np.asarray(hidden(model, x)) - np.asarray(hidden(unscaled, x))).max() > 1e-3


def test_qk_norm_weight_false_leaves_querys_and_keys_norms_without_gains():
    cfg = dataclasses.replace(BASE, position="rope", norm="rmsnorm", qk_norm=True)
    with_gains = GPT.init(cfg, jax.random.PRNGKey(0))
    without = GPT.init(dataclasses.replace(cfg, qk_norm_weight=False), jax.random.PRNGKey(0))
    assert with_gains.blocks.q_norm.weight.shape == (cfg.n_layer, cfg.head_dim)
    assert without.blocks.q_norm.weight is None and without.blocks.k_norm.weight is None
    assert without.blocks.ln1.weight is not None  # the blocks' own norms keep theirs (model.norm_weight)
    x = tokens((2, 16))
    np.testing.assert_array_equal(hidden(with_gains, x), hidden(without, x))  # gains of 1 at init: the same model
    nudged = eqx.tree_at(lambda m: m.blocks.k_norm.weight, with_gains, with_gains.blocks.k_norm.weight * 1.5)
    assert np.abs(np.asarray(hidden(nudged, x)) - np.asarray(hidden(without, x))).max() > 1e-3
    # null follows model.norm_weight
    bare = GPT.init(dataclasses.replace(cfg, norm_weight=False), jax.random.PRNGKey(0))
    assert bare.blocks.q_norm.weight is None and bare.blocks.ln1.weight is None


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_embedding_norm_normalises_the_embeddings_before_the_first_block(norm):
    cfg = dataclasses.replace(BASE, norm=norm, embedding_norm=True)
    model = GPT.init(cfg, jax.random.PRNGKey(0))
    gains = np.linspace(0.5, 1.5, cfg.n_embd, dtype=np.float32)  # away from 1, so that a gain left out shows
    model = eqx.tree_at(lambda m: m.ln_e.weight, model, jnp.asarray(gains))

    def normed(x):  # NumPy's LayerNorm / RMSNorm over the channels, eps 1e-5, times the gains
        x = x.astype(np.float64)
        if norm == "layernorm":
            x = x - x.mean(-1, keepdims=True)
        return (x / np.sqrt(np.square(x).mean(-1, keepdims=True) + 1e-5) * gains).astype(np.float32)

    x = tokens((2, 16))
    reference = blocks_one_by_one(model, x, lambda i, x, outputs: normed(x) if i == 0 else x)
    np.testing.assert_allclose(hidden(model, x), reference, rtol=1e-5, atol=1e-5)
    plain = GPT.init(dataclasses.replace(cfg, embedding_norm=False), jax.random.PRNGKey(0))
    assert plain.ln_e is None
    assert np.abs(np.asarray(hidden(plain, x)) - reference).max() > 1e-2


@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_head_bias_adds_to_every_logit_and_both_heads_give_its_gradient(softcap):
    from models.lm_head import chunked_log_z_and_target_logit, log_z_and_target_logit, masked_logits

    rng = np.random.default_rng(1)
    h = jnp.asarray(rng.standard_normal((2, 8, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
    b = jnp.asarray(rng.standard_normal(64) * 2, jnp.float32)
    targets = jnp.asarray(rng.integers(0, 61, (2, 8)))
    raw = np.einsum("btd,vd->btv", np.asarray(h, np.float64), np.asarray(w, np.float64)) + np.asarray(b)
    capped = 5 * np.tanh(raw / 5) if softcap else raw
    logits = np.asarray(masked_logits(h, w, 61, softcap, "tanh", b))
    np.testing.assert_allclose(logits[..., :61], capped[..., :61], rtol=1e-5, atol=1e-5)
    # NumPy's gradient of the mean cross-entropy with respect to the bias: (softmax - onehot) / N through the cap
    real = capped[..., :61]
    probs = np.exp(real - real.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    d_real = (probs - np.eye(61)[np.asarray(targets)]) / targets.size
    d_raw = d_real * ((1 - np.tanh(raw[..., :61] / 5) ** 2) if softcap else 1.0)
    expected_db = np.r_[d_raw.sum((0, 1)), np.zeros(3)]  # padded rows: no gradient

    def dense(h, w, b):
        log_z, target = log_z_and_target_logit(masked_logits(h, w, 61, softcap, "tanh", b), targets)
        return jnp.mean(log_z - target)

    def chunked(h, w, b):
        log_z, target = chunked_log_z_and_target_logit(h, w, targets, 61, 4, softcap, "tanh", b)
        return jnp.mean(log_z - target)

    (loss, grads), (loss_c, grads_c) = (jax.value_and_grad(f, (0, 1, 2))(h, w, b) for f in (dense, chunked))
    np.testing.assert_allclose(grads[2], expected_db, rtol=1e-4, atol=1e-7)
    assert float(loss_c) == pytest.approx(float(loss), rel=1e-6)
    for g, g_c in zip(grads, grads_c, strict=True):
        np.testing.assert_allclose(g_c, g, rtol=1e-5, atol=1e-7)


def test_a_head_bias_starts_at_zero_is_labelled_bias_and_is_not_decayed():
    cfg = dataclasses.replace(BASE, tie_embeddings=False, head_bias=True)
    model = GPT.init(cfg, jax.random.PRNGKey(0))
    assert model.lm_bias.shape == (cfg.padded_vocab_size,) and not np.any(np.asarray(model.lm_bias))
    assert model.parameter_labels().lm_bias == "bias" and model.weight_decay_mask().lm_bias is False
    plain = GPT.init(dataclasses.replace(cfg, head_bias=False), jax.random.PRNGKey(0))
    x = tokens((2, 16))
    np.testing.assert_array_equal(model(x), plain(x))  # a bias of zeros: the same logits
    moved = eqx.tree_at(lambda m: m.lm_bias, model, jnp.arange(cfg.padded_vocab_size, dtype=jnp.float32))
    np.testing.assert_allclose(
        moved(x)[..., :61] - plain(x)[..., :61], np.broadcast_to(np.arange(61.0), (2, 16, 61)), atol=1e-3
    )


def test_the_optimization_tracks_model_composes_and_trains(data_cache):
    """conf/model/opt-track-micro.yaml (the track's choices at gpt2-micro's size), shrunk to 2 layers: what it
    builds, and its train loss falls under AdamW."""
    overrides = tiny_overrides(data_cache, "model.n_layer=2", "model.context_size=64", "train.batch_size=4")
    overrides[0] = "model=opt-track-micro"
    parts = build(overrides)
    model = parts.state.model
    assert model.cfg.attention_scale == 0.12 and model.cfg.logit_softcap_form == "algebraic"
    assert model.ln_e is not None and model.lm_bias is not None and model.lm_head is not None
    assert model.blocks.q_norm.weight is None and model.blocks.ln1.weight is not None
    assert model.blocks.qkv.bias is not None and model.wpe is None
    losses = [float(parts.step(i)["loss"]) for i in range(8)]
    assert losses[-1] < losses[0] - 0.3, losses


def value_table_steps(name: str, table1_seed: int | None, steps: int = 4) -> jax.Array:
    """The value embeddings' tables after `steps` steps of `name` on random gradients; with `table1_seed`, table 1's
    drawn from that seed instead, 30 times larger (no clipping, no decay: nothing else couples the tables)."""
    from optimizers import build_optimizer, build_schedule
    from training.config import load_config

    model = GPT.init(dataclasses.replace(BASE, n_layer=4, value_embeddings=2), jax.random.PRNGKey(0))
    cfg = load_config(
        [f"optimizer={name}", "optimizer/lr_config=constant", "optimizer.grad_clip=0", "optimizer.weight_decay=0"]
    )
    opt = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 100), model, 1)

    def run(params):
        state = opt.init(params)
        for t in range(steps):
            leaves, tree = jax.tree.flatten(params)
            keys = jax.random.split(jax.random.PRNGKey(t), len(leaves))
            grads = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
            if table1_seed is not None:
                other = 30 * jax.random.normal(
                    jax.random.PRNGKey(1000 * table1_seed + t), params.value_embeds.shape[1:]
                )
                grads = eqx.tree_at(lambda g: g.value_embeds, grads, grads.value_embeds.at[1].set(other))
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        return params.value_embeds

    return jax.jit(run)(eqx.filter(model, eqx.is_array))


@pytest.mark.parametrize("name", ["soap", "kron", "mars", "adam_mini"])
def test_each_value_embedding_table_is_a_tensor_of_its_own_to_optimizers_that_treat_tensors_whole(name):
    """The tables [k, V, D] are k embeddings (the speedrun's are k nn.Embedding modules): SOAP's and Kron's
    preconditioners, MARS's clipping norm and Adam-mini's blocks are per table, so one table's gradient does not
    change another's steps (they took the k tables as one [k, V x D] matrix, one norm, one block)."""
    before = GPT.init(dataclasses.replace(BASE, n_layer=4, value_embeddings=2), jax.random.PRNGKey(0)).value_embeds
    same, other = value_table_steps(name, None), value_table_steps(name, 1)
    assert float(jnp.max(jnp.abs(same[0] - before[0]))) > 1e-4  # table 0 moved
    assert not np.allclose(other[1], same[1], rtol=1e-5, atol=1e-6)  # table 1 took other steps
    np.testing.assert_allclose(other[0], same[0], rtol=1e-5, atol=1e-6)


def test_scion_steps_the_value_embedding_tables_as_input_layers():
    """Each table's rows by their RMS at the input layers' radius (scale_input), as wpe's: not the vectors'."""
    from optimizers import build_optimizer, build_schedule
    from training.config import load_config

    model = GPT.init(dataclasses.replace(BASE, n_layer=4, value_embeddings=2), jax.random.PRNGKey(0))
    cfg = load_config(["optimizer=scion", "optimizer/lr_config=constant", "optimizer.lr_config.warmup=0"])
    opt = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 100), model, 1)
    params = eqx.tree_at(lambda p: p.value_embeds, eqx.filter(model, eqx.is_array), jnp.zeros((2, 64, 32)))
    grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params)
    updates, _ = opt.update(grads, opt.init(params), params)
    row_rms = jnp.sqrt(jnp.mean(jnp.square(updates.value_embeds), axis=-1))
    lr, o = cfg.optimizer.lr_config.lr, cfg.optimizer
    assert o.scale_input != o.scale_vector
    np.testing.assert_allclose(row_rms, lr * o.scale_input, rtol=1e-4)
