"""system.dtype=fp8: the blocks' matmuls with float8 operands at delayed per-tensor scales kept in the train state.

On a CPU the float8 operands' products run in the CPU's own arithmetic (models/fp8.py): the numbers a GPU's FP8 GEMMs
compute, which is what these tests check; on a GPU with FP8 matmuls (`pytest -m gpu`) the same tests run there, and
the compiled step must run its matmuls in FP8 (cuBLASLt's FP8 GEMMs, or XLA's own kernels on float8 operands).
"""

import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.errors import ConfigError
from helpers import build, read_metrics, run_in_process, tiny_overrides
from models import fp8 as fp8_module
from models.auto import resolve_attention
from models.config import GPTConfig
from models.fp8 import (
    E4M3,
    E5M2,
    MATMULS,
    Fp8Recipe,
    Fp8State,
    fp8_dot,
    native_fp8_problem,
    quantize_dequantize,
    scales_from_history,
)
from models.gpt import GPT
from scripts.benchmarks.bench import custom_calls, float8_dots
from training.config import check_devices, load_config
from training.distributed.sharding import init_mesh, put_batch
from training.pipeline.build import init_model, init_optimizer, init_scheduler, init_state_and_steps
from training.step.precision import cast_floating, fp8_recipe

pytestmark = pytest.mark.gpu
STEPS = 20
FP8_GEMM = "__cublas$lt$matmul$f8"  # the custom call XLA's GPU compiler makes of a dot of float8 operands


def rounded(x, dtype, scale):
    """x rounded to the float8 format at `scale`, computed independently of models/fp8.py."""
    limit = float(jnp.finfo(dtype).max)
    return np.asarray(np.clip(np.asarray(x, np.float32) / scale, -limit, limit).astype(dtype), np.float32) * scale


@pytest.mark.usefixtures("float32_matmuls")  # the numpy references sum float32 products
def test_fp8_dot_rounds_its_operands_and_gradient_and_reports_their_amaxes():
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (8, 16), jnp.float32)
    w = 0.05 * jax.random.normal(kw, (16, 3, 4), jnp.float32)
    g = 1e-3 * jax.random.normal(kg, (8, 3, 4), jnp.float32)
    scales = jnp.asarray([2.0 / 448, 0.2 / 448, 4e-3 / 57344], jnp.float32)
    y, pullback = jax.vjp(fp8_dot, x, w, scales)
    xq, wq = rounded(x, E4M3, scales[0]), rounded(w, E4M3, scales[1])
    # the same rounded products summed by XLA and by numpy in other orders: ~1e-7 relative; 1e-5 (and below)
    np.testing.assert_allclose(y, np.einsum("nd,dkm->nkm", xq, wq), rtol=1e-5, atol=1e-6)
    assert not np.allclose(y, np.einsum("nd,dkm->nkm", x, w), rtol=1e-3)  # the rounding is really there
    dx, dw, amax = pullback(g)
    gq = rounded(g, E5M2, scales[2])
    np.testing.assert_allclose(dx, np.einsum("nkm,dkm->nd", gq, wq), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(dw, np.einsum("nd,nkm->dkm", xq, gq), rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(amax, [jnp.max(jnp.abs(x)), jnp.max(jnp.abs(w)), jnp.max(jnp.abs(g))])
    # quantising at a scale leaves values that are exactly representable: rounding twice changes nothing
    np.testing.assert_array_equal(quantize_dequantize(jnp.asarray(xq), E4M3, scales[0]), xq)


def power_of_two_scale(a: np.ndarray, dtype) -> float:
    """The scale delayed scaling would give `a` (its amax at the format's max), rounded up to a power of two so that
    bfloat16 holds it exactly and the reference rounds at the very scale fp8_dot does."""
    return float(2.0 ** np.ceil(np.log2(np.max(np.abs(a)) / float(jnp.finfo(dtype).max))))


@pytest.mark.parametrize(("d", "out"), [(768, (3, 768)), (768, (768,)), (768, (3072,)), (3072, (768,))], ids=MATMULS)
def test_fp8_dot_at_gpt2s_shapes_computes_the_products_of_its_rounded_operands(d, out):
    """The three products of one matmul as the train step compiles them (bfloat16 in and out, gpt2's width, a mean
    loss's ~1e-6 output gradients) against numpy's float32 products of the same rounded operands. On a GPU with FP8
    matmuls all three run in FP8 (cuBLASLt's GEMMs or XLA's kernels on float8 operands), whose scales are runtime
    arguments: a scale applied twice, dropped or swapped there is an error of the scale's size, not of rounding."""
    native = native_fp8_problem() is None
    n = 2048 if native else 256
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)).astype(jnp.bfloat16)
    w = (0.02 * rng.normal(size=(d, *out))).astype(jnp.bfloat16)
    g = (1e-6 * rng.normal(size=(n, *out))).astype(jnp.bfloat16)
    scales = np.asarray([power_of_two_scale(x, E4M3), power_of_two_scale(w, E4M3), power_of_two_scale(g, E5M2)])

    @jax.jit
    def products(x, w, scales, g):
        y, pullback = jax.vjp(fp8_dot, x, w, scales)
        return (y, *pullback(g)[:2])

    args = (jnp.asarray(x), jnp.asarray(w), jnp.asarray(scales, jnp.float32), jnp.asarray(g))
    compiled = products.lower(*args).compile().as_text()
    fp8 = custom_calls(compiled).get(FP8_GEMM, 0) + float8_dots(compiled)
    assert fp8 == (3 if native else 0), custom_calls(compiled)  # forward and both gradients, each in FP8 on a GPU
    y, dx, dw = products(*args)
    assert (y.dtype, dx.dtype, dw.dtype) == (jnp.bfloat16,) * 3
    xq, wq, gq = rounded(x, E4M3, scales[0]), rounded(w, E4M3, scales[1]), rounded(g, E5M2, scales[2])
    wq2, gq2 = wq.reshape(d, -1), gq.reshape(n, -1)
    for got, exact in ((y, xq @ wq2), (dx, gq2 @ wq2.T), (dw, xq.T @ gq2)):
        got = np.asarray(got, np.float32).reshape(exact.shape)
        # bfloat16's rounding of the result (2^-9) and the summation order; a misapplied scale is off by >= 2x
        assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 1e-2
    # ... and FP8's rounding is in them: ~0.03 from the unrounded product, where bfloat16's would be ~0.003
    unrounded = x.astype(np.float32) @ w.astype(np.float32).reshape(d, -1)
    assert np.linalg.norm(np.asarray(y, np.float32).reshape(n, -1) - unrounded) / np.linalg.norm(unrounded) > 1e-2


