"""Every optimizer preset (conf/optimizer/*.yaml) as a user gets it: it owns its schedule (conf/config.yaml sets no
optimizer value), the step size it names is the one the optimizer applies, and at its own settings it lowers
gpt2-tiny's loss in a short run of the pipeline's step."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from helpers import ROOT, build, tiny_overrides
from optimizers import build_optimizer, lr_schedule_of, own_warmups_in_steps
from optimizers.registry import LR_USE
from training.config import load_config

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "optimizer").glob("*.yaml"))
STEPS = 12


def preset(name: str) -> dict:
    return yaml.safe_load((ROOT / "conf" / "optimizer" / f"{name}.yaml").read_text())


def test_every_registered_optimizer_has_a_preset_and_config_yaml_sets_no_optimizer_value():
    assert set(PRESETS) == set(LR_USE)
    config = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    assert set(config) == {"defaults", "hydra"}  # nothing after `_self_` that would override every preset


@pytest.mark.parametrize("name", PRESETS)
def test_the_composed_config_carries_the_presets_own_step_size(name):
    """`python train_jax.py optimizer=X --cfg job` shows X's step size: its schedule's lr, warmup and floor where it
    takes the run's schedule, and its own key (sf_lr, d0, alpha) where it sets or estimates its step size itself."""
    cfg, own = load_config([f"optimizer={name}"]).optimizer, preset(name)
    if LR_USE[name] != "own":
        assert {k: getattr(cfg.lr_config, k) for k in own["lr_config"]} == own["lr_config"]
    if LR_USE[name] != "schedule":  # an estimate's start (prodigy, dadapt_adamw), or its own step size
        step_size = {"prodigy": "d0", "dadapt_adamw": "d0", "cocob": "alpha"}.get(name, "sf_lr")
        assert getattr(cfg, step_size) == own[step_size]


@pytest.mark.parametrize("lr_config", ["constant", "linear", "cosine", "trapezoid"])
def test_a_small_lr_is_valid_with_any_schedule(lr_config):
    """The floor is a fraction of the lr, so no lr is below it (an absolute floor made lr < 2e-4 a config error)."""
    cfg = load_config([f"optimizer/lr_config={lr_config}", "optimizer.lr_config.lr=1e-5"])
    assert cfg.optimizer.lr_config.lr == 1e-5


@pytest.mark.parametrize("name", PRESETS)
def test_each_preset_applies_its_schedule_and_lowers_the_loss(name, data_cache):
    """12 steps of gpt2-tiny with one block at the preset's own settings (its warmup a fraction of these 12 steps):
    the lr the step applied at each step is the preset's schedule there, and the train loss falls. One block, since
    what is checked here is the preset, not depth: these 22 tests take 0.7x the time they take with two (every
    optimizer on two blocks: tests/test_optim.py's learn-and-resume test). Prodigy and D-Adaptation at their papers'
    lr 1: at the presets' 0.25 (the leaderboard's best over 80 steps) their estimate grows past these 12 steps."""
    estimate = ["optimizer.lr_config.lr=1"] if LR_USE[name] == "estimate" else []
    overrides = [
        o
        for o in tiny_overrides(
            data_cache, f"optimizer={name}", f"train.max_steps={STEPS}", "model.n_layer=1", *estimate
        )
        if not o.startswith("optimizer.lr_config.warmup")
    ]
    parts = build(overrides)
    applied = lr_schedule_of(parts.cfg.optimizer, parts.schedule)
    metrics = [jax.device_get(parts.step(s)) for s in range(STEPS)]
    logged = [float(m["lr"]) for m in metrics]
    # the same float32 schedule, in the step's lr program and eagerly here: a rounding or two apart
    assert logged == pytest.approx([float(np.float32(applied(s))) for s in range(STEPS)], rel=1e-6)
    if LR_USE[name] != "own":
        assert max(logged) == pytest.approx(parts.cfg.optimizer.lr_config.lr, rel=1e-6)  # it reaches its peak
    losses = [float(m["loss"]) for m in metrics]
    # the last three steps' mean well below the first step's (5.4: a byte model at init); noise between batches ~0.1
    assert np.mean(losses[-3:]) < losses[0] - 0.3, losses


def test_the_schedule_free_warmup_is_a_fraction_of_the_run_like_every_presets(data_cache):
    """sf_warmup (the warmup schedule-free runs inside itself) below 1 is a fraction of the run, as lr_config.warmup:
    the pipeline's optimizer with sf_warmup 0.5 of 20 steps steps exactly as one built with sf_warmup 10, and not as
    one built with the fraction read as steps (full lr from the first step)."""
    parts = build(
        tiny_overrides(
            data_cache,
            "optimizer=schedule_free_adamw",
            "optimizer.lr_config.warmup=0",  # its own (sf_warmup), not the run schedule's, which does not reach it
            "train.max_steps=20",
            "optimizer.sf_warmup=0.5",
        )
    )
    assert parts.cfg.optimizer.sf_warmup == 0.5
    assert own_warmups_in_steps(parts.cfg.optimizer, 20).sf_warmup == 10
    assert own_warmups_in_steps(dataclasses.replace(parts.cfg.optimizer, sf_warmup=7), 20).sf_warmup == 7
    params = eqx.filter(parts.state.model, eqx.is_array)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)

    def first_updates(optimizer):
        first = jax.jit(lambda g, p: optimizer.update(g, optimizer.init(p), p, lr=jnp.float32(1.0))[0])
        return jax.tree.leaves(first(grads, params))

    ours = first_updates(parts.optimizer)
    for sf_warmup, same in ((10, True), (0.5, False)):
        other = build_optimizer(
            dataclasses.replace(parts.cfg.optimizer, sf_warmup=sf_warmup), parts.schedule, parts.state.model, 1
        )
        assert all(np.array_equal(a, b) for a, b in zip(ours, first_updates(other))) == same, sf_warmup
