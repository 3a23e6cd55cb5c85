"""KV-cache decoding: token for token what recomputing the whole window gives, at temperature 0."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.errors import ConfigError
from models.config import GPTConfig
from models.decode import generate
from models.gpt import GPT
from models.sampling import generate_no_cache, sample_logits


@pytest.fixture(scope="module")
def model():
    """A random model with sharp predictions: at GPT-2's init scale every context gives the same greedy token, which
    any decoder would reproduce; with 8x larger weights the next token depends on the context."""
    cfg = GPTConfig(vocab_size=50, n_layer=2, n_head=2, n_embd=32, context_size=32, scan_layers=False)
    return jax.tree.map(lambda x: 8.0 * x, GPT.init(cfg, jax.random.PRNGKey(3)))


def test_cached_greedy_decode_equals_the_no_cache_decode(model):
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 4, 4, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]]  # different lengths
    cached = generate(model, prompts, 12, temperature=0.0)
    plain = generate_no_cache(model, prompts, 12, temperature=0.0)
    assert cached == plain and [len(c) for c in cached] == [12, 12, 12]


def greedy_by_hand(model, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding written out: the model's most likely next token given the last `context_size` tokens (a
    shorter window is padded on the right, which a causal model does not see)."""
    context, logits = model.cfg.context_size, eqx.filter_jit(lambda m, window: m(window))
    sequence = list(prompt)
    for _ in range(new_tokens):
        tail = sequence[-context:]
        window = np.zeros((1, context), np.int32)
        window[0, : len(tail)] = tail
        sequence.append(int(np.argmax(np.asarray(logits(model, window))[0, len(tail) - 1])))
    return sequence[len(prompt) :]


def test_past_the_context_the_decode_still_matches(model):
    prompts = [[5, 6, 7, 8] * 5]  # 20 tokens; 25 new ones run 13 past the 32-token context
    want = greedy_by_hand(model, prompts[0], 25)
    assert len(set(want[-13:])) > 3  # past the context, the tokens still depend on the window
    assert generate(model, prompts, 25, temperature=0.0) == [want]
    assert generate_no_cache(model, prompts, 25, temperature=0.0) == [want]


def test_rows_stop_at_eos_and_sampling_is_seeded(model):
    prompts = [[1, 2], [3, 4]]
    first = generate_no_cache(model, prompts, 10, temperature=0.0)
    eos = first[0][3]  # the token row 0 greedily emits 4th: treat it as <EOS>
    out = generate(model, prompts, 10, temperature=0.0, eos_id=eos)
    assert out == generate_no_cache(model, prompts, 10, temperature=0.0, eos_id=eos)
    assert out[0][-1] == eos and len(out[0]) <= 4
    a = generate(model, prompts, 10, temperature=1.0, top_k=10, seed=1)
    b = generate(model, prompts, 10, temperature=1.0, top_k=10, seed=1)
    c = generate(model, prompts, 10, temperature=1.0, top_k=10, seed=2)
    assert a == b and a != c
    assert all(0 <= t < 50 for row in a for t in row)  # padded vocab ids are never sampled
    # ... at any temperature: theirs is a finite logit (-1e9), which 1e9 brought level with the real ones
    for sample in (generate, generate_no_cache):
        hot = sample(model, [[1, 2]] * 4, 15, temperature=1e9, seed=0)
        assert all(0 <= t < 50 for row in hot for t in row) and len({t for row in hot for t in row}) > 10


def test_past_the_context_sampling_draws_from_a_stream_no_other_seed_uses(model):
    """The part of `generate(seed=s)` past the context has random draws of its own: not those of the cached part of
    `generate(seed=s + 1)` (it used PRNGKey(s + 1), the very key sequence of that part). At a temperature so high that
    every id is as likely in every context, the tokens drawn are the draws themselves."""
    hot = dict(temperature=1e6, top_k=None)
    long_prompt, short_prompt = [[5, 6, 7] * 10 + [8]], [[1]]  # 31 tokens: one new token fits the 32-token context
    for seed in (1, 2, 3):
        past = generate(model, long_prompt, 11, seed=seed, **hot)[0][1:]  # 10 tokens past the context
        assert past == generate(model, long_prompt, 11, seed=seed, **hot)[0][1:]  # seeded
        cached_next_seed = generate(model, short_prompt, 10, seed=seed + 1, **hot)[0]  # 10 tokens from the cache
        assert past != cached_next_seed
        assert len(set(past)) > 3  # drawn, not one token repeated


