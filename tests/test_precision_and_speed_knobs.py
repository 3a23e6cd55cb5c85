"""Mixed precision, float16 loss scaling, skipped steps, remat / scanned layers, attention choice and the MFU
formula."""

import collections
import dataclasses
import os
import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_jax
from core.errors import ConfigError
from helpers import build, run_cli, tiny_overrides
from models import gpt_config
from models.config import GPTConfig
from models.gpt import GPT
from training.config import load_config
from training.distributed.sharding import put_batch
from training.reporting.flops import flops_per_token, mfu, peak_flops
from training.step.losses import mean_loss
from training.step.precision import SCALE_PERIOD, LossScale
from training.step.stats import statistics_of

STEPS = 20
# Stated tolerances: mean absolute difference from the float32 curve over 20 steps of the tiny model.
TOLERANCE = {"bfloat16": 0.03, "float16": 0.01}


def matmul_operand_types(parts) -> list[set[str]]:
    """The element types of each matmul's operands in the train step as lowered for XLA."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lowering alone reports the donated buffers as unused
        text = parts.train_step.lower(parts.state, put_batch(parts.data.train.batch(0), parts.mesh)).as_text()
    return [
        set(re.findall(r"x([a-z]+[0-9]*)>", line.split(" : (", 1)[1].split(") ->")[0]))
        for line in text.splitlines()
        if "stablehlo.dot_general" in line
    ]


@pytest.fixture(scope="module")
def float32_run(data_cache):
    """The tiny run at its defaults in float32: each step's loss and gradient norm, and the attention `auto` chose."""
    parts = build(tiny_overrides(data_cache, f"train.max_steps={STEPS}"))
    assert all(types == {"f32"} for types in matmul_operand_types(parts))
    curve = np.array([[float(m["loss"]), float(m["grad_norm"])] for m in map(parts.step, range(STEPS))])
    return curve, parts.state.model.cfg.attention


