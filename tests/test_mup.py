"""μP (models/mup.py): the coordinate check keeps activation scale flat across widths while standard
parametrization's grows; at its base width μP is standard GPT-2 exactly; bad settings are one config line."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

from core.errors import ConfigError
from models.config import GPTConfig
from models.gpt import GPT
from models.hf import gpt2_problem
from optimizers import build_optimizer, build_schedule
from training.analysis.coord_check import coord_check, growth
from training.config import load_config

WIDTHS = [16, 128]  # 8x from the narrowest (μP's base) to the widest: the check compares these two


def test_the_coordinate_check_is_flat_under_mup_and_grows_under_standard():
    """Two Adam steps at lr 1e-2 on real text: how much the residual stream and the logits moved, widest over
    narrowest. Standard: the update's effect grows with width (here ~6x over 8x width); μP: within 1.5x."""
    kwargs = dict(steps=2, lr=1e-2, n_layer=1, n_head=2, length=32, batch=4)
    standard, mup = coord_check(WIDTHS, "standard", **kwargs), coord_check(WIDTHS, "mup", **kwargs)
    for name in ("block0", "logits"):
        assert growth(standard, name) > 3.0, (name, standard["change"][name])
        assert 1 / 1.5 < growth(mup, name) < 1.5, (name, mup["change"][name])
    assert 1 / 1.5 < growth(mup, "embedding") < 1.5  # the embedding is width-independent in both


def test_mup_at_its_base_width_is_standard_gpt2_exactly():
    base = dict(vocab_size=64, n_layer=2, n_head=2, n_embd=32, context_size=16)
    standard = GPT.init(GPTConfig(**base), jax.random.PRNGKey(0))
    mup = GPT.init(GPTConfig(**base, parametrization="mup", mup_base_width=32), jax.random.PRNGKey(0))
    # exact on any CPU: at the base width every μP multiplier is exactly 1.0, XLA's simplifier drops x * 1.0, and
    # IEEE's x * 1.0 == x where it stays
    for a, b in zip(
        jax.tree.leaves(eqx.filter(standard, eqx.is_array)), jax.tree.leaves(eqx.filter(mup, eqx.is_array))
    ):
        assert jnp.array_equal(a, b)
    tokens = jnp.arange(32).reshape(2, 16) % 64
    assert jnp.array_equal(standard(tokens), mup(tokens))
    # away from it: hidden init / sqrt(m), scores and readout scaled, hidden lr / m (embeddings and vectors as they are)
    wide = GPT.init(
        GPTConfig(**{**base, "n_embd": 128}, parametrization="mup", mup_base_width=32), jax.random.PRNGKey(0)
    )
    # sample std of 131k (8k for wte below) normal draws: < 1% statistical spread; 5% tells 0.01 from 0.02
    assert float(jnp.std(wide.blocks.fc.weight)) == pytest.approx(0.02 / 2, rel=0.05)
    assert float(jnp.std(wide.wte)) == pytest.approx(0.02, rel=0.05)
    cfg = load_config(
        [
            "optimizer=adamw",
            "optimizer.grad_clip=0",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.warmup=0",
            "optimizer.weight_decay=0",
        ],
        num_local_devices=1,
    )
    standard_wide = GPT.init(GPTConfig(**{**base, "n_embd": 128}), jax.random.PRNGKey(0))
    for model, hidden_step in ((wide, 1 / 4), (standard_wide, 1.0)):
        params = eqx.filter(model, eqx.is_array)
        opt = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 10), model, 1)
        updates, _ = jax.jit(lambda p: opt.update(jax.tree.map(jnp.ones_like, p), opt.init(p), p))(params)
        lr = cfg.optimizer.lr_config.lr  # Adam's first step on gradients of 1 is lr / (1 + eps): rel 1e-3 is plenty
        assert float(jnp.max(jnp.abs(updates.blocks.fc.weight))) == pytest.approx(lr * hidden_step, rel=1e-3)
        assert float(jnp.max(jnp.abs(updates.wte))) == pytest.approx(lr, rel=1e-3)


def test_mup_settings_checked_at_the_door():
    with pytest.raises(ConfigError, match="^config: model.mup_base_width: must be"):
        load_config(["model.parametrization=mup", "model.mup_base_width=0"], num_local_devices=1)
    # the base has this model's heads: gpt2-mini's 6 at gpt2-micro's 256 were 42.7-wide heads, its scores scaled by
    # 1/sqrt(1.5) where the head size (64) had not changed
    mini = ["model=gpt2-mini", "model.parametrization=mup"]
    with pytest.raises(ConfigError, match=r"^config: model.mup_base_width: 256 is not a multiple of model.n_head=6"):
        load_config(mini, num_local_devices=1)
    assert load_config([*mini, "model.mup_base_width=192"], num_local_devices=1).model.mup_base_width == 192
    from omegaconf import OmegaConf

    from training.config import to_yaml
    from training.config.compose import finish

    saved = OmegaConf.create(to_yaml(load_config([*mini, "model.mup_base_width=192"], num_local_devices=1)))
    saved.model.mup_base_width = 256  # a run that trained so resumes as it was
    assert finish(saved, 1, saved=True).model.mup_base_width == 256
    wide = GPTConfig(
        vocab_size=64, n_layer=1, n_head=2, n_embd=64, context_size=8, parametrization="mup", mup_base_width=32
    )
    assert "parametrization=mup" in gpt2_problem(wide)