def test_more_new_tokens_than_the_cache_holds_are_refused_while_tracing(model):
    """A clear error at trace time, not lax's words about window bounds. (A row whose cache is full already is only
    known at run time: `generate` never feeds one, and nothing checks it.)"""
    with pytest.raises(ValueError, match=r"^KV cache: 33 new tokens do not fit a cache of 32 positions"):
        eqx.filter_eval_shape(lambda m, t: m.hidden(t, cache=m.init_cache(1)), model, jnp.zeros((1, 33), jnp.int32))


def test_decoding_runs_the_models_own_blocks(model, monkeypatch):
    """A change to the model's block reaches the cached decoder too: it has no arithmetic of its own."""
    import models.block as block

    original = block.Block.__call__

    def changed(self, x, *args, **kwargs):
        y, cache = original(self, x, *args, **kwargs)
        return y + 3.0 * jnp.roll(x, 1, axis=-1), cache  # a different model

    prompts = [[1, 2, 3], [7, 8]]
    before = generate(model, prompts, 10, temperature=0.0)
    monkeypatch.setattr(block.Block, "__call__", changed)
    jax.clear_caches()  # the compiled decoders traced the original block
    try:
        after = generate(model, prompts, 10, temperature=0.0)
        assert after != before
        assert after == generate_no_cache(model, prompts, 10, temperature=0.0)
    finally:
        monkeypatch.undo()
        jax.clear_caches()  # nothing compiled from the changed block outlives the test


def test_the_cache_filled_in_two_chunks_equals_one_pass(model):
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 20)), jnp.int32)
    whole, _ = model.hidden(tokens)
    h_first, cache = model.hidden(tokens[:, :12], cache=model.init_cache(2))
    h_rest, cache = model.hidden(tokens[:, 12:], cache=cache)  # 8 new tokens per row on top of 12 cached
    # two programs (a cache filled in two chunks, one pass): a few ulp of |h| ~ 8 (~1e-6); 1e-4
    np.testing.assert_allclose(np.concatenate([h_first, h_rest], axis=1), whole, atol=1e-4)  # |h| ~ 8
    assert cache.lengths.tolist() == [20, 20]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"temperature": -1.0}, "temperature: must be a finite number >= 0"),
        ({"temperature": float("nan")}, "temperature: must be a finite number >= 0"),  # it drew id 0 every time
        ({"top_k": -2}, "top_k: must be >= 1"),
        ({"top_p": 0.0}, r"top_p: must be in \(0, 1\]"),
    ],
)
def test_sampling_options_that_change_the_distribution_are_one_line(model, options, message):
    """A negative temperature samples the least likely tokens first: refused by both decoders before any work."""
    for decode in (generate, generate_no_cache):
        with pytest.raises(ConfigError, match=f"^{message}"):
            decode(model, [[1, 2]], 4, **options)


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--top-k", "-1"], "error: --top-k: must be >= 1, or 0 / none for every token; got -1"),
        (
            ["--temperature", "nan"],
            "error: --temperature: must be a finite number >= 0 (0: the most likely token); got nan",
        ),
        (["--top-p", "0"], "error: --top-p: must be in (0, 1]; got 0.0"),
        (["--top-k", "x"], "error: argument --top-k: must be an int, or none for every id; got 'x'"),
        (["--top-k", "none"], "error: path: {missing} does not exist"),  # taken, as the line for -1 offers
    ],
)
def test_sample_names_its_own_flags_before_it_loads_anything(tmp_path, monkeypatch, capsys, flags, line):
    """The sampling tool's refusals named the library's arguments (`top_k`), and `--top-k none` was no int."""
    from helpers import script_in_process

    missing = tmp_path / "no-run"
    result = script_in_process("scripts.tools.sample", [str(missing), *flags], monkeypatch, capsys)
    assert result.returncode != 0 and result.stderr.strip() == line.format(missing=missing)


