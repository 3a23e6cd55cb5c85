"""model.head_loss=chunked: the LM head and the loss without [B, T, V] logits give today's (dense) numbers."""

import dataclasses
import functools
import math
import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import build, tiny_overrides
from models.config import GPTConfig
from models.gpt import GPT
from models.lm_head import chunk_length, chunked_log_z_and_target_logit
from training.distributed.sharding import put_batch
from training.step.precision import cast_floating

# 259 real ids padded to 320 rows: 61 rows that must never receive probability.
CFG = GPTConfig(vocab_size=259, n_layer=2, n_head=2, n_embd=32, context_size=16, vocab_multiple=64)


def objective(model, tokens, targets, mask, dtype):
    """The step's objective: mean cross-entropy over the target tokens plus a z-loss term, so both outputs of the
    head (log Z and the target's logit) carry a gradient."""
    log_z, target_logit = cast_floating(model, dtype).loss_terms(tokens, targets)
    return jnp.sum((log_z - target_logit + 1e-2 * jnp.square(log_z)) * mask) / jnp.sum(mask)


def model_and_batch(head_loss, chunk=8192, logits_dtype="float32"):
    options = {"head_loss": head_loss, "head_loss_chunk": chunk, "logits_dtype": logits_dtype}
    model = GPT.init(dataclasses.replace(CFG, **options), jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 16), 0, CFG.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    mask = (jnp.arange(16) < 13).astype(jnp.float32)[None].repeat(4, 0)  # some tokens are not targets
    return model, tokens, targets, mask


@functools.cache  # the dense reference is shared by the cases
def loss_and_grads(head_loss, dtype, chunk=8192, logits_dtype="float32"):
    return eqx.filter_jit(eqx.filter_value_and_grad(objective))(*model_and_batch(head_loss, chunk, logits_dtype), dtype)


def relative_error(g, reference) -> float:
    """|g - reference| / |reference|, both as float32."""
    g, reference = g.astype(jnp.float32), reference.astype(jnp.float32)
    return float(jnp.linalg.norm(g - reference)) / float(jnp.linalg.norm(reference))