def program_model(dtype: str) -> GPT:
    """gpt2's shapes and the attention `auto` picks (cuDNN's) on a GPU, whose FP8 matmuls it needs; a small model
    elsewhere. Every bias and norm parameter moved off its init (zeros, ones), so that each takes part."""
    on_gpu = jax.default_backend() == "gpu"
    if dtype == "fp8" and on_gpu and native_fp8_problem():
        pytest.skip(f"FP8 matmuls: {native_fp8_problem()}")
    shape = dict(vocab_size=50304, n_layer=12, n_head=12, n_embd=768, context_size=1024) if on_gpu else {}
    shape = shape or dict(vocab_size=259, n_layer=2, n_head=2, n_embd=64, context_size=128)
    model = GPT.init(GPTConfig(**shape, attention=resolve_attention("auto", dtype)), jax.random.PRNGKey(0))
    keys = iter(jax.random.split(jax.random.PRNGKey(1), 1000))
    moved = lambda p: p + 0.1 * jax.random.normal(next(keys), p.shape) if float(jnp.std(p)) == 0 else p  # noqa: E731
    return jax.tree.map(lambda p: moved(p) if eqx.is_inexact_array(p) else p, model)


def train_program():
    """The train step's program for one batch, as `micro_step` builds it: the compute-dtype copy of the model, forward
    and backward in one program, FP8's matmuls at the given scales. Each token's loss, the gradient, the amaxes."""

    @jax.jit
    def program(model, scales, tokens):
        def objective(model_and_scales):
            m, s = model_and_scales
            log_z, target_logit = cast_floating(m, jnp.bfloat16).loss_terms(tokens[:, :-1], tokens[:, 1:], fp8_scales=s)
            return jnp.mean(log_z - target_logit), log_z - target_logit

        (_, losses), (grads, amax) = eqx.filter_value_and_grad(objective, has_aux=True)((model, scales))
        return losses, grads, amax

    return program