def test_the_coordinate_check_script_refuses_bad_arguments_in_one_line_before_it_computes(
    tmp_path, monkeypatch, capsys
):
    from helpers import script_in_process

    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "a-link").symlink_to(tmp_path / "gone")  # a link to nothing: no folder can be made through it
    for args, code, why in (
        (["--heads", "0"], 2, "argument --heads: must be >= 1; got 0"),  # argparse's usage error (was a division)
        (["--out", str(tmp_path / "coord.json")], 2, f"error: --out: {tmp_path / 'coord.json'}: a picture's name"),
        (["--out", str(tmp_path / "a-file" / "c.png")], 2, f"error: --out: {tmp_path / 'a-file'} is a file"),
        (["--out", str(tmp_path / "a-link" / "c.png")], 2, f"error: --out: {tmp_path / 'a-link'} is a file"),
        (["--widths", "8,16", "--heads", "2", "--optimizer", "bogus", "--out", str(tmp_path / "c.png")], 2, "bogus"),
        # the first width is μP's base and the verdict compares the last with it: an order it would misread
        (
            ["--widths", "16,8", "--heads", "2", "--out", str(tmp_path / "c.png")],
            2,
            "--widths: two or more, increasing",
        ),
        (["--widths", "8,8", "--heads", "2", "--out", str(tmp_path / "c.png")], 2, "--widths: two or more, increasing"),
    ):
        result = script_in_process("scripts.experiments.coord_check", args, monkeypatch, capsys)
        assert result.returncode == code and why in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and result.stderr.strip().splitlines()[-1].startswith(
            ("error:", "coord_check.py: error:", "__main__.py: error:")
        ), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a-link"]  # nothing written


def test_the_transfer_script_refuses_widths_out_of_order_in_one_line_before_it_runs(tmp_path, monkeypatch, capsys):
    """The first width is μP's base and the table reads the others against it: 256,64 or a repeated width was
    misread. Each refusal names its flag and what was given."""
    from helpers import script_in_process

    widths_rule = "--widths: two or more, increasing (the first is μP's base), each >= 1"
    for given, why in (
        (["--widths", "256,64"], f"{widths_rule}; got 256,64"),
        (["--widths", "64,64"], f"{widths_rule}; got 64,64"),
        (["--widths", "0,64"], f"{widths_rule}; got 0,64"),
        (["--widths", "64"], f"{widths_rule}; got 64"),
        (["--lrs", "1e-2,0"], "--lrs: each > 0; got 1e-2,0"),
        (["--steps", "0"], "--steps: >= 1; got 0"),
    ):
        out = tmp_path / "transfer"
        args = ["--widths", "64,256", "--lrs", "1e-2", "--steps", "2", "--out", str(out), *given]
        result = script_in_process("scripts.experiments.mup_transfer", args, monkeypatch, capsys)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [f"error: {why}"], result.stderr
        assert not out.exists()  # nothing run, nothing written


def test_the_transfer_table_marks_a_width_where_every_lr_failed(tmp_path):
    """A width whose every run diverged (failed, or ended non-finite) is a row of "diverged" with no best lr, beside a
    width that has one: the table and picture are still written."""
    from scripts.experiments.mup_transfer import write_results

    rows = lambda width, losses: [  # noqa: E731
        {"width": width, "lr": lr, "val_loss": loss} for lr, loss in zip((1e-3, 1e-2), losses)
    ]
    results = {
        "standard": rows(16, (3.2, 3.1)) + rows(64, (None, None)),
        "mup": rows(16, (3.2, 3.1)) + rows(64, (3.3, 3.0)),
    }
    lines = write_results(tmp_path, results, [16, 64], [1e-3, 1e-2], 10)
    assert "| standard | 64 | diverged | diverged | none |" in lines
    assert "| standard | 16 | 3.2000 | 3.1000 | 0.01 |" in lines and "| mup | 64 | 3.3000 | 3.0000 | 0.01 |" in lines
    assert (tmp_path / "transfer.md").read_text().splitlines() == lines and (tmp_path / "transfer.png").stat().st_size


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("config: optimizer.lr_config.warmup: 10 steps exceed the schedule's 4", 1),
        ("step 3: the training loss is nan; stopping (no checkpoint of this state is written)", 0),
    ],
    ids=["failed", "diverged"],
)
def test_the_transfer_script_fails_in_one_line_when_jobs_fail_and_tables_divergence(
    tmp_path, monkeypatch, capsys, error, code
):
    """Jobs that failed for another reason than a non-finite loss (a fixed 10-step warmup in a 4-step run: every
    one) were tabled as 'diverged' with no best lr, and the script exited 0."""
    from scripts.experiments import mup_transfer

    def run_sweep(out, overrides):
        jobs = []
        for i, (width, lr) in enumerate([(64, 0.01), (64, 0.1), (256, 0.01), (256, 0.1)]):
            job = {"job": i, "overrides": [f"model.n_embd={width}", f"optimizer.lr_config.lr={lr}"]}
            bad = lr == 0.1
            jobs.append(
                {**job, "status": "failed", "error": error} if bad else {**job, "status": "completed", "val_loss": 3.0}
            )
        return {"jobs": jobs}

    monkeypatch.setattr(mup_transfer, "run_sweep", run_sweep)
    argv = ["--widths", "64,256", "--lrs", "0.01,0.1", "--steps", "4", "--out", str(tmp_path)]
    assert mup_transfer.main(argv) == code
    err = capsys.readouterr().err
    if code:
        assert err == (
            f"error: mup_transfer: 2 of 4 standard jobs failed, e.g. job 1: {error}; {tmp_path / 'standard'}/sweep.md "
            "lists them\n"
        )
    else:
        assert "| standard | 64 | 3.0000 | diverged | 0.01 |" in (tmp_path / "transfer.md").read_text()