# float32: dense and chunked are two programs (logsumexp over 259 logits, sums over 52 targets in other orders): each
# a few ulp (~1e-7 relative) off the exact value; 1e-5 leaves ~100x
@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
@pytest.mark.parametrize("chunk", [4, 24, 64])  # one position a chunk; 6 positions fit, 4 divide the context; all
def test_chunked_head_and_loss_equal_the_dense_ones_and_so_do_their_gradients(chunk):
    dense_loss, dense_grads = loss_and_grads("dense", jnp.float32)
    loss, grads = loss_and_grads("chunked", jnp.float32, chunk)
    np.testing.assert_allclose(loss, dense_loss, rtol=1e-5)
    for g, dense_g in zip(jax.tree.leaves(grads), jax.tree.leaves(dense_grads)):
        assert jnp.any(dense_g != 0)
        assert relative_error(g, dense_g) <= 1e-5  # relative to the gradient's norm


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
def test_in_bfloat16_the_chunked_head_is_as_close_to_the_float32_gradient_as_the_dense_one():
    """bfloat16 (8 mantissa bits, ~4e-3 a rounding): each path's gradients are 0.3-1.2% from the float32 ones
    (measured on two XLA:CPU versions): both heads are held to 2% of the float32 gradient, and the chunked one to
    1.5x the dense one's error besides."""
    reference_loss, reference = loss_and_grads("dense", jnp.float32)
    dense_loss, dense_grads = loss_and_grads("dense", jnp.bfloat16)
    loss, grads = loss_and_grads("chunked", jnp.bfloat16, 24)
    assert abs(float(loss) - float(reference_loss)) <= 1.5 * abs(float(dense_loss) - float(reference_loss)) + 1e-3
    for g, dense_g, ref in zip(*(jax.tree.leaves(t) for t in (grads, dense_grads, reference))):
        assert relative_error(dense_g, ref) <= 0.02, ref.shape  # the dense head's own 16-bit backward (a custom VJP)
        assert relative_error(g, ref) <= min(0.02, 1.5 * relative_error(dense_g, ref)), ref.shape


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
@pytest.mark.parametrize("head_loss,chunk", [("dense", 8192), ("chunked", 24)])
def test_logits_in_the_compute_dtype_are_written_in_it_and_keep_the_loss_and_gradients(head_loss, chunk):
    """model.logits_dtype=compute: the head's matmul writes its logits in bfloat16 (half the bytes of every pass over
    them), which the softmax reads in float32; the loss and every gradient stay as close to float32's as the bfloat16
    step with float32 logits is (1.1% of the gradient here, for both). float32 logits stay the default."""
    reference_loss, reference = loss_and_grads("dense", jnp.float32)
    wide_loss, wide = loss_and_grads(head_loss, jnp.bfloat16, chunk)
    loss, grads = loss_and_grads(head_loss, jnp.bfloat16, chunk, "compute")
    assert abs(float(loss) - float(reference_loss)) <= 1.5 * abs(float(wide_loss) - float(reference_loss)) + 1e-3
    for g, g_wide, ref in zip(*(jax.tree.leaves(t) for t in (grads, wide, reference))):
        assert relative_error(g, ref) <= min(0.02, 1.5 * relative_error(g_wide, ref)), ref.shape

    def logits_written(logits_dtype: str) -> set[str]:
        """The element types of the products of the step's program whose last axis is the padded vocabulary."""
        model, *batch = model_and_batch(head_loss, chunk, logits_dtype)
        step = eqx.filter_jit(lambda *args: eqx.filter_value_and_grad(objective)(*args, jnp.bfloat16))
        text = step.lower(model, *batch).as_text()
        V = CFG.padded_vocab_size
        return {t for line in text.splitlines() if "dot_general" in line for t in re.findall(rf"x{V}x(\w+)>$", line)}

    assert logits_written("compute") == {"bf16"} and logits_written("float32") == {"f32"}


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
def test_the_chunked_head_never_gives_a_padded_row_probability():
    _, grads = loss_and_grads("chunked", jnp.float32, chunk=8)
    padded = grads.wte[CFG.vocab_size :]
    assert padded.shape == (CFG.padded_vocab_size - CFG.vocab_size, CFG.n_embd)
    assert not jnp.any(padded)  # no logit of a padded row reached the loss
    assert jnp.all(jnp.any(grads.wte[: CFG.vocab_size] != 0, axis=1))  # every real row did
    # log Z is over the real rows only, even where a padded row's weights are large
    h = jax.random.normal(jax.random.PRNGKey(2), (2, 4, 8))
    w = jax.random.normal(jax.random.PRNGKey(3), (16, 8)).at[10:].set(100.0)
    targets = jnp.zeros((2, 4), jnp.int32)
    log_z, target_logit = chunked_log_z_and_target_logit(h, w, targets, 10, 4)
    # Two programs, float32: a logit sums 8 products, each side off by <= 8 x 2^-24 x sum|h_i w_i| (~5e-7 x it), and
    # log Z moves by at most its worst logit's error plus its own rounding; a target logit can be near 0, so absolute
    scale = float(jnp.max(jnp.abs(h) @ jnp.abs(w[:10]).T))  # the largest sum|h_i w_i|
    np.testing.assert_allclose(log_z, jax.nn.logsumexp(h @ w[:10].T, axis=-1), rtol=1e-6, atol=2e-6 * scale)
    np.testing.assert_allclose(target_logit, (h @ w[0]), rtol=1e-6, atol=2e-6 * scale)


def test_a_chunk_is_the_largest_divisor_of_the_context_within_its_token_budget():
    assert chunk_length(batch=4, time=16, chunk_tokens=24) == 4  # 6 positions would fit; 4 divides 16
    assert chunk_length(batch=4, time=16, chunk_tokens=8192) == 16
    assert chunk_length(batch=64, time=1024, chunk_tokens=8) == 1  # never less than one position
    assert chunk_length(batch=32, time=1024, chunk_tokens=8192) == 256