def test_top_k_and_top_p_sample_only_from_the_most_likely_tokens(model):
    probabilities = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    logits = jnp.log(jnp.asarray(probabilities))[None]
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)

    def drawn(top_k=None, top_p=None):
        ids = np.asarray(jax.vmap(lambda k: sample_logits(logits, k, 1.0, top_k, top_p))(keys))[:, 0]
        return np.bincount(ids, minlength=5) / len(ids)

    np.testing.assert_allclose(drawn(), probabilities, atol=0.03)  # unrestricted: the model's distribution
    np.testing.assert_allclose(drawn(top_k=2), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0], atol=0.03)
    nucleus = [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0]
    np.testing.assert_allclose(drawn(top_p=0.8), nucleus, atol=0.03)  # p in (0.7, 0.85]
    np.testing.assert_allclose(drawn(top_p=0.6), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0], atol=0.03)  # p in (0.4, 0.7]
    # Through the decoder: keeping one token at temperature 1 is greedy decoding.
    prompts = [[1, 2, 3], [7, 8]]
    greedy = generate(model, prompts, 10, temperature=0.0)
    assert generate(model, prompts, 10, temperature=1.0, seed=3) != greedy
    assert generate(model, prompts, 10, temperature=1.0, top_k=1, seed=3) == greedy
    assert generate(model, prompts, 10, temperature=1.0, top_p=1e-6, seed=3) == greedy
    # A tiny temperature is greedy too (dividing the logits themselves by it made every one +-inf: id 0 was drawn)
    assert np.asarray(sample_logits(jnp.asarray([[1.0, 3.0, 2.0, -1.0]]), keys[0], 1e-38, None, None)).tolist() == [1]
    assert generate(model, prompts, 10, temperature=1e-39, seed=3) == greedy


# The modern decoders' options, all covered by two models (models/gpt.py): the KV cache holds n_kv_head heads and the
# rotary positions of cached tokens, and decoding must still be the no-cache decoding.
MODERN_OPTIONS = {
    "llama": dict(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, tie_embeddings=False, bias=False),
    "speedrun": dict(
        position="rope",
        rope_theta=500.0,
        norm="rmsnorm",
        norm_weight=False,
        mlp="relu2",
        n_kv_head=1,
        qk_norm=True,
        tie_embeddings=False,
        logit_softcap=5.0,
        mlp_hidden=48,
    ),
    "window": dict(attention_window=5),  # sliding-window attention: the cache's early keys fall out of sight
}


@pytest.mark.parametrize("options", MODERN_OPTIONS)
def test_cached_decoding_equals_no_cache_decoding_for_every_option(options):
    cfg = GPTConfig(
        vocab_size=50, n_layer=2, n_head=4, n_embd=32, context_size=32, scan_layers=False, **MODERN_OPTIONS[options]
    )
    model = jax.tree.map(lambda x: 8.0 * x, GPT.init(cfg, jax.random.PRNGKey(3)))
    assert model.init_cache(1).k.shape == (2, 1, 32, cfg.kv_heads, 8)  # [L, B, C, K, H]: K heads, not N

    if options in ("llama", "window"):  # several new tokens on top of a filled cache (generate adds one at a time)

        @eqx.filter_jit
        def in_two_chunks_and_at_once(model, tokens):
            h_first, cache = model.hidden(tokens[:, :12], cache=model.init_cache(2))
            h_rest, _ = model.hidden(tokens[:, 12:], cache=cache)
            return jnp.concatenate([h_first, h_rest], axis=1), model.hidden(tokens)[0]

        tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 20)))
        chunked, whole = in_two_chunks_and_at_once(model, tokens)
        # |h| ~ 25 under the 8x weights: the two programs' sums in other orders differ by 1e-5-2.4e-4 over init keys
        # 0-5, where a window one position wider moves h by 22
        np.testing.assert_allclose(chunked, whole, atol=1e-3)
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 9, 10, 11, 12, 13]]
    cached = generate(model, prompts, 12, temperature=0.0)
    assert cached == generate_no_cache(model, prompts, 12, temperature=0.0)
    assert len({t for row in cached for t in row}) > 3  # the tokens depend on the context