def compiled_program(program, model: GPT, fp8: bool, tokens: jax.Array):
    """`program` compiled for `model` and batches like `tokens`, with the scales it runs at: for FP8 the scales after
    one step (each tensor's amax of a first step at its format's max; the program compiled once, at the first step's
    scales); its matmuls in FP8 (cuBLASLt's FP8 GEMMs and XLA's own dots of float8 operands); its custom calls."""
    scales = Fp8State.create(model.cfg.n_layer, Fp8Recipe(history=1)).scales() if fp8 else None
    compiled = program.lower(model, scales, tokens).compile()
    if fp8:
        scales = scales_from_history(compiled(model, scales, tokens)[2][..., None])
    text = compiled.as_text()
    return compiled, scales, custom_calls(text).get(FP8_GEMM, 0) + float8_dots(text), custom_calls(text)


@pytest.mark.parametrize("dtype", ["bfloat16", "fp8"])
def test_the_train_steps_loss_at_a_position_sees_no_later_token(dtype):
    """Each token's loss as the train step's program computes it (`train_program`, FP8's at the scales of one step) is
    the same for two batches that differ only after that token. A kernel that let a query see later keys would let
    the training loss fall faster than the model learns. On a GPU gpt2's shapes and kernels (cuDNN's attention,
    cuBLASLt's FP8 GEMMs, whose layouts XLA chooses around each other); elsewhere a small model."""
    model = program_model(dtype)
    batch, T = 4, model.cfg.context_size
    rng = np.random.default_rng(0)
    same = rng.integers(0, model.cfg.vocab_size, (batch, T + 1))
    later = same.copy()
    later[:, T // 2 + 1 :] = rng.integers(0, model.cfg.vocab_size, (batch, T // 2))  # inputs from T/2 + 1, targets T/2
    program, scales, fp8, calls = compiled_program(train_program(), model, dtype == "fp8", jnp.asarray(same))
    assert (model.cfg.attention == "cudnn") == any("fmha" in name for name in calls), calls
    assert fp8 >= 3 * 4 if dtype == "fp8" and jax.default_backend() == "gpu" else fp8 == 0, calls
    (a, grads_a, _), (b, grads_b, _) = (program(model, scales, jnp.asarray(t)) for t in (same, later))
    assert not jax.tree.all(jax.tree.map(jnp.array_equal, grads_a, grads_b))  # the batches differ, and so the steps
    # a token's loss sees its position's input and the ones before it, and its target: all the same up to T/2
    np.testing.assert_array_equal(np.asarray(a)[:, : T // 2], np.asarray(b)[:, : T // 2])
    assert np.all(np.asarray(a)[:, T // 2 + 1 :] != np.asarray(b)[:, T // 2 + 1 :])  # later, every position differs


def widened_scaled_dot(a, b, scale_a, scale_b, dimensions, out_dtype):
    """`scaled_dot` computed from its float8 operands widened to float32 behind a barrier, so that no FP8 matmul can
    form: each product of two float8 values is exact in float32, and the sums float32's."""
    a32, b32 = jax.lax.optimization_barrier((a.astype(jnp.float32), b.astype(jnp.float32)))
    product = jax.lax.dot_general(a32, b32, dimensions, precision=jax.lax.Precision.HIGHEST)
    return (product * (scale_a * scale_b)).astype(out_dtype)


def test_the_fp8_train_programs_loss_and_gradient_are_its_rounded_products_computed_wide(monkeypatch):
    """The FP8 train program (`train_program`: on a GPU gpt2's, with cuBLASLt's FP8 GEMMs and whatever XLA folds
    into them, biases included) against the same program whose FP8 products are computed wide (`widened_scaled_dot`):
    the same roundings to float8 at the same scales, so each token's loss and every gradient agree up to bfloat16's
    rounding of the products and the order of their sums. A scale applied twice or dropped, a bias added in the
    wrong place, a kernel summing wrongly, is an error of the gradient's size."""
    model = program_model("fp8")
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, model.cfg.vocab_size, (4, model.cfg.context_size + 1)))
    native, scales, fp8, calls = compiled_program(train_program(), model, True, tokens)
    assert fp8 >= 3 * 4 if jax.default_backend() == "gpu" else fp8 == 0, calls
    losses, grads, amax = native(model, scales, tokens)
    monkeypatch.setattr(fp8_module, "scaled_dot", widened_scaled_dot)
    wide = train_program().lower(model, scales, tokens).compile()
    assert float8_dots(wide.as_text()) == 0 and FP8_GEMM not in custom_calls(wide.as_text())
    wide_losses, wide_grads, wide_amax = wide(model, scales, tokens)
    np.testing.assert_allclose(losses, wide_losses, atol=0.02)  # per token; the mean: 1e-3
    assert abs(float(jnp.mean(losses)) - float(jnp.mean(wide_losses))) < 1e-3
    np.testing.assert_allclose(amax[..., :2], wide_amax[..., :2], rtol=0.02)  # inputs and weights: forward values
    np.testing.assert_allclose(amax[..., 2], wide_amax[..., 2], rtol=0.1)  # output gradients: see below
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(wide_grads), strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        # FP8's roundings amplify small differences: one flip of an E5M2 rounding (2 mantissa bits) in a layer's output
        # gradient moves all that layer's gradients; 2-4% apart on the CPU, where only bfloat16's rounding differs
        apart = float(np.linalg.norm(g - w) / np.linalg.norm(w))
        assert apart <= 0.1, (jax.tree_util.keystr(path), apart)


def test_scales_come_from_the_largest_amax_of_the_history_and_start_from_first_amax():
    history = jnp.zeros((2, 4, 3, 5)).at[1, 2, :, 3].set(jnp.asarray([448.0 * 3, 448.0 / 2, 57344.0 * 8]))
    scales = scales_from_history(history)
    np.testing.assert_allclose(scales[1, 2], [3.0, 0.5, 8.0], rtol=1e-6)  # exact quotients: 1e-6 is equality here
    # every other tensor: nothing yet, so input and weight at scale 1 and the gradient at an amax of 1
    np.testing.assert_allclose(scales.at[1, 2].set(0.0).sum(), 7 * (2 + 1 / 57344), rtol=1e-6)
    # a non-finite entry is no amax: the finite ones give the scale, and none at all gives the first scales
    mixed = jnp.zeros((2, 3, 3)).at[:, :, 0].set(jnp.inf).at[0, :, 1].set(jnp.asarray([448.0, 448.0, 57344.0]) * 2)
    np.testing.assert_allclose(scales_from_history(mixed), [[2.0, 2.0, 2.0], [1.0, 1.0, 1 / 57344]], rtol=1e-6)
    state = Fp8State.create(2, Fp8Recipe(history=3)).record(jnp.full((2, 4, 3), 2.0)).record(jnp.full((2, 4, 3), 5.0))
    np.testing.assert_array_equal(state.history[0, 0, 0], [5.0, 2.0, 0.0])  # newest first, oldest dropped last
    assert state.record(jnp.ones((2, 4, 3))).history[0, 0, 0].tolist() == [1.0, 5.0, 2.0]


def test_a_margin_widens_the_recorded_amaxes_scales_by_its_powers_of_two(data_cache):
    history = jnp.zeros((2, 4, 3, 5)).at[1, 2, :, 3].set(jnp.asarray([448.0 * 3, 448.0 / 2, 57344.0 * 8]))
    np.testing.assert_allclose(scales_from_history(history, margin=2)[1, 2], [12.0, 2.0, 32.0], rtol=1e-6)
    # ... and leaves the first step's alone (nothing recorded yet: no amax to keep headroom above)
    np.testing.assert_array_equal(scales_from_history(history, margin=2)[0], scales_from_history(history)[0])
    # system.fp8_margin reaches the run's state, which keeps it from step to step
    cfg = load_config(tiny_overrides(data_cache, "system.dtype=fp8", "system.fp8_margin=3"))
    assert fp8_recipe(cfg.system) == Fp8Recipe(history=16, margin=3)
    assert fp8_recipe(load_config(tiny_overrides(data_cache, "system.dtype=bfloat16")).system) is None  # no FP8 state
    model = init_model(cfg, 259, jax.random.PRNGKey(0))
    schedule = init_scheduler(cfg)
    optimizer = init_optimizer(cfg, schedule, model)
    mesh = init_mesh(1, 1)
    fp8 = init_state_and_steps(cfg, model, schedule, optimizer, jax.random.PRNGKey(0), mesh)[0].fp8
    state = fp8.record(jnp.full(fp8.history.shape[:-1], 448.0))
    assert state.margin == 3 and state.record(state.history[..., 0]).margin == 3
    np.testing.assert_allclose(state.scales()[..., 0], 8.0, rtol=1e-6)


@pytest.mark.usefixtures("float32_matmuls")
def test_a_fresh_runs_first_fp8_step_keeps_a_mean_losss_small_gradients():
    """Before any amax is recorded, the output gradient's scale covers a mean loss's gradients (~1e-6 in gpt2 at
    32,768 tokens a batch): both gradient products are FP8's rounding of the exact ones, not zeros (E5M2 at scale 1
    flushes everything below 1.5e-5)."""
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (64, 32), jnp.float32)
    w = 0.02 * jax.random.normal(kw, (32, 48), jnp.float32)
    g = 1e-6 * jax.random.normal(kg, (64, 48), jnp.float32)
    first = Fp8State.create(1, Fp8Recipe(history=2)).scales()[0, 0]
    dx, dw, _ = jax.vjp(fp8_dot, x, w, first)[1](g)
    for got, exact in ((dx, g @ w.T), (dw, x.T @ g)):
        assert float(jnp.linalg.norm(got - exact) / jnp.linalg.norm(exact)) < 0.15  # E5M2's and E4M3's rounding


@pytest.fixture(scope="module")
def bfloat16_curve(data_cache):
    parts = build(tiny_overrides(data_cache, f"train.max_steps={STEPS}", "system.dtype=bfloat16"))
    return [float(parts.step(s)["loss"]) for s in range(STEPS)]


def test_fp8_training_tracks_bfloat16_and_records_every_matmuls_amax(bfloat16_curve, data_cache):
    parts = build(
        tiny_overrides(data_cache, f"train.max_steps={STEPS}", "system.dtype=fp8", "system.fp8_amax_history=4")
    )
    n_layer = parts.cfg.model.n_layer
    assert parts.state.fp8.history.shape == (n_layer, 4, 3, 4) and not jnp.any(parts.state.fp8.history)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lowering alone reports the donated buffers as unused
        lowered = parts.train_step.lower(parts.state, put_batch(parts.data.train.batch(0), parts.mesh))
    hlo = lowered.as_text()
    assert "f8E4M3FN" in hlo and "f8E5M2" in hlo
    # every block's 4 matmuls x 3 (forward, two gradients) is a dot of two float8 operands (scanned layers: one
    # block's in the loop's body) ...
    blocks = 1 if parts.state.model.cfg.scan_layers else n_layer
    assert float8_dots(lowered.as_text(dialect="hlo")) == 4 * 3 * blocks
    # ... which the GPU runs in FP8, where it has FP8 matmuls: cuBLASLt's FP8 GEMMs or XLA's own (Triton) kernels on
    # float8 operands; a dot it cannot run so gets wider operands first, as the CPU's all do
    compiled = lowered.compile().as_text()
    fp8 = custom_calls(compiled).get(FP8_GEMM, 0) + float8_dots(compiled)
    assert fp8 >= 12 if native_fp8_problem() is None else fp8 == 0, (fp8, custom_calls(compiled))
    curve, clipped, limits = [], [], np.asarray([448.0, 448.0, 57344.0])  # E4M3's, E4M3's and E5M2's max
    for s in range(STEPS):
        scales = np.asarray(parts.state.fp8.scales())
        metrics = parts.step(s)
        # the step's clipping, from its scales and the amaxes it recorded: a tensor beyond its scale's range
        over = (np.asarray(parts.state.fp8.history[..., 0]) / (scales * limits)).reshape(-1, 3)  # input, weight, grad
        np.testing.assert_array_equal(metrics["fp8_clipped"], np.sum(over > 1.0, axis=0))
        np.testing.assert_allclose(metrics["fp8_amax_over_range"], np.max(over, axis=0), rtol=1e-6)
        curve.append(float(metrics["loss"]))
        clipped.append(int(np.sum(metrics["fp8_clipped"])))
    assert clipped[0] == 0 and sum(clipped) > 0, clipped  # the first step's ranges are wide, later ones the amaxes'
    assert np.mean(np.abs(np.array(curve) - np.array(bfloat16_curve))) < 0.03  # bfloat16's own tolerance vs float32
    assert curve[-1] < curve[0] - 0.5
    assert curve != bfloat16_curve  # ... and it is not bfloat16 under another name
    history = parts.state.fp8.history
    assert jnp.all(history > 0)  # every layer's four matmuls, all three tensors, each of the last 4 steps
    assert not jnp.array_equal(parts.state.fp8.scales(), jnp.ones_like(parts.state.fp8.scales()))
    # the newest weight amax is the bfloat16 weight's largest |w| at the last step's start (the rounding of the
    # weights to bfloat16 is all that separates them)
    qkv = parts.state.model.blocks.qkv.weight
    assert float(history[0, 0, 1, 0]) == pytest.approx(float(jnp.max(jnp.abs(qkv[0]))), rel=1e-2)


@pytest.mark.deterministic
def test_fp8_scales_are_checkpointed_and_a_resumed_run_equals_the_straight_one(data_cache, tmp_path, capsys):
    def run(run_dir, *extra):
        args = tiny_overrides(
            data_cache,
            f"logging.run_dir={run_dir}",
            "system.dtype=fp8",
            "train.max_steps=8",
            "train.eval_interval=4",
            "logging.tensorboard=false",
            "system.deterministic=true",  # bit for bit on a GPU too
            *extra,
        )
        result = run_in_process(args, capsys)
        assert result.returncode == 0, result.stderr[-2000:]
        return result

    run(tmp_path / "straight")
    split = tmp_path / "split"
    first = run(split, "checkpoint.load=auto", "checkpoint.num_steps=4")
    problem = native_fp8_problem()  # a CPU: said once, in one line; a GPU with FP8 matmuls: nothing to say
    assert first.stderr.count("system.dtype=fp8:") == (problem is not None)
    assert problem is None or f"system.dtype=fp8: {problem}" in first.stderr
    second = run(split, "checkpoint.load=auto")
    assert "resuming" in second.stdout + second.stderr
    losses = {r["step"]: r["loss"] for r in read_metrics(split, "train")}
    straight = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight", "train")}
    assert sorted(losses) == list(range(1, 9))
    assert [losses[s] for s in range(1, 9)] == [straight[s] for s in range(1, 9)]  # bit for bit, steps 5-8 too
    # each logged step says how many FP8 tensors outgrew their scale's range (training/loop/session.py), as its line
    kinds = {
        f"{name}/{kind}" for name in ("fp8_clipped", "fp8_amax_over_range") for kind in ("input", "weight", "gradient")
    }
    assert all({"fp8_clipped", "fp8_amax_over_range", *kinds} <= set(r) for r in read_metrics(split, "train"))
    assert re.search(r"\| fp8 clipped \d+ \(input \d+, weight \d+, gradient \d+\), amax ", first.stdout + first.stderr)


def test_an_intervals_fp8_clipping_counts_its_steps_and_takes_the_largest_overshoot():
    from training.loop.session import fp8_interval

    steps = [  # per kind: input, weight, gradient
        {"fp8_clipped": np.asarray([2, 0, 1]), "fp8_amax_over_range": np.asarray([1.5, 0.5, 1.25], np.float32)},
        {"fp8_clipped": np.asarray([0, 0, 0]), "fp8_amax_over_range": np.asarray([0.75, 0.5, 0.25], np.float32)},
        {"fp8_clipped": np.asarray([1, 0, 3]), "fp8_amax_over_range": np.asarray([1.25, 0.75, 2.0], np.float32)},
    ]
    assert fp8_interval(steps) == {
        "fp8_clipped": 7,
        "fp8_clipped/input": 3,
        "fp8_clipped/weight": 0,
        "fp8_clipped/gradient": 4,
        "fp8_amax_over_range": 2.0,
        "fp8_amax_over_range/input": 1.5,
        "fp8_amax_over_range/weight": 0.75,
        "fp8_amax_over_range/gradient": 2.0,
    }
    assert fp8_interval([{"loss": 1.0}]) == {}  # not an FP8 run


def test_fp8_on_a_gpu_without_fp8_matmuls_is_one_config_line(monkeypatch):
    import training.config.root as root

    cfg = load_config(["system.dtype=fp8"], num_local_devices=1)
    monkeypatch.setattr(root.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(root, "resolve_attention", lambda *a: "xla")
    monkeypatch.setattr(root, "native_fp8_problem", lambda: "NVIDIA A100 (compute capability 8.0) has no FP8 matmuls")
    with pytest.raises(ConfigError, match=r"^config: system.dtype: fp8: NVIDIA A100 .* use system.dtype=bfloat16$"):
        check_devices(cfg, 1)
