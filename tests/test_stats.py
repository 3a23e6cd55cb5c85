"""Training statistics: each checked against a hand computation; knobs off cost no memory; buffers resume exactly."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.errors import ConfigError
from helpers import build, tiny_overrides
from training import config as config_lib
from training.distributed.sharding import put_batch
from training.step.losses import mean_loss
from training.step.stats import statistics_of

ALL_KNOBS = (
    "logging.log_callback_data=true",
    "logging.store_last_grads=true",
    "logging.store_past_grads=true",
    "logging.store_last_params=true",
    "logging.compute_last_loss=true",
    "logging.compute_last_grads=true",
    "logging.running_stats_window=3",
)


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def layer_norms(tree) -> np.ndarray:
    return np.sqrt(
        sum(
            np.sum(np.square(np.asarray(x, np.float64)), axis=tuple(range(1, x.ndim)))
            for x in jax.tree.leaves(tree.blocks)
        )
    )


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_every_statistic_matches_a_hand_computation(data_cache):
    parts = build(tiny_overrides(data_cache, *ALL_KNOBS, "train.grad_accum_steps=2"))
    model0 = parts.state.model

    loss_and_grad = eqx.filter_jit(eqx.filter_value_and_grad(mean_loss))

    def hand_loss_and_grad(params, batch):
        """f and ∇f over the step's two micro-batches, computed directly."""
        model = eqx.combine(params, model0)
        losses, grads = zip(
            *[loss_and_grad(model, jax.tree.map(lambda x: x[i], batch), None, jnp.float32) for i in range(2)]
        )
        return (
            float(np.mean(losses)),
            (flat(grads[0]) + flat(grads[1])) / 2,
            jax.tree.map(
                lambda a, b: (a + b) / 2, eqx.filter(grads[0], eqx.is_array), eqx.filter(grads[1], eqx.is_array)
            ),
        )

    history = {name: [] for name in ("param_norm", "update_norm", "grad_dot_update")}
    past_grads, last_grad, last_params = [], None, None
    for step in range(4):
        params = jax.device_get(eqx.filter(parts.state.model, eqx.is_array))  # x_t (the step donates the state)
        batch = put_batch(parts.data.train.batch(step), parts.mesh)
        loss, g, g_tree = hand_loss_and_grad(params, batch)
        stats = statistics_of(jax.device_get(parts.step(step)))
        x, x_next = flat(params), flat(eqx.filter(parts.state.model, eqx.is_array))
        update = x_next - x
        expected = {
            "param_norm": np.linalg.norm(x),
            "update_norm": np.linalg.norm(update),
            "grad_dot_update": g @ update,
        }
        for i, v in enumerate(layer_norms(g_tree)):
            expected[f"grad_norm_layers/{i}"] = v
        for i, v in enumerate(layer_norms(params)):
            expected[f"param_norm_layers/{i}"] = v
        if step > 0:
            last_loss, last_g, _ = hand_loss_and_grad(last_params, batch)
            step_norm = np.linalg.norm(x - flat(last_params))
            expected.update(
                cos_last_grad=cos(g, last_grad),
                cos_past_grads=cos(g, np.sum(past_grads, axis=0)),
                last_step_norm=step_norm,
                loss_diff=loss - last_loss,
                grad_diff_norm=np.linalg.norm(g - last_g),
                smoothness=np.linalg.norm(g - last_g) / step_norm,
            )
        else:
            for name in (
                "cos_last_grad",
                "cos_past_grads",
                "last_step_norm",
                "loss_diff",
                "grad_diff_norm",
                "smoothness",
            ):
                assert stats[name] is None  # no previous step yet
        # The step (float32, its own gradients, the update as applied) against float64 from eager gradients and
        # x' - x, which loses an ulp of x (1e-4 of a small update to a LayerNorm 1): rel 2e-4; abs 2e-6 for values
        # near 0. loss_diff: two float32 losses ~5 from other programs, each a few ulp (~5e-7) off: abs 1e-5
        for name, value in expected.items():
            assert stats[name] == pytest.approx(value, rel=2e-4, abs=1e-5 if name == "loss_diff" else 2e-6), (
                step,
                name,
            )
        for name in history:
            history[name].append(expected[name])
            assert stats[f"{name}_avg"] == pytest.approx(np.mean(history[name][-3:]), rel=2e-4), (step, name)
        past_grads.append(g)
        last_grad, last_params = g, params


