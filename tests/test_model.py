"""The GPT-2 model: shapes, parameter counts, init, causality, the tied head, dropout."""

import math

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import gpt_config
from models.config import GPTConfig
from models.gpt import GPT, count_params
from training.config import load_config
from training.step.losses import mean_loss

TINY = GPTConfig(vocab_size=259, n_layer=2, n_head=2, n_embd=64, context_size=64)


def tokens(shape, vocab=259, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, shape), jnp.int32)


@pytest.mark.gpu
def test_logits_shape_and_padded_vocab_never_predicted():
    model = GPT.init(TINY, jax.random.PRNGKey(0))
    assert TINY.padded_vocab_size == 320 and model.wte.shape == (320, 64)
    logits = model(tokens((3, 17)))
    chex.assert_shape(logits, (3, 17, 320))
    assert logits.dtype == jnp.float32
    probs = jax.nn.softmax(logits, axis=-1)
    assert float(probs[..., 259:].max()) == 0.0


# GPT-2's published sizes (tied head, 50,257-token vocab, 1,024 positions).
GPT2_SIZES = {"gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200}


@pytest.mark.parametrize("preset", GPT2_SIZES)
def test_gpt2_presets_match_published_parameter_counts_within_1_percent(preset):
    cfg = load_config([f"model={preset}"])
    abstract = eqx.filter_eval_shape(GPT.init, gpt_config(cfg.model, 50257), jax.random.PRNGKey(0))
    n = count_params(abstract)
    assert abs(n - GPT2_SIZES[preset]) / GPT2_SIZES[preset] < 0.01, n


def test_gpt2_mini_is_about_10M_parameters():
    cfg = load_config([])
    n = count_params(eqx.filter_eval_shape(GPT.init, gpt_config(cfg.model, 4096), jax.random.PRNGKey(0)))
    assert 9e6 < n < 13e6, n


def test_init_follows_gpt2():
    cfg = GPTConfig(vocab_size=259, n_layer=8, n_head=4, n_embd=256, context_size=128)
    model = GPT.init(cfg, jax.random.PRNGKey(1))
    assert abs(float(model.wte.std()) - 0.02) < 0.001
    assert abs(float(model.blocks.fc.weight.std()) - 0.02) < 0.001
    residual = 0.02 / math.sqrt(2 * cfg.n_layer)
    assert abs(float(model.blocks.attn_proj.weight.std()) - residual) < 0.0005
    assert abs(float(model.blocks.mlp_proj.weight.std()) - residual) < 0.0005
    assert float(jnp.abs(model.blocks.qkv.bias).max()) == 0.0
    assert float(model.ln_f.weight.min()) == 1.0


def test_loss_at_init_is_within_5_percent_of_log_vocab():
    model = GPT.init(TINY, jax.random.PRNGKey(0))
    x = tokens((8, 65))
    batch = {"inputs": x[:, :-1], "targets": x[:, 1:], "loss_mask": jnp.ones((8, 64))}
    loss = float(mean_loss(model, batch, None, jnp.float32))
    assert abs(loss - math.log(259)) / math.log(259) < 0.05, loss


@pytest.mark.gpu
def test_changing_a_future_token_leaves_earlier_logits_unchanged():
    model = GPT.init(TINY, jax.random.PRNGKey(0))
    x = tokens((2, 32))
    y = x.at[:, 20].set((x[:, 20] + 1) % 259)
    a, b = model(x), model(y)
    np.testing.assert_array_equal(np.asarray(a[:, :20]), np.asarray(b[:, :20]))
    assert float(jnp.abs(a[:, 20:] - b[:, 20:]).max()) > 1e-4


def test_lm_head_is_the_token_embedding_one_parameter():
    model = GPT.init(TINY, jax.random.PRNGKey(0))
    vocab_matrices = [x for x in jax.tree.leaves(model) if x.shape == (320, 64)]
    assert len(vocab_matrices) == 1
    x = tokens((2, 16))
    h = model.hidden(x)[0]
    # the model's head against the matmul here (two programs): logits < ~1, a few ulp apart (~1e-7); 1e-5
    np.testing.assert_allclose(model(x)[..., :259], (h @ model.wte.T)[..., :259], rtol=1e-5, atol=1e-5)
    # The head's gradient reaches the embedding: ids that never occur as inputs still get one.
    batch = {"inputs": jnp.zeros((2, 16), jnp.int32), "targets": jnp.full((2, 16), 7), "loss_mask": jnp.ones((2, 16))}
    grads = eqx.filter_jit(eqx.filter_grad(mean_loss))(model, batch, None, jnp.float32)
    assert float(jnp.abs(grads.wte[7]).max()) > 0.0


def test_dropout_only_with_a_key():
    cfg = GPTConfig(vocab_size=259, n_layer=2, n_head=2, n_embd=64, context_size=64, dropout=0.5)
    model = GPT.init(cfg, jax.random.PRNGKey(0))
    x = tokens((2, 16))
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(model(x)))
    a, b = model(x, key=jax.random.PRNGKey(1)), model(x, key=jax.random.PRNGKey(2))
    assert float(jnp.abs(a - b).max()) > 1e-3


def test_biases_are_optional():
    cfg = GPTConfig(vocab_size=259, n_layer=2, n_head=2, n_embd=64, context_size=64, bias=False)
    model = GPT.init(cfg, jax.random.PRNGKey(0))
    assert model.blocks.qkv.bias is None and model.ln_f.bias is None
    assert count_params(model) < count_params(GPT.init(TINY, jax.random.PRNGKey(0)))
    chex.assert_shape(model(tokens((1, 8))), (1, 8, 320))


# cuDNN's fused attention exists only on a GPU: there it is checked too (not skipped on a CPU: not listed).
MASKED_BACKENDS = ["xla", "blocked"] + (["cudnn"] if jax.default_backend() == "gpu" else [])


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")  # TF32 on a GPU moved the document's logits by 1.4e-4 (H100)
@pytest.mark.parametrize("attention", MASKED_BACKENDS)
def test_with_document_masking_a_documents_logits_ignore_what_precedes_it(attention):
    """Two windows end with the same document after different ones: with segment ids its logits agree (attention
    stays inside it, its positions restart at 0); without them they differ."""
    from data.examples import token_batch

    cfg = GPTConfig(vocab_size=259, n_layer=2, n_head=2, n_embd=64, context_size=256, attention=attention)
    model = GPT.init(cfg, jax.random.PRNGKey(0))
    atol = 1e-4  # the document at other offsets (other masks, other blocks): a few ulp of logits ~1; 1e-4 is ~100x
    if attention == "cudnn":  # cuDNN's kernel takes 16-bit inputs (a float32 model runs XLA's)
        model = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, model)
        atol = 3e-2
    rng, eos = np.random.default_rng(1), 256
    doc = rng.integers(0, 256, 149)
    windows = np.stack(
        [
            np.concatenate([rng.integers(0, 256, 106), [eos], doc, [eos]]),
            np.concatenate([rng.integers(0, 256, 50), [eos], doc, [eos], rng.integers(0, 256, 56)]),
        ]
    )
    batch = token_batch(windows, pad_id=257, eos_id=eos)
    # the <EOS> before a document begins its segment (its BOS), as a sampling prompt begins
    assert batch["segment_ids"][0, 105] == 0 and (batch["segment_ids"][0, 106:256] == 1).all()
    masked = model(jnp.asarray(batch["inputs"]), segment_ids_BT=jnp.asarray(batch["segment_ids"]))
    plain = model(jnp.asarray(batch["inputs"]))
    first, second = slice(107, 256), slice(51, 200)  # `doc` in each window
    np.testing.assert_array_equal(batch["inputs"][0, first], batch["inputs"][1, second])
    np.testing.assert_allclose(
        np.asarray(masked[0, first], np.float32), np.asarray(masked[1, second], np.float32), atol=atol
    )
    assert float(jnp.abs(plain[0, first] - plain[1, second]).max()) > max(1e-2, 3 * atol)
    # and as the model reads the document alone after an <EOS>: a sampling prompt's start
    alone = model(jnp.asarray(np.concatenate([[eos], doc])[None]))
    np.testing.assert_allclose(np.asarray(masked[0, 106:256], np.float32), np.asarray(alone[0], np.float32), atol=atol)