def float32_array_shapes(parts) -> set[tuple[int, ...]]:
    """The shapes of every float32 array the compiled train step's program names (StableHLO as lowered)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lowering alone reports the donated buffers as unused
        text = parts.train_step.lower(parts.state, put_batch(parts.data.train.batch(0), parts.mesh)).as_text()
    return {
        tuple(int(n) for n in dims.split("x"))
        for dims in re.findall(r"tensor<((?:\d+x)+)f32>", text)
        for dims in [dims.rstrip("x")]
    }


@pytest.mark.gpu
@pytest.mark.parametrize("head_loss", ["dense", "chunked"])
def test_the_chunked_train_step_never_holds_the_logits_of_the_whole_batch(head_loss, data_cache):
    chunk = ["model.head_loss_chunk=128"] if head_loss == "chunked" else []  # dense reads no chunk: refused
    parts = build(tiny_overrides(data_cache, f"model.head_loss={head_loss}", *chunk))
    B, T = parts.cfg.train.batch_size, parts.cfg.model.context_size
    V = parts.state.model.cfg.padded_vocab_size
    shapes = float32_array_shapes(parts)
    holds_all_logits = any(math.prod(s) >= B * T * V and s[-1] == V for s in shapes)
    assert holds_all_logits == (head_loss == "dense"), sorted(s for s in shapes if s[-1] == V)
    if head_loss == "chunked":  # chunks of 128 tokens: 8 rows x 16 of the 64 positions
        assert (B, 128 // B, V) in shapes


@pytest.mark.parametrize(
    "backend,optimizer,requested,resolved",
    [
        ("cpu", "adamw", "auto", "dense"),
        ("gpu", "adamw", "auto", "chunked"),
        ("gpu", "sophia", "auto", "dense"),
        ("cpu", "adamw", "chunked", "chunked"),
        ("gpu", "adamw", "dense", "dense"),
    ],
)
def test_auto_head_loss_is_chunked_on_a_gpu_and_dense_elsewhere_or_with_sophia(
    backend, optimizer, requested, resolved, monkeypatch
):
    """model.head_loss=auto, the default: the chunked head on a GPU (faster there, and less memory), the dense one on
    other backends and for sophia, which differentiates the loss twice; a head asked for by name is kept."""
    from models import MODEL_BUILDERS
    from training.config import load_config

    overrides = ["model=gpt2-tiny", f"optimizer={optimizer}", "model.attention=xla"]  # xla: no cuDNN probe
    cfg = load_config([*overrides, *([] if requested == "auto" else [f"model.head_loss={requested}"])])
    assert cfg.model.head_loss == requested
    monkeypatch.setattr(jax, "default_backend", lambda: backend)  # what the model's build asks of the backend
    model = eqx.filter_eval_shape(MODEL_BUILDERS["gpt"], cfg, 259, jax.random.PRNGKey(0))
    assert model.cfg.head_loss == resolved


@pytest.mark.parametrize(
    "backend,requested,resolved",
    [
        ("cpu", "auto", "float32"),
        ("gpu", "auto", "compute"),
        ("gpu", "float32", "float32"),
        ("cpu", "compute", "compute"),
    ],
)
def test_auto_logits_dtype_is_the_compute_dtype_on_a_gpu_and_float32_elsewhere(
    backend, requested, resolved, monkeypatch
):
    """model.logits_dtype=auto, the default: logits in the compute dtype on a GPU (faster there: the passes over them
    are memory-bound), float32 elsewhere; a dtype asked for by name is kept."""
    from models import MODEL_BUILDERS
    from training.config import load_config

    overrides = ["model=gpt2-tiny", "model.attention=xla"]  # xla: no cuDNN probe
    cfg = load_config([*overrides, *([] if requested == "auto" else [f"model.logits_dtype={requested}"])])
    assert cfg.model.logits_dtype == requested
    monkeypatch.setattr(jax, "default_backend", lambda: backend)  # what the model's build asks of the backend
    model = eqx.filter_eval_shape(MODEL_BUILDERS["gpt"], cfg, 259, jax.random.PRNGKey(0))
    assert model.cfg.logits_dtype == resolved
