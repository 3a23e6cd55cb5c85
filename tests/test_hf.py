"""Hugging Face interop: export loads in transformers with the same logits; import -> export is bit-exact."""

from __future__ import annotations

import json
import runpy

import numpy as np
import pytest

from core.errors import ConfigError
from helpers import ROOT, build, read_metrics, run_cli, tiny_overrides
from training import config as config_lib
from training.run import plan_run, restore_state

pytestmark = pytest.mark.e2e


def bpe_overrides(cache: str, *extra: str) -> list[str]:
    return tiny_overrides(cache, "dataset.tokenizer=bpe", "dataset.bpe_vocab_size=400", *extra)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_cache):
    root = tmp_path_factory.mktemp("hf")
    run = run_cli(bpe_overrides(data_cache, f"logging.run_dir={root / 'run'}"))
    assert run.returncode == 0, run.stderr[-2000:]
    export = runpy.run_path(str(ROOT / "scripts" / "export_hf.py"))["main"]  # the script's main, in this process
    assert export([str(root / "run"), str(root / "export")]) == 0
    return root


def test_transformers_loads_the_export_with_the_same_logits(exported):
    # Imported here, not at the top: collecting the suite would load torch (2.5 s) in every worker. The pinned CPU
    # wheels (requirements-test.txt): a missing one fails this test, never skips it.
    import torch
    import transformers

    from training.trained import load_trained

    trained = load_trained(str(exported / "run"))
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(exported / "export")).eval()
    assert hf.config.n_layer == 2 and hf.config.vocab_size == trained.tokenizer.vocab_size == 400
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied, as ours
    tokens = np.random.default_rng(0).integers(0, 400, (2, 64)).astype(np.int32)
    ours = np.asarray(trained.model(tokens))[:, :, :400]
    with torch.no_grad():
        theirs = hf(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert np.abs(ours - theirs).max() <= 1e-4


def test_the_exported_tokenizer_encodes_as_ours(exported):
    import transformers

    from training.trained import load_trained

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
        (exported / "export" / "gpt_jax_tokenizer.json").read_text())
    export_hf(state.model, parts.tokenizer, tmp_path / "again")
    first, again = load_file(str(exported / "export" / "model.safetensors")), load_file(str(tmp_path / "again" / "model.safetensors"))
    assert sorted(first) == sorted(again)
    for name in first:
        assert first[name].dtype == again[name].dtype and np.array_equal(first[name], again[name]), name


def test_fine_tuning_starts_from_imported_weights(exported, data_cache, tmp_path):
    run_dir = tmp_path / "ft"
    result = run_cli(bpe_overrides(data_cache, f"init_from=hf:{exported / 'export'}", f"logging.run_dir={run_dir}",
                                   "train.eval_at_start=true"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"weights from hf:{exported / 'export'}" in result.stdout
    start = read_metrics(run_dir, "val")[0]
    trained_end = read_metrics(exported / "run", "val")[-1]
    assert start["step"] == 0 and start["loss"] == pytest.approx(trained_end["loss"], abs=1e-5)


def test_a_model_that_does_not_match_the_export_is_refused(exported, data_cache, tmp_path):
    overrides = bpe_overrides(data_cache, f"init_from=hf:{exported / 'export'}", "model=gpt2-mini")
    with pytest.raises(ConfigError, match=r"^init_from=hf:.*its n_layer=2 \(run has 6\), n_head=2 \(run has 6\)"):
        plan_run(config_lib.load_config(overrides), overrides, 0)
    overrides = bpe_overrides(data_cache, f"init_from=hf:{exported / 'export'}", "model.bias=false")
    with pytest.raises(ConfigError, match=r"biases \(run has model.bias=false\)"):
        plan_run(config_lib.load_config(overrides), overrides, 0)


def test_a_hub_id_offline_is_one_line(tmp_path):
    result = run_cli(["model=gpt2", "dataset.tokenizer=gpt2", "init_from=hf:openai-community/gpt2-no-such",
                      f"dataset.cache_dir={tmp_path}", "logging.wandb=disabled"], timeout=180)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: init_from=hf:openai-community/gpt2-no-such: not a local folder, and the Hub download failed")


def test_export_refuses_a_folder_in_use(exported, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    result = run_cli([str(exported / "run"), str(tmp_path / "busy")], script="scripts/export_hf.py")
    assert result.returncode == 1 and result.stderr.strip() == f"error: {tmp_path / 'busy'} is not empty; choose a new folder for the export"
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
