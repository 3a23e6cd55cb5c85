"""Hugging Face interop: export loads in transformers with the same logits; import -> export is bit-exact."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest

from core.errors import ConfigError, DataError
from helpers import build, read_metrics, run_cli, tiny_overrides
from training import config as config_lib
from training.checkpoints.resume import plan_run, restore_state

pytestmark = pytest.mark.e2e


def bpe_overrides(cache: str, *extra: str) -> list[str]:
    return tiny_overrides(cache, "dataset.tokenizer=bpe", "dataset.bpe_vocab_size=400", *extra)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_cache):
    root = tmp_path_factory.mktemp("hf")
    run = run_cli(bpe_overrides(data_cache, f"logging.run_dir={root / 'run'}"))
    assert run.returncode == 0, run.stderr[-2000:]
    from scripts.tools.export_hf import main as export  # the tool's main, in this process

    assert export([str(root / "run"), str(root / "export")]) == 0
    return root


def test_transformers_loads_the_export_with_the_same_logits(exported):
    # Imported here, not at the top: collecting the suite would load torch (2.5 s) in every worker. The pinned CPU
    # wheels (requirements-test.txt): a missing one fails this test, never skips it.
    import torch
    import transformers

    from training.checkpoints.trained import load_trained

    trained = load_trained(str(exported / "run"))
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(exported / "export")).eval()
    assert hf.config.n_layer == 2 and hf.config.vocab_size == trained.tokenizer.vocab_size == 400
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied, as ours
    tokens = np.random.default_rng(0).integers(0, 400, (2, 64)).astype(np.int32)
    ours = np.asarray(trained.model(tokens))[:, :, :400]
    with torch.no_grad():
        theirs = hf(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert np.abs(ours - theirs).max() <= 1e-4  # JAX and PyTorch, float32: a few ulp each (~1e-6)


def test_the_exported_tokenizer_encodes_as_ours(exported):
    import transformers

    from training.checkpoints.trained import load_trained

    tok = load_trained(str(exported / "run")).tokenizer
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(exported / "export"))
    text = "def parse(line):\n    return line.split(',')  # é"
    assert hf_tok.encode(text) == tok.encode(text)
    assert hf_tok.eos_token_id == tok.eos_id and hf_tok.pad_token_id == tok.pad_id


def test_import_then_export_is_bit_exact(exported, data_cache, tmp_path):
    from safetensors.numpy import load_file

    from models.hf import export_hf

    overrides = bpe_overrides(data_cache, f"init_from=hf:{exported / 'export'}", f"logging.run_dir={tmp_path / 'r'}")
    cfg = config_lib.load_config(overrides)
    plan = plan_run(cfg, overrides, 0)
    parts = build(overrides, plan.init_from)
    state = restore_state(parts.state, plan)
    assert int(state.step) == 0 and parts.tokenizer.to_json() == json.loads(
        (exported / "export" / "gpt_jax_tokenizer.json").read_text()
    )
    export_hf(state.model, parts.tokenizer, tmp_path / "again")
    first, again = (
        load_file(str(exported / "export" / "model.safetensors")),
        load_file(str(tmp_path / "again" / "model.safetensors")),
    )
    assert sorted(first) == sorted(again)
    for name in first:
        assert first[name].dtype == again[name].dtype and np.array_equal(first[name], again[name]), name


def test_fine_tuning_starts_from_imported_weights(exported, data_cache, tmp_path):
    run_dir = tmp_path / "ft"
    result = run_cli(
        bpe_overrides(
            data_cache, f"init_from=hf:{exported / 'export'}", f"logging.run_dir={run_dir}", "train.eval_at_start=true"
        )
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"weights from hf:{exported / 'export'}" in result.stdout
    start = read_metrics(run_dir, "val")[0]
    trained_end = read_metrics(exported / "run", "val")[-1]
    # the same weights (export and import copy them bit for bit) in another run's eval: a few ulp of a loss ~5
    assert start["step"] == 0 and start["loss"] == pytest.approx(trained_end["loss"], abs=1e-5)


def test_the_keys_a_gpt2_folder_of_another_shape_names_are_all_it_takes(tmp_path):
    """A folder whose MLP width differs beside its shape: its n_inner was compared only once the shape matched, so
    the keys named first (n_layer, n_head, n_embd) were refused again for model.mlp_hidden."""
    from models.hf import check_hf_config

    folder = tmp_path / "hf"
    folder.mkdir()
    shape = {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_inner": 128, "n_positions": 64}
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", **shape}))
    model = config_lib.load_config(["model=gpt2-micro"]).model
    with pytest.raises(ConfigError, match="n_inner=128") as e:
        check_hf_config(folder, model)
    fix = str(e.value).split("; choose the model preset with its shape, or set ")[1].split()
    assert "model.mlp_hidden=128" in fix
    check_hf_config(folder, config_lib.load_config(["model=gpt2-micro", *fix]).model)
    # a config.json that leaves transformers' defaults out (n_embd 768) was a KeyError traceback
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2}))
    with pytest.raises(ConfigError, match=r"n_embd=768 \(run has 256\)"):
        check_hf_config(folder, model)


def test_a_model_that_does_not_match_the_export_is_refused(exported, data_cache, tmp_path):
    overrides = bpe_overrides(data_cache, f"init_from=hf:{exported / 'export'}", "model=gpt2-mini")
    with pytest.raises(ConfigError, match=r"^init_from=hf:.*its n_layer=2 \(run has 6\), n_head=2 \(run has 6\)") as e:
        plan_run(config_lib.load_config(overrides), overrides, 0)
    # the keys it names to set fit the export (it said `e.g. model=gpt2`, which fits it no better)
    fix = str(e.value).split("; choose the model preset with its shape, or set ")[1].split()
    assert fix[:2] == ["model.n_layer=2", "model.n_head=2"]
    plan_run(config_lib.load_config([*overrides, *fix]), [*overrides, *fix], 0)
    overrides = bpe_overrides(data_cache, f"init_from=hf:{exported / 'export'}", "model.bias=false")
    nonzero = r"biases \(transformer\.h\.0\.\S+\.bias is not zero; run has model\.bias=false\)"
    with pytest.raises(ConfigError, match=nonzero):
        plan_run(config_lib.load_config(overrides), overrides, 0)
    # a folder whose biases are all zero (a model.bias=false run's export) computes what the run's model does
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "zero-biases"
    shutil.copytree(exported / "export", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k: 0 * v if k.endswith(".bias") else v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    overrides = bpe_overrides(data_cache, f"init_from=hf:{folder}", "model.bias=false")
    assert plan_run(config_lib.load_config(overrides), overrides, 0).init_from.hf_folder == folder


@pytest.mark.parametrize(
    "key, value",
    [
        ("tie_word_embeddings", False),
        ("scale_attn_weights", False),
        ("scale_attn_by_inverse_layer_idx", True),
        ("layer_norm_epsilon", 0.01),
    ],
)
def test_a_gpt2_folder_that_computes_otherwise_is_refused(exported, data_cache, tmp_path, key, value):
    """transformers' GPT-2 options that change what the model computes (real Hub checkpoints set some): the weights
    would load into this model and compute something else, so the folder is one line instead."""
    folder = tmp_path / "edited"
    shutil.copytree(exported / "export", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    from models.hf import check_hf_config

    model = config_lib.load_config(bpe_overrides(data_cache)).model
    check_hf_config(exported / "export", model)  # the export itself passes
    with pytest.raises(ConfigError, match=rf"^init_from=hf:{folder}: its {key}={value} is "):
        check_hf_config(folder, model)


def test_a_half_precision_folder_imports_into_float32_parameters(exported, data_cache, tmp_path):
    """A folder saved in float16 (transformers' save of a half-precision model): the run's parameters stay float32,
    each the folder's value."""
    from safetensors.numpy import load_file, save_file

    from models.hf import load_hf_model

    folder = tmp_path / "half"
    shutil.copytree(exported / "export", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k: v.astype(np.float16) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    overrides = bpe_overrides(data_cache, f"init_from=hf:{folder}")
    parts = build(overrides, plan_run(config_lib.load_config(overrides), overrides, 0).init_from)
    model = load_hf_model(folder, parts.state.model, jax.random.PRNGKey(0))
    assert {x.dtype for x in jax.tree.leaves(model)} == {np.dtype(np.float32)}
    np.testing.assert_array_equal(model.wpe, tensors["transformer.wpe.weight"].astype(np.float16).astype(np.float32))


def test_a_base_models_folder_imports_and_a_foreign_or_broken_one_is_one_line(exported, data_cache, tmp_path):
    """GPT-2's own Hub checkpoint is a GPT2Model's: its tensors are named without `transformer.` (transformers reads
    both). Another vocabulary's rows, a cut config.json or model.safetensors: one line each, never a traceback nor
    a run whose ids mean other tokens."""
    from safetensors.numpy import load_file, save_file

    from models.hf import load_hf_model

    tensors = load_file(str(exported / "export" / "model.safetensors"))
    overrides = bpe_overrides(data_cache, f"init_from=hf:{exported / 'export'}")
    parts = build(overrides, plan_run(config_lib.load_config(overrides), overrides, 0).init_from)
    like, key = parts.state.model, jax.random.PRNGKey(0)
    ours = load_hf_model(exported / "export", like, key)

    def edited(name: str, tensors: dict | None = None, **files: bytes):
        folder = tmp_path / name
        shutil.copytree(exported / "export", folder)
        if tensors is not None:
            save_file(tensors, str(folder / "model.safetensors"))
        for file, data in files.items():
            (folder / file.replace("_", ".")).write_bytes(data)
        return folder

    base = edited("base", {k.removeprefix("transformer."): v for k, v in tensors.items()})
    for a, b in zip(jax.tree.leaves(load_hf_model(base, like, key)), jax.tree.leaves(ours)):
        np.testing.assert_array_equal(a, b)
    wte = tensors["transformer.wte.weight"]
    for rows in (wte.shape[0] - 2, wte.shape[0] - 3):  # two rows fewer: <PAD> and <GENAI>, drawn fresh
        folder = edited(f"rows{rows}", {**tensors, "transformer.wte.weight": wte[:rows]})
        if rows == wte.shape[0] - 2:
            np.testing.assert_array_equal(load_hf_model(folder, like, key).wte[:rows], wte[:rows])
            continue
        with pytest.raises(DataError, match=rf"the checkpoint has {rows} token rows, and the tokenizer 400 ids"):
            load_hf_model(folder, like, key)
    raw = (exported / "export" / "model.safetensors").read_bytes()
    folder = edited("cut", model_safetensors=raw[: len(raw) // 2])
    with pytest.raises(DataError, match=rf"^init_from=hf:{folder}: model.safetensors unreadable \(.*\); corrupt\?$"):
        load_hf_model(folder, like, key)
    folder = edited("config", config_json=b'{"model_type": "gpt2",')
    with pytest.raises(DataError, match=rf"^init_from=hf:{folder}: config.json unreadable \(.*\); corrupt\?$"):
        plan_run(config_lib.load_config(o := bpe_overrides(data_cache, f"init_from=hf:{folder}")), o, 0)
    folder = edited("missing", {k: v for k, v in tensors.items() if "h.1.mlp" not in k})
    with pytest.raises(DataError, match=r"has no tensor 'transformer.h.1.mlp.c_fc.weight'; not this model's"):
        load_hf_model(folder, like, key)


def test_a_hub_id_offline_is_one_line(tmp_path):
    result = run_cli(
        [
            "model=gpt2",
            "dataset.tokenizer=gpt2",
            "init_from=hf:openai-community/gpt2-no-such",
            f"dataset.cache_dir={tmp_path}",
            "logging.wandb=disabled",
        ],
        timeout=180,
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: init_from=hf:openai-community/gpt2-no-such: not a local folder, and the Hub download failed"
        )
    )


def test_export_refuses_a_folder_in_use(exported, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    result = run_cli([str(exported / "run"), str(tmp_path / "busy")], module="scripts.tools.export_hf")
    assert (
        result.returncode == 1
        and result.stderr.strip() == f"error: {tmp_path / 'busy'} is not empty; choose a new folder for the export"
    )
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"

    (tmp_path / "a-file").write_text("mine")  # a file where the folder goes, or above it: one line before any work
    for out in (tmp_path / "a-file", tmp_path / "a-file" / "sub"):
        result = run_cli([str(exported / "run"), str(out)], module="scripts.tools.export_hf")
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
        assert result.stderr.startswith(f"error: out_dir: {out}") and "is a file, not a directory" in result.stderr
    assert (tmp_path / "a-file").read_text() == "mine"
    # among a run's steps, a folder named like one became the run's newest step, which no tool could read
    from scripts.tools.export_hf import check_not_among_steps

    steps = exported / "run" / "checkpoints"
    with pytest.raises(ConfigError, match=rf"^out_dir: {steps / '12'} is in {steps}, a run's checkpoints folder"):
        check_not_among_steps(steps / "12")
    step = next(c for c in steps.iterdir() if c.name.isdigit())  # inside a step: deleted with it when it rotates out
    with pytest.raises(ConfigError, match=rf"^out_dir: {step / 'hf' / 'x'} is in {steps}, a run's checkpoints folder"):
        check_not_among_steps(step / "hf" / "x")
    check_not_among_steps(exported / "run" / "export")  # beside the checkpoints folder, in the run's: no step there
    check_not_among_steps(steps / ".." / "export")  # the same folder, spelled through the checkpoints folder


# Llama: in this process, on tiny models (no run needed): our Llama-style GPT <-> transformers' LlamaForCausalLM.
LLAMA_TINY = ["model=llama-tiny", "model.context_size=32"]  # 4 heads of 16 over 2 key/value heads, untied, no biases


def llama_model(overrides: list[str], seed: int = 0):
    """A random model of the run config's `model` section (byte vocabulary), every weight non-trivial (norms too)."""
    import equinox as eqx
    import jax

    from models import gpt_config
    from models.gpt import GPT

    def noisy(cfg, key):
        leaves, treedef = jax.tree.flatten(GPT.init(cfg, key))
        keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
        return jax.tree.unflatten(treedef, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])

    cfg = config_lib.load_config(overrides).model
    return cfg, eqx.filter_jit(noisy)(gpt_config(cfg, 259), jax.random.PRNGKey(seed))


def torch_logits(hf, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return hf(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()


def test_a_llama_run_exports_as_transformers_llama_with_the_same_logits_and_imports_back(tmp_path):
    import equinox as eqx
    import jax
    import transformers

    from data.tokenizers import ByteTokenizer
    from models.hf import check_hf_config, export_hf, load_hf_model

    cfg, model = llama_model(LLAMA_TINY + ["model.rope_theta=2500"])
    assert export_hf(model, ByteTokenizer(), tmp_path / "llama")[:2] == ["config.json", "model.safetensors"]
    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "llama")).eval()
    assert (hf.config.num_key_value_heads, hf.config.intermediate_size, hf.config.tie_word_embeddings) == (
        2,
        192,
        False,
    )
    tokens = np.random.default_rng(0).integers(0, 259, (2, 32)).astype(np.int32)
    forward = eqx.filter_jit(lambda m, x: m(x))
    ours = np.asarray(forward(model, tokens))[:, :, :259]
    assert np.abs(ours - torch_logits(hf, tokens)).max() <= 1e-4  # JAX and PyTorch, float32: a few ulp each
    check_hf_config(tmp_path / "llama", cfg)  # and back: init_from=hf: of the export is the model exported
    back = load_hf_model(tmp_path / "llama", model, jax.random.PRNGKey(2))
    np.testing.assert_array_equal(np.asarray(forward(back, tokens))[:, :, :259], ours)


def test_a_transformers_llama_imports_with_the_same_logits_and_exports_back_bit_exact(tmp_path):
    import equinox as eqx
    import jax
    import torch
    import transformers
    from safetensors.numpy import load_file

    from data.tokenizers import ByteTokenizer
    from models import gpt_config
    from models.gpt import GPT
    from models.hf import check_hf_config, export_hf, load_hf_model

    config = transformers.LlamaConfig(  # tied, with biases: what the export test's model is not
        vocab_size=259,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        max_position_embeddings=32,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms and biases too
    hf.save_pretrained(str(tmp_path / "theirs"))
    (tmp_path / "theirs" / "gpt_jax_tokenizer.json").write_text(json.dumps(ByteTokenizer().to_json()))
    overrides = LLAMA_TINY + [
        "model.mlp_hidden=96",
        "model.rope_theta=500",
        "model.tie_embeddings=true",
        "model.bias=true",
    ]
    cfg = config_lib.load_config(overrides).model
    check_hf_config(tmp_path / "theirs", cfg)
    like = eqx.filter_jit(GPT.init)(gpt_config(cfg, 259), jax.random.PRNGKey(0))
    ours = load_hf_model(tmp_path / "theirs", like, jax.random.PRNGKey(1))
    assert jax.tree.structure(ours) == jax.tree.structure(like)
    tokens = np.random.default_rng(1).integers(0, 259, (2, 32)).astype(np.int32)
    assert (
        np.abs(np.asarray(eqx.filter_jit(lambda m, x: m(x))(ours, tokens))[:, :, :259] - torch_logits(hf, tokens)).max()
        <= 1e-4
    )  # as above
    export_hf(ours, ByteTokenizer(), tmp_path / "again")
    theirs, again = (
        load_file(str(tmp_path / "theirs" / "model.safetensors")),
        load_file(str(tmp_path / "again" / "model.safetensors")),
    )
    assert sorted(theirs) == sorted(again)
    for name in theirs:
        assert np.array_equal(theirs[name], again[name]), name
    with pytest.raises(
        ConfigError,
        match=r"its num_key_value_heads=2 \(run has model.n_kv_head=1\), "
        r"intermediate_size=96 \(run has model.mlp_hidden=192\)",
    ):
        check_hf_config(
            tmp_path / "theirs",
            config_lib.load_config(
                LLAMA_TINY
                + ["model.n_kv_head=1", "model.bias=true", "model.rope_theta=500", "model.tie_embeddings=true"]
            ).model,
        )


def test_a_model_transformers_cannot_express_is_refused_in_one_line(tmp_path):
    import equinox as eqx
    import jax

    from data.tokenizers import ByteTokenizer
    from models import gpt_config
    from models.gpt import GPT
    from models.hf import check_hf_config, export_hf

    def model(*overrides):
        return eqx.filter_eval_shape(
            GPT.init, gpt_config(config_lib.load_config(list(overrides)).model, 259), jax.random.PRNGKey(0)
        )

    with pytest.raises(ConfigError, match=r"^export as llama: model.position=learned: Llama has rotary positions only"):
        export_hf(model("model=gpt2-tiny"), ByteTokenizer(), tmp_path / "a", "llama")
    with pytest.raises(
        ConfigError,
        match=r"^neither transformers' GPT-2 nor its Llama expresses this model: "
        r"model.position=rope: .*; model.mlp=relu2: Llama's MLP is SwiGLU only",
    ):
        export_hf(model("model=modern-gpt"), ByteTokenizer(), tmp_path / "b")
    with pytest.raises(ConfigError, match=r"^export as gpt2: model.position=rope"):
        export_hf(model(*LLAMA_TINY), ByteTokenizer(), tmp_path / "c", "gpt2")
    assert not any((tmp_path / d).exists() for d in "abc") and ConfigError.exit_code == 2
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "llama" / "gpt_jax_tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"a Llama checkpoint, but the run's model.position=learned"):
        check_hf_config(tmp_path / "llama", config_lib.load_config(["model=gpt2-tiny"]).model)
    (tmp_path / "llama" / "gpt_jax_tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"a Llama folder not exported by this pipeline"):
        check_hf_config(tmp_path / "llama", config_lib.load_config(LLAMA_TINY).model)


def test_an_imported_vocabulary_is_padded_with_fresh_rows_and_another_one_is_one_line():
    """GPT-2's and Llama's imports share one padding: the checkpoint's rows first, unchanged, then fresh rows up to
    the model's padded vocabulary (up to two ids fewer: `<PAD>` and `<GENAI>`); more rows than the tokenizer has ids,
    or fewer, is another vocabulary: a DataError naming both counts."""
    import jax

    from core.errors import DataError
    from models.config import GPTConfig
    from models.hf_llama import pad_vocab_rows

    cfg = GPTConfig(vocab_size=100, n_layer=1, n_head=2, n_embd=8, context_size=8)
    rows = np.arange(98 * 8, dtype=np.float32).reshape(98, 8)
    padded = np.asarray(pad_vocab_rows(rows, cfg, jax.random.PRNGKey(0)))
    assert padded.shape == (cfg.padded_vocab_size, 8) and cfg.padded_vocab_size > 100
    assert np.array_equal(padded[:98], rows) and 0 < np.abs(padded[98:]).max() < 1
    for count in (101, 97):
        with pytest.raises(DataError) as failure:
            pad_vocab_rows(np.zeros((count, 8), np.float32), cfg, jax.random.PRNGKey(0), " (dataset.tokenizer=gpt2)")
        assert str(failure.value) == (
            f"the checkpoint has {count} token rows, and the tokenizer 100 ids: it was trained with another "
            "tokenizer; use that one (dataset.tokenizer=gpt2)"
        )