@pytest.mark.parametrize(
    "knob, buffers",
    [
        (None, None),
        ("log_callback_data", {"count"}),
        ("store_last_grads", {"count", "last_grads"}),
        ("store_past_grads", {"count", "past_grads_sum"}),
        ("store_last_params", {"count", "last_params"}),
    ],
)
def test_a_knob_allocates_only_its_own_buffers(data_cache, knob, buffers):
    parts = build(tiny_overrides(data_cache, *([f"logging.{knob}=true"] if knob else [])))
    stats = parts.state.stats
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(eqx.filter(parts.state.model, eqx.is_array)))
    if buffers is None:
        assert stats is None and "param_norm" not in parts.step(0)
        return
    assert set(stats) == buffers
    extra = sum(x.nbytes for x in jax.tree.leaves(stats))
    assert extra == 4 + (params_bytes if len(buffers) == 2 else 0)  # a step counter, plus one params-sized copy


def test_under_float16_the_last_params_gradient_is_taken_under_the_loss_scale(data_cache):
    """lr 0: the last parameters are this step's, so the gradient there is the step's own and their difference 0.
    Taken without the loss scale, float16's small gradients underflowed: grad_diff_norm 2e-3, smoothness 2e27."""
    knobs = ("logging.store_last_params=true", "logging.compute_last_grads=true", "logging.log_callback_data=true")
    sgd = ("optimizer=sgdm", "optimizer.momentum=0", "optimizer.weight_decay=0", "optimizer.grad_clip=0")
    parts = build(tiny_overrides(data_cache, "system.dtype=float16", *knobs, *sgd, "optimizer.lr_config.lr=0"))
    metrics = [parts.step(s) for s in range(2)]
    assert float(metrics[1]["grad_norm"]) > 0 and float(metrics[1]["loss_scale"]) > 1
    assert float(metrics[1]["grad_diff_norm"]) == 0.0


def test_knobs_that_need_the_last_params_say_so():
    for key in ("compute_last_loss", "compute_last_grads"):
        with pytest.raises(ConfigError, match=f"^config: logging.{key}: needs the previous parameters"):
            config_lib.load_config(["model=gpt2-tiny", f"logging.{key}=true"], num_local_devices=1)


def test_statistics_checkpoint_and_resume_with_the_state(data_cache, tmp_path):
    from training.checkpoints.checkpointer import Checkpointer

    parts = build(tiny_overrides(data_cache, *ALL_KNOBS))
    for s in range(3):
        parts.step(s)
    saver = Checkpointer(tmp_path / "ckpt", max_to_keep=2)
    saver.save(parts.state, {"step": 3})
    saver.close()
    expected = {s: statistics_of(jax.device_get(parts.step(s))) for s in range(3, 6)}  # the run never interrupted
    # restored into the state of step 6 (its values, not step 3's): a leaf the restore left out would show
    parts.state = Checkpointer(tmp_path / "ckpt", read_only=True).restore(3, parts.state)
    assert int(parts.state.stats["count"]) == 3
    for s in range(3, 6):  # the window, last grads / params and the past sum all came back
        # exactly: the same step program on the same batches and restored bits
        assert statistics_of(jax.device_get(parts.step(s))) == expected[s], s


def test_statistics_buffers_start_fresh_when_the_checkpoint_has_other_knobs(data_cache, tmp_path):
    from training.checkpoints.checkpointer import Checkpointer

    plain = build(tiny_overrides(data_cache))
    plain.step(0)
    saver = Checkpointer(tmp_path / "ckpt", max_to_keep=2)
    saver.save(plain.state, {"step": 1})
    saver.close()
    knobs_on = build(tiny_overrides(data_cache, "logging.store_last_grads=true"))
    state = Checkpointer(tmp_path / "ckpt", read_only=True).restore(1, knobs_on.state)
    assert int(state.step) == 1 and int(state.stats["count"]) == 0
    # and the other way round: a checkpoint with buffers restores into a run with other knobs, or none
    knobs_on.state = state
    knobs_on.step(1)
    saver = Checkpointer(tmp_path / "ckpt2", max_to_keep=2)
    saver.save(knobs_on.state, {"step": 2})
    saver.close()
    other = build(tiny_overrides(data_cache, "logging.store_past_grads=true"))
    assert int(Checkpointer(tmp_path / "ckpt2", read_only=True).restore(2, other.state).stats["count"]) == 0
    none = Checkpointer(tmp_path / "ckpt2", read_only=True).restore(2, build(tiny_overrides(data_cache)).state)
    assert int(none.step) == 2 and none.stats is None