@pytest.fixture(scope="module")
def float32_curve(float32_run):
    return list(float32_run[0][:, 0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_compute_tracks_the_float32_curve(dtype, float32_curve, data_cache):
    parts = build(tiny_overrides(data_cache, f"train.max_steps={STEPS}", f"system.dtype={dtype}"))
    curve = [float(parts.step(s)["loss"]) for s in range(STEPS)]
    assert np.mean(np.abs(np.array(curve) - np.array(float32_curve))) < TOLERANCE[dtype]
    assert curve[-1] < curve[0] - 0.5
    assert parts.state.model.wte.dtype == jnp.float32  # master weights stay float32
    moments = [x for x in jax.tree.leaves(parts.state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert moments and all(x.dtype == jnp.float32 for x in moments)
    # ... while the step's matmuls run in the compute dtype. On a GPU every one does: attention is cuDNN's kernel (no
    # matmul of the program), and the LM head's gradient is rounded to the compute dtype before its two matmuls. On a
    # CPU, XLA's attention multiplies its float32 probabilities in float32 (and float16 goes through float32 there).
    operand_types = matmul_operand_types(parts)
    short = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    if jax.default_backend() == "gpu":
        assert all(types == {short} for types in operand_types), operand_types
    else:
        assert sum(types == {short} for types in operand_types) >= len(operand_types) // 2, operand_types
        assert {"f32"} in operand_types, operand_types


def unchanged(a, b):
    return all(
        np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        for x, y in zip(jax.tree.leaves(eqx.filter(a, eqx.is_array)), jax.tree.leaves(eqx.filter(b, eqx.is_array)))
    )


@pytest.mark.gpu
def test_float16_overflow_halves_the_scale_and_skips_the_step(data_cache):
    parts = build(tiny_overrides(data_cache, "system.dtype=float16"))
    assert float(parts.state.loss_scale.scale) == 2.0**15
    parts.step(0)
    # Inject an overflow: a loss scale so large that the scaled loss is Inf.
    parts.state = eqx.tree_at(lambda s: s.loss_scale.scale, parts.state, jnp.asarray(3e38, jnp.float32))
    before = jax.device_get((parts.state.model, parts.state.opt_state))
    metrics = parts.step(1)
    assert float(metrics["loss_scale"]) == pytest.approx(1.5e38)  # float32's 1.5e38: 6e-8 off float64's
    assert int(metrics["skipped_steps"]) == 1 and int(parts.state.step) == 2
    assert unchanged(before, (parts.state.model, parts.state.opt_state))
    # the step says it was skipped, and reports no gradient norm (the state's is the last applied step's)
    assert not bool(metrics["applied"]) and np.isnan(float(metrics["grad_norm"]))
    assert "applied" not in statistics_of(metrics)  # a step's flag, not a training statistic logged per interval
    parts.state = eqx.tree_at(lambda s: s.loss_scale.scale, parts.state, jnp.asarray(2.0**15, jnp.float32))
    metrics = parts.step(2)  # with a sane scale again, the next step updates
    assert int(metrics["skipped_steps"]) == 1 and bool(metrics["applied"]) and float(metrics["grad_norm"]) > 0
    assert not unchanged(before[0], parts.state.model)


def test_the_logged_loss_leaves_out_skipped_steps():
    """A skipped step can have a finite loss (its gradient was not finite): the interval's loss is the applied
    steps' token-weighted mean; a run without the guard reports no `applied` and every finite step counts."""
    from training.loop.session import _token_weighted

    rows = [{"loss": 2.0, "target_tokens": 10}, {"loss": 4.0, "target_tokens": 30}]
    assert _token_weighted(rows, "loss") == 3.5
    guarded = [{**rows[0], "applied": True}, {**rows[1], "applied": False}, {"loss": 8.0, "target_tokens": 10}]
    assert _token_weighted(guarded, "loss") == 5.0  # (2 x 10 + 8 x 10) / 20; with the skipped step: 4.4


@pytest.mark.gpu
def test_skip_nonfinite_skips_a_nan_step_in_float32(data_cache):
    parts = build(tiny_overrides(data_cache, "train.skip_nonfinite=true"))
    before = jax.device_get((parts.state.model, parts.state.opt_state))
    batch = parts.data.train.batch(0)
    batch["loss_mask"][0, 0, 0] = np.nan
    parts.state, metrics = parts.train_step(parts.state, put_batch(batch, parts.mesh))
    assert int(metrics["skipped_steps"]) == 1 and float(metrics["loss_scale"]) == 1.0
    assert unchanged(before, (parts.state.model, parts.state.opt_state))


def test_loss_scale_doubles_after_a_period_of_finite_steps():
    scale = LossScale.create(jnp.float16)
    scale = LossScale(scale.scale, jnp.asarray(SCALE_PERIOD - 2, jnp.int32), scale.skipped)
    scale = scale.after_step(jnp.asarray(True), dynamic=True)
    assert float(scale.scale) == 2.0**15 and int(scale.good_steps) == SCALE_PERIOD - 1
    scale = scale.after_step(jnp.asarray(True), dynamic=True)
    assert float(scale.scale) == 2.0**16 and int(scale.good_steps) == 0


# The plain model: layers unrolled in Python, nothing recomputed in the backward pass.
PLAIN = GPTConfig(vocab_size=259, n_layer=3, n_head=2, n_embd=32, context_size=32, scan_layers=False, remat="none")


def knobs_batch():
    x = jnp.asarray(np.random.default_rng(0).integers(0, 259, (4, 33)), jnp.int32)
    return {"inputs": x[:, :-1], "targets": x[:, 1:], "loss_mask": jnp.ones((4, 32))}


def traced_ops(cfg: GPTConfig) -> collections.Counter:
    """How often each primitive occurs in the loss-and-gradient computation (scan bodies and remat regions
    included): what the compiler is asked to run."""
    params, static = eqx.partition(GPT.init(cfg, jax.random.PRNGKey(0)), eqx.is_array)
    jaxpr = jax.make_jaxpr(
        jax.value_and_grad(lambda p: mean_loss(eqx.combine(p, static), knobs_batch(), None, jnp.float32))
    )(params)
    counts: collections.Counter = collections.Counter()

    def walk(j):
        for eqn in j.eqns:
            counts[eqn.primitive.name] += 1
            for value in eqn.params.values():
                for sub in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
                        walk(getattr(sub, "jaxpr", sub))

    walk(jaxpr.jaxpr)
    return counts


VALUE_AND_GRAD = eqx.filter_jit(eqx.filter_value_and_grad(mean_loss))


@pytest.fixture(scope="module")
def plain_loss_and_grads():
    """The plain model's loss and gradients on `knobs_batch`, computed once for every variant compared with them."""
    with jax.default_matmul_precision("float32"):  # as `float32_matmuls` gives each test
        return VALUE_AND_GRAD(GPT.init(PLAIN, jax.random.PRNGKey(0)), knobs_batch(), None, jnp.float32)


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
@pytest.mark.parametrize(
    "scan,remat", [(s, r) for s in (True, False) for r in ("none", "block", "full") if (s, r) != (False, "none")]
)
def test_remat_and_scanned_layers_give_the_plain_models_loss_and_gradients(scan, remat, plain_loss_and_grads):
    variant = dataclasses.replace(PLAIN, scan_layers=scan, remat=remat)
    loss_a, grads_a = plain_loss_and_grads
    loss_b, grads_b = VALUE_AND_GRAD(GPT.init(variant, jax.random.PRNGKey(0)), knobs_batch(), None, jnp.float32)
    # two programs (scan/remat, plain): a loss ~5 a few ulp off (~1e-6), gradients < 1 by ~1e-7: 1e-5 for both
    assert abs(float(loss_a) - float(loss_b)) <= 1e-5
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    assert (traced_ops(variant)["scan"] > 0) == scan  # the layers really run under lax.scan (or really unrolled)


@pytest.mark.parametrize("scan", [True, False])
def test_remat_recomputes_matmuls_in_the_backward_pass(scan):
    """`block` recomputes the attention's batched matmuls (it keeps the other matmuls' outputs), `full` every matmul
    the backward pass needs: the gradient's computation holds more matmuls than without remat, and more for `full`."""
    matmuls = {
        remat: traced_ops(dataclasses.replace(PLAIN, scan_layers=scan, remat=remat))["dot_general"]
        for remat in ("none", "block", "full")
    }
    assert matmuls["none"] < matmuls["block"] < matmuls["full"], matmuls


@pytest.mark.parametrize("scan", [True, False])
def test_the_gradient_gathers_layers_and_qkv_by_concatenation_not_by_adding_padded_copies(scan):
    """The stacked layers are split once per step (unrolled) and QKV's output once per block: the gradient's
    computation concatenates their pieces back; indexing them would pad each piece with zeros to the whole and add the
    copies up (n_layer full-size copies of every weight gradient; 3 of each block's QKV gradient)."""
    ops = traced_ops(dataclasses.replace(PLAIN, scan_layers=scan))
    assert ops["pad"] == 0 and ops["concatenate"] >= (1 if scan else PLAIN.n_layer), ops


def test_mfu_formula_matches_a_hand_count_for_gpt2_124m_under_both_conventions():
    cfg = load_config(["model=gpt2"])
    model = eqx.filter_eval_shape(GPT.init, gpt_config(cfg.model, 50257), jax.random.PRNGKey(0))
    d, L, T, V = 768, 12, 1024, 50304
    per_layer = 4 * d * d + 4 * d + 8 * d * d + 5 * d + 4 * d  # qkv+proj, fc+proj (weights+biases), two LayerNorms
    n = V * d + L * per_layer + 2 * d  # token embedding (= head) + blocks + final LayerNorm; no position embedding
    assert flops_per_token(model, T) == flops_per_token(model, T, "palm") == 6 * n + 12 * L * d * T
    assert flops_per_token(model, T, "llmc") == 6 * n + 6 * L * d * T
    assert flops_per_token(model, T, "llmc") == pytest.approx(
        6 * 124.4e6 - 6 * 1024 * 768 + 6 * 12 * 768 * 1024, rel=2e-3
    )
    h100 = peak_flops("NVIDIA H100 80GB HBM3", "bfloat16")
    assert h100 == 989e12 and peak_flops("cpu", "float32") is None and peak_flops("cpu", "float32", 1e12) == 1e12
    assert mfu(100_000, 6 * n + 12 * L * d * T, h100, 2) == pytest.approx(100_000 * (6 * n + 12 * L * d * T) / 1978e12)
    assert mfu(100_000, 1, None, 1) is None and mfu(float("nan"), 1, h100, 1) is None


def test_cudnn_attention_on_cpu_is_one_clear_line(tmp_path, capsys, data_cache):
    code = train_jax.command_line(
        tiny_overrides(data_cache, "model.attention=cudnn", f"logging.run_dir={tmp_path}/run")
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0] == (
        "error: config: model.attention: cudnn is not available (the backend is cpu); use model.attention=auto or xla"
    )


@pytest.mark.gpu
def test_auto_attention_picks_the_backends_kernel_and_the_step_runs_it(data_cache):
    """`auto` at 16-bit compute: cuDNN's fused attention on a GPU (its custom call in the compiled step), the causal-
    blocked kernel on a CPU."""
    parts = build(tiny_overrides(data_cache, "model.attention=auto", "system.dtype=bfloat16"))
    gpu = jax.default_backend() == "gpu"
    assert parts.state.model.cfg.attention == ("cudnn" if gpu else "blocked")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lowering alone reports the donated buffers as unused
        compiled = parts.train_step.lower(parts.state, put_batch(parts.data.train.batch(0), parts.mesh)).compile()
    assert ("__cudnn$fmha" in compiled.as_text()) == gpu
    assert float(parts.step(0)["loss"]) == pytest.approx(np.log(259), rel=0.05)  # it runs: the loss at init


def test_where_cudnns_attention_fails_auto_takes_xlas_and_cudnn_is_one_line(monkeypatch):
    """On a GPU whose cuDNN attention fails (forward or backward, as the probe runs them), `auto` takes XLA's
    attention and `cudnn` is one line naming the failure. Here the failure is real: a CPU backend called a GPU,
    where cuDNN's kernel cannot run."""
    import models

    # The probe runs its attention, also where the model is built under a trace (eval_shape: a trained model's
    # abstract shapes), since a GPU's failure comes when the program runs: here, an attention that fails only then.
    def fails_when_run(q, *_, **__):
        jax.debug.callback(lambda: (_ for _ in ()).throw(RuntimeError("fails when it runs")))
        return q * 1.0

    with monkeypatch.context() as patch:
        patch.setattr(jax.nn, "dot_product_attention", fails_when_run)
        failure = eqx.filter_eval_shape(lambda: models.auto._cudnn_attention_failure("bfloat16") or "")
    assert failure == "cuDNN's bfloat16 attention fails here: RuntimeError: fails when it runs"
    monkeypatch.setattr(models.jax, "default_backend", lambda: "gpu")
    models.auto._resolve_attention.cache_clear()
    try:
        assert models.resolve_attention("auto", "bfloat16") == "xla"
        with pytest.raises(ConfigError) as e:
            models.resolve_attention("cudnn", "fp8")
    finally:
        models.auto._resolve_attention.cache_clear()
    assert "\n" not in str(e.value)
    assert re.fullmatch(
        r"config: model.attention: cudnn is not available \(cuDNN's bfloat16 attention fails here: \w+: .+\); "
        r"use model.attention=auto or xla",
        str(e.value),
    ), str(e.value)


def test_an_fp8_step_on_deterministic_kernels_takes_xlas_attention_where_cudnns_probe_passes(monkeypatch):
    """On an H100 (jaxlib 0.11.2) the FP8 step with cuDNN's attention fails on XLA's deterministic kernels where the
    bfloat16 step and the probe run: `auto` takes XLA's attention there, and `cudnn` is one line at the config's
    check. The deterministic flag in XLA_FLAGS counts as `system.deterministic` does."""
    import models

    monkeypatch.setattr(models.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(models.auto, "_cudnn_attention_failure", lambda dtype: None)  # a GPU whose probe passes
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    models.auto._resolve_attention.cache_clear()
    try:
        assert models.resolve_attention("auto", "bfloat16", True) == "cudnn"
        assert models.resolve_attention("auto", "fp8", False) == "cudnn"
        assert models.resolve_attention("auto", "fp8", True) == "xla"
        with pytest.raises(ConfigError) as e:  # the config's check, before any data is read
            load_config(["system.dtype=fp8", "system.deterministic=true", "model.attention=cudnn"], num_local_devices=1)
        monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_gpu_deterministic_ops=true")
        models.auto._resolve_attention.cache_clear()
        assert models.resolve_attention("auto", "fp8") == "xla"
        assert models.resolve_attention("auto", "bfloat16") == "cudnn"
        monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true --xla_gpu_deterministic_ops=false")
        assert models.resolve_attention("auto", "fp8") == "cudnn"  # XLA reads the last
    finally:
        models.auto._resolve_attention.cache_clear()
    # XLA's reading of a boolean flag: bare, =true or =1 turn it on; the last one counts
    flags = ["", "--xla_gpu_deterministic_ops", "--xla_gpu_deterministic_ops=1", "--xla_gpu_deterministic_ops=True"]
    flags += ["--xla_gpu_deterministic_ops=true --xla_gpu_deterministic_ops=0", "--xla_gpu_deterministic_ops_x=true"]
    assert [models.auto.deterministic_kernels(f) for f in flags] == [False, True, True, True, False, False]
    assert str(e.value) == (
        "config: model.attention: cudnn is not available (an FP8 step's cuDNN attention fails on XLA's deterministic "
        "kernels, which this run asks for); use model.attention=auto or xla"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["null", "true", "false"])
def test_scan_layers_null_unrolls_on_a_gpu_and_scans_elsewhere(setting, data_cache):
    # the dense head: the chunked one (auto's choice on a GPU) is a loop over its chunks of its own
    overrides = f"model.scan_layers={setting}", "model.head_loss=dense", "train.max_steps=2"
    parts = build(tiny_overrides(data_cache, *overrides))
    scanned = {"null": jax.default_backend() != "gpu", "true": True, "false": False}[setting]
    assert parts.state.model.cfg.scan_layers is scanned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lowering alone reports the donated buffers as unused
        text = parts.train_step.lower(parts.state, put_batch(parts.data.train.batch(0), parts.mesh)).as_text()
    # the layers' loop (the micro-batch loop and the optimizer add none at one micro-batch)
    assert ("stablehlo.while" in text) == scanned


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
@pytest.mark.parametrize("seq", [64, 48])
def test_blocked_attention_equals_xla_attention(seq):
    from models.attention import blocked_causal_attention

    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, seq, 3, 16)) for i in range(3))
    want = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    # two programs (blocked, XLA's): outputs are averages of |v| ~ 1, a few ulp apart (~1e-7); 1e-5
    np.testing.assert_allclose(blocked_causal_attention(q, k, v, block=16), want, atol=1e-5)


def windowed_attention_reference(q, k, v, window, segments=None):
    """Causal attention in NumPy (float64) where query t sees keys t - window + 1 .. t (and only its own document's,
    with segment ids): the loops of the definition."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, N, H = q.shape
    out = np.zeros_like(q)
    for b in range(B):
        for n in range(N):
            for t in range(T):
                keys = [
                    s
                    for s in range(max(0, t - window + 1), t + 1)
                    if segments is None or segments[b, s] == segments[b, t]
                ]
                scores = np.array([q[b, t, n] @ k[b, s, n] for s in keys]) / np.sqrt(H)
                p = np.exp(scores - scores.max())
                out[b, t, n] = (p / p.sum()) @ v[b, keys, n]
    return out


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
@pytest.mark.parametrize("window", [1, 7, 16, 40, 64])  # itself only; inside a block; a block; across blocks; all
def test_sliding_window_attention_sees_the_last_window_positions(window):
    """model.attention_window: every kernel against the NumPy definition, with and without documents; `blocked`
    scores only the keys a query block's window reaches (about window + block keys a block, not all before it)."""
    from models.attention import blocked_causal_attention, causal_attention

    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 64, 2, 8)) for i in range(3))
    segments = jnp.asarray(np.repeat([[0, 1, 2, 3], [0, 0, 1, 1]], 16, axis=1))
    for seg in (None, segments):
        want = windowed_attention_reference(q, k, v, window, None if seg is None else np.asarray(seg))
        for implementation in ("xla", "blocked"):
            got = causal_attention(q, k, v, implementation, seg, window)
            np.testing.assert_allclose(got, want, atol=1e-5, err_msg=f"{implementation}, segments={seg is not None}")
        if jax.default_backend() == "gpu":  # cuDNN's sliding window, at its 16-bit inputs: bfloat16's rounding
            q16, k16, v16 = (x.astype(jnp.bfloat16) for x in (q, k, v))
            got = causal_attention(q16, k16, v16, "cudnn", seg, window).astype(jnp.float32)
            np.testing.assert_allclose(got, want, atol=3e-2, err_msg=f"cudnn, segments={seg is not None}")
    text = jax.jit(lambda q, k, v: blocked_causal_attention(q, k, v, 16, None, window)).lower(q, k, v).as_text()
    key_lengths = [int(n) for n in re.findall(r"tensor<2x2x16x(\d+)xf32>", text)]  # each block's scores
    assert max(key_lengths) == min(64, 16 + window - 1)  # a block's 16 queries and the window - 1 keys before them


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
@pytest.mark.parametrize("window", [None, 7, 40])
def test_blocked_attentions_written_out_backward_equals_automatic_differentiation(window):
    """`blocked` runs its own backward pass (models/attention.py `block_attention`, for XLA:CPU's fast dots): the
    gradients of queries, keys and values equal those JAX derives for XLA's attention, across query blocks, with a
    window and with documents; and a Hessian-vector product (forward over reverse) goes through it."""
    from models.attention import causal_attention

    q, k, v, w = (jax.random.normal(jax.random.PRNGKey(i), (2, 64, 2, 8)) for i in range(4))
    segments = jnp.asarray(np.repeat([[0, 1, 2, 3], [0, 0, 1, 1]], 16, axis=1))
    for seg in (None, segments):

        def loss(implementation, q, k, v):
            return jnp.sum(causal_attention(q, k, v, implementation, seg, window) * w)

        grads = {i: jax.grad(lambda *a, i=i: loss(i, *a), argnums=(0, 1, 2))(q, k, v) for i in ("blocked", "xla")}
        for name, got, want in zip("qkv", grads["blocked"], grads["xla"], strict=True):
            np.testing.assert_allclose(got, want, atol=2e-5, err_msg=f"d{name}, window={window}, segments={seg}")
        hvp = {i: jax.jvp(jax.grad(lambda q, i=i: loss(i, q, k, v)), (q,), (w,))[1] for i in ("blocked", "xla")}
        np.testing.assert_allclose(hvp["blocked"], hvp["xla"], atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
@pytest.mark.parametrize("out", [(3, 4), (5,), (2, 2)])  # dy wider than x (x^T dy); narrower ((dy^T x)^T), 2 axes
def test_dense_layers_written_out_backward_equals_automatic_differentiation(out):
    """models/matmul.py `dense` (every Linear's matmul; on the CPU its own backward, for XLA:CPU's fast dots): its
    gradients and a Hessian-vector product equal those JAX derives for the plain dot."""
    from models.matmul import dense

    x, w = jax.random.normal(jax.random.PRNGKey(0), (12, 8)), jax.random.normal(jax.random.PRNGKey(1), (8, *out))
    g = jax.random.normal(jax.random.PRNGKey(2), (12, *out))

    def loss(matmul, x, w):
        return jnp.sum(jnp.tanh(matmul(x, w)) * g)

    plain = lambda x, w: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())))  # noqa: E731
    for got, want in zip(jax.grad(loss, (1, 2))(dense, x, w), jax.grad(loss, (1, 2))(plain, x, w), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    hvp = [jax.jvp(jax.grad(lambda w, m=m: loss(m, x, w)), (w,), (jnp.ones_like(w),))[1] for m in (dense, plain)]
    np.testing.assert_allclose(*hvp, rtol=1e-5, atol=1e-5)


def test_blocked_attentions_backward_keeps_a_runs_losses_within_1e_5_of_automatic_differentiation(
    float32_run, data_cache, monkeypatch
):
    """The CPU's default attention with its written-out backward against the same attention differentiated by JAX
    (what `blocked` ran before): 20 training steps' losses and gradient norms within 1e-5 relative (the same maths,
    other rounding). The written-out run is the module's float32 run, whose `auto` is `blocked` on the CPU."""
    from models import attention

    written_out, chosen = float32_run
    assert chosen == "blocked" and STEPS == 20
    monkeypatch.setattr(attention, "block_attention", lambda *a: attention._block_forward(*a)[0])
    parts = build(tiny_overrides(data_cache, "model.attention=blocked", "train.max_steps=20"))
    automatic = np.array([[float(m["loss"]), float(m["grad_norm"])] for m in map(parts.step, range(20))])
    np.testing.assert_allclose(written_out, automatic, rtol=1e-5)
    assert written_out[-1, 0] < written_out[0, 0] - 0.5  # it trained


def parameter_casts(parts) -> collections.Counter:
    """float32 -> bfloat16 casts of the parameters themselves in the train step (not of activations or cotangents
    of the same shape), counted where they run: `step` (once per step) or `micro-batch loop` (inside the scan over
    micro-batches: once per micro-batch). A parameter is followed into nested programs (jit, scan, cond, remat) by
    the position of the operand that carries it."""
    state, batch = parts.state, put_batch(parts.data.train.batch(0), parts.mesh)
    model_leaves = {id(x) for x in jax.tree.leaves(eqx.filter(state.model, eqx.is_array))}
    closed = jax.make_jaxpr(lambda s, b: parts.train_step(s, b))(state, batch)
    params = [v for v, leaf in zip(closed.jaxpr.invars, jax.tree.leaves((state, batch))) if id(leaf) in model_leaves]
    assert len(params) == len(model_leaves)
    counts: collections.Counter = collections.Counter()

    def walk(j, params, where):
        for eqn in j.eqns:
            if (
                eqn.primitive.name == "convert_element_type"
                and any(eqn.invars[0] is v for v in params)
                and eqn.outvars[0].aval.dtype == jnp.bfloat16
            ):
                counts[where] += 1
            inner = "micro-batch loop" if eqn.primitive.name == "scan" and where == "step" else where
            for value in eqn.params.values():
                for sub in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
                        sub = getattr(sub, "jaxpr", sub)
                        operands = eqn.invars[len(eqn.invars) - len(sub.invars) :]  # cond: the index comes first
                        walk(sub, [v for v, o in zip(sub.invars, operands) if any(o is p for p in params)], inner)

    walk(closed.jaxpr, params, "step")
    return counts


@pytest.mark.gpu
def test_parameters_are_cast_to_the_compute_dtype_once_per_step_not_per_micro_batch(data_cache):
    parts = build(tiny_overrides(data_cache, "system.dtype=bfloat16", "train.grad_accum_steps=4"))
    leaves = len(jax.tree.leaves(eqx.filter(parts.state.model, eqx.is_array)))
    casts = parameter_casts(parts)
    assert casts["step"] == leaves and casts["micro-batch loop"] == 0, casts


@pytest.mark.e2e
def test_xla_flags_reach_xla_before_its_backend_starts(data_cache, tmp_path):
    dump = tmp_path / "xla-dump"  # --xla_dump_to is a flag whose effect can be seen: XLA writes each program there
    r = run_cli(
        tiny_overrides(
            data_cache,
            f"logging.run_dir={tmp_path}/run",
            "train.max_steps=2",
            "checkpoint.save=false",
            "train.eval_interval=100",
            "system.compilation_cache_dir=null",
            f"system.xla_flags=['--xla_dump_to={dump}']",
        )
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert any("train_step" in p.name for p in dump.iterdir())


def test_an_xla_flag_xla_refuses_is_one_line_before_anything_is_written(data_cache, tmp_path):
    """XLA aborts the process on a flag it does not know, or a value it cannot read, when its backend starts: the
    flags are tried first, and the run says which one in one line (it was XLA's fatal log line and an abort)."""
    for flag, why in (
        ("--xla_no_such_flag=1", "Unknown flag in XLA_FLAGS: --xla_no_such_flag=1"),
        ("--xla_gpu_autotune_level=high", "Couldn't interpret value high for flag xla_gpu_autotune_level."),
    ):
        r = run_cli(tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run", f"system.xla_flags=['{flag}']"))
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"error: config: system.xla_flags: XLA refuses them ({why}); correct or drop the flag"
        ], r.stderr[-2000:]
        assert not (tmp_path / "run").exists()


def test_xla_flags_in_a_process_whose_backend_runs_are_one_line(data_cache, tmp_path, capsys):
    jax.devices()  # this test process's backend is running
    code = train_jax.command_line(
        tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run", "system.xla_flags=['--xla_gpu_autotune_level=0']")
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (tmp_path / "run").exists()
    assert err[0] == (
        "error: config: system.xla_flags: the XLA backend of this process has started already, so XLA "
        "would ignore them; set XLA_FLAGS='--xla_gpu_autotune_level=0' in the environment instead"
    )


def test_deterministic_asks_xla_for_its_deterministic_gpu_kernels(monkeypatch):
    """system.deterministic=true adds XLA's deterministic-kernels flag to the run's flags (a GPU's default kernels
    use atomics, so two runs of one program can differ in the last bits). In a process whose backend already runs,
    a CPU needs nothing (its kernels are deterministic); a GPU gets one line naming the key and the flag to set."""
    from training.config.system import SystemConfig
    from training.loop import compilation

    assert compilation.xla_flags(SystemConfig(deterministic=True, xla_flags=["--xla_dump_to=x"])) == [
        "--xla_dump_to=x",
        "--xla_gpu_deterministic_ops=true",
    ]
    assert compilation.xla_flags(SystemConfig()) == []
    both = SystemConfig(deterministic=True, xla_flags=["--xla_gpu_deterministic_ops=true"])
    assert compilation.xla_flags(both) == ["--xla_gpu_deterministic_ops=true"]  # once
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    jax.devices()  # this test process's (CPU) backend is running
    compilation.init_xla_flags(SystemConfig(deterministic=True))
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    monkeypatch.setattr(compilation.jax, "default_backend", lambda: "gpu")
    with pytest.raises(ConfigError) as e:
        compilation.init_xla_flags(SystemConfig(deterministic=True))
    assert str(e.value) == (
        "config: system.deterministic: the XLA backend of this process has started already, so XLA would ignore it; "
        "set XLA_FLAGS='--xla_gpu_deterministic_ops=true' in the environment instead"
    )
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")  # set before the backend started: nothing to do
    compilation.init_xla_flags(SystemConfig(deterministic=True))


@pytest.mark.parametrize("flag", ["xla_gpu_autotune_level=0", "--xla_a=1 --xla_b=2"])
def test_a_bad_xla_flag_is_one_config_error(flag):
    with pytest.raises(ConfigError, match=r"^config: system.xla_flags: each must be one XLA flag"):
        load_config([f"system.xla_flags=['{flag}']"], num_local_devices=1)
