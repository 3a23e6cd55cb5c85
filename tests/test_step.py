"""The compiled train step: accumulation with optax.MultiSteps, and sharding over 8 host devices."""

import equinox as eqx
import jax
import numpy as np

from helpers import build, tiny_overrides


def run_steps(overrides, steps=3):
    parts = build(overrides)
    losses = [float(parts.step(s)["loss"]) for s in range(steps)]
    return losses, jax.device_get(eqx.filter(parts.state.model, eqx.is_array))


def max_param_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_k_micro_batches_equal_one_batch_k_times_larger(data_cache):
    base = tiny_overrides(data_cache, "optimizer=sgdm", "optimizer.lr_config.lr=0.1")
    accumulated = run_steps(base + ["train.batch_size=4", "train.grad_accum_steps=2"])
    one_batch = run_steps(base + ["train.batch_size=8", "train.grad_accum_steps=1"])
    np.testing.assert_allclose(accumulated[0], one_batch[0], atol=1e-5)
    assert max_param_diff(accumulated[1], one_batch[1]) <= 1e-5


def test_k_micro_batches_with_adamw_track_the_big_batch(data_cache):
    base = tiny_overrides(data_cache)
    accumulated = run_steps(base + ["train.batch_size=4", "train.grad_accum_steps=2"])
    one_batch = run_steps(base + ["train.batch_size=8", "train.grad_accum_steps=1"])
    np.testing.assert_allclose(accumulated[0], one_batch[0], atol=1e-5)
    assert max_param_diff(accumulated[1], one_batch[1]) <= 1e-4


def test_step_sharded_over_8_devices_equals_the_1_device_step(data_cache):
    base = tiny_overrides(data_cache, "train.batch_size=8")
    single = run_steps(base + ["system.num_devices=1"])
    sharded = run_steps(base + ["system.num_devices=8"])
    np.testing.assert_allclose(single[0], sharded[0], atol=1e-5)
    assert max_param_diff(single[1], sharded[1]) <= 1e-5


def test_the_step_donates_the_old_state(data_cache):
    parts = build(tiny_overrides(data_cache))
    old = parts.state
    parts.step(0)
    assert old.model.wte.is_deleted() and int(parts.state.step) == 1


def test_training_lowers_the_loss_on_real_text(data_cache):
    parts = build(tiny_overrides(data_cache, "train.max_steps=30", "optimizer.lr_config.lr=3e-3"))
    losses = [float(parts.step(s)["loss"]) for s in range(30)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses
