"""Update geometry (training/step/geometry.py): every quantity against a hand computation with two parameter groups;
the running sums are the same whatever the log interval and across a kill and resume (and scripts/tools/plot_geometry.py
draws them); off, nothing changes."""

from __future__ import annotations

import signal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import build, read_metrics, run_cli, start, tiny_overrides, wait_for_step
from training.distributed.sharding import put_batch
from training.step.losses import mean_loss
from training.step.stats import statistics_of

GEOMETRY = ("logging.update_geometry=true", "optimizer.groups={vector: {lr_multiplier: 0.5}}")
VECTOR_LABELS = ("norm", "bias")


def flat(tree, keep) -> np.ndarray:
    """The float64 entries of the leaves `keep` (a tree of bools shaped like `tree`) selects, concatenated."""
    return np.concatenate(
        [np.ravel(np.asarray(x, np.float64)) for x, k in zip(jax.tree.leaves(tree), jax.tree.leaves(keep)) if k]
        or [np.zeros(0)]
    )


def cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_every_quantity_matches_a_hand_computation_over_3_steps_with_two_groups(data_cache):
    parts = build(tiny_overrides(data_cache, *GEOMETRY))
    labels = parts.state.model.parameter_labels()
    groups = {
        "vector": jax.tree.map(lambda label: label in VECTOR_LABELS, labels),
        "rest": jax.tree.map(lambda label: label not in VECTOR_LABELS, labels),
        "model": jax.tree.map(lambda label: True, labels),
    }
    loss_and_grad = eqx.filter_jit(eqx.filter_value_and_grad(mean_loss))
    last_update = {g: None for g in groups}
    sums = {g: [0.0, 0.0] for g in groups}
    scales = {g: [0.0, 0.0] for g in groups}  # the sums of |g||u|: what the sums' rounding scales with
    last_loss, loss_change_sum = None, 0.0
    for step in range(3):
        params = jax.device_get(eqx.filter(parts.state.model, eqx.is_array))  # x_n (the step donates the state)
        batch = put_batch(parts.data.train.batch(step), parts.mesh)
        loss, grads = loss_and_grad(parts.state.model, jax.tree.map(lambda x: x[0], batch), None, jnp.float32)
        got = statistics_of(jax.device_get(parts.step(step)))
        new_params = eqx.filter(parts.state.model, eqx.is_array)
        loss = float(loss)
        for group, keep in groups.items():
            x, g = flat(params, keep), flat(eqx.filter(grads, eqx.is_array), keep)
            u = flat(new_params, keep) - x
            lu = last_update[group]
            want = {
                "grad_dot_update": g @ u,
                "params_l2": np.linalg.norm(x),
                "params_l1": np.abs(x).sum(),
                "params_linf": np.abs(x).max(),
                "grads_l2": np.linalg.norm(g),
                "grads_l1": np.abs(g).sum(),
                "grads_linf": np.abs(g).max(),
                "update_l2": np.linalg.norm(u),
                "update_l1": np.abs(u).sum(),
                "update_linf": np.abs(u).max(),
            }
            scale = {"grad_dot_update": np.linalg.norm(g) * np.linalg.norm(u)}  # norms: 0, their rel is enough
            if lu is None:
                for name in (
                    "grad_dot_last_update",
                    "cos_grad_last_update",
                    "cos_update_last_update",
                    "cos_params_last_params",
                ):
                    assert got[f"geometry/{group}/{name}"] is None, (step, group, name)  # no previous step
            else:
                want |= {
                    "grad_dot_last_update": g @ lu,
                    "cos_grad_last_update": cos(g, lu),
                    "cos_update_last_update": cos(u, lu),
                    "cos_params_last_params": cos(x, x - lu),
                }
                scale |= {
                    "grad_dot_last_update": np.linalg.norm(g) * np.linalg.norm(lu),
                    "cos_grad_last_update": 1.0,
                    "cos_update_last_update": 1.0,
                    "cos_params_last_params": 1.0,
                }
                sums[group][0] += g @ lu
                scales[group][0] += scale["grad_dot_last_update"]
            sums[group][1] += g @ u
            scales[group][1] += scale["grad_dot_update"]
            want |= {"grad_dot_last_update_sum": sums[group][0], "grad_dot_update_sum": sums[group][1]}
            scale |= {"grad_dot_last_update_sum": scales[group][0], "grad_dot_update_sum": scales[group][1]}
            # The step (float32, its own gradient, u as it applied it) against float64 from an eagerly compiled
            # gradient and u = x' - x, which loses an ulp of x (1e-4 of a small update to a LayerNorm 1): rel 2e-4.
            # A dot product or cosine can cancel to ~0, where its rounding is still ~1e-6 of |a||b|: abs 1e-5 x it
            for name, value in want.items():
                assert got[f"geometry/{group}/{name}"] == pytest.approx(
                    value, rel=2e-4, abs=1e-5 * scale.get(name, 0.0) + 1e-9
                ), (step, group, name)
            last_update[group] = u
        if last_loss is None:
            assert got["geometry/loss_change"] is None
        else:
            loss_change_sum += loss - last_loss
            # the difference of two float32 losses ~5, each from another program than here, a few ulp (~5e-7)
            # off: near 0 only abs counts, 1e-5 leaves ~10x
            assert got["geometry/loss_change"] == pytest.approx(loss - last_loss, rel=1e-4, abs=1e-5)
        assert got["geometry/loss_change_sum"] == pytest.approx(loss_change_sum, rel=1e-4, abs=1e-5)
        last_loss = loss
    # the groups split the model: their inner products add up to the model's, up to float32 sums' order (~1e-7)
    assert got["geometry/model/grad_dot_update_sum"] == pytest.approx(
        got["geometry/vector/grad_dot_update_sum"] + got["geometry/rest/grad_dot_update_sum"], rel=1e-5
    )


def test_off_leaves_the_state_and_the_compiled_step_as_they_were(data_cache):
    """Off (the default), the state holds no buffers and the step computes nothing of it; on, both change."""

    def lowered(parts):
        batch = put_batch(parts.data.train.batch(0), parts.mesh)
        module = parts.train_step.lower(parts.state, batch).compiler_ir("stablehlo")
        return module.operation.get_asm(enable_debug_info=True)  # with the named scopes

    off = build(tiny_overrides(data_cache, "logging.update_geometry=false"))
    assert off.state.stats is None
    assert "update_geometry" not in lowered(off)
    on = build(tiny_overrides(data_cache, "logging.update_geometry=true"))
    assert set(on.state.stats) == {"count", "last_params", "geometry"}
    assert "update_geometry" in lowered(on)
    # With store_last_params too, the state still holds one copy of the parameters (x_{t-1}, shared): the geometry's
    # own buffers are scalars.
    both = build(tiny_overrides(data_cache, "logging.update_geometry=true", "logging.store_last_params=true"))
    assert set(both.state.stats) == {"count", "last_params", "geometry"}
    assert all(leaf.ndim == 0 for leaf in jax.tree.leaves(both.state.stats["geometry"]))


@pytest.mark.e2e
def test_running_sums_are_the_same_whatever_the_log_interval_and_across_a_kill_and_resume(data_cache, tmp_path):
    def command(run_dir, *extra):
        return tiny_overrides(
            data_cache, *GEOMETRY, f"logging.run_dir={run_dir}", "train.max_steps=12", "train.eval_interval=12", *extra
        )

    def sums(run_dir):
        return {
            r["step"]: {k: v for k, v in r.items() if k.startswith("geometry/") and k.endswith("_sum")}
            for r in read_metrics(run_dir, "train")
        }

    every = tmp_path / "every"
    assert run_cli(command(every, "train.log_interval=1")).returncode == 0
    killed = tmp_path / "killed"
    resumable = command(
        killed, "train.log_interval=6", "checkpoint.save_steps=1", "checkpoint.max_to_keep=2", "checkpoint.load=auto"
    )
    proc = start(resumable)
    wait_for_step(killed, 6, proc)
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    result = run_cli(resumable)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming" in result.stdout
    want, got = sums(every), sums(killed)
    assert len(want[12]) == 3 * 2 + 1  # vector, rest, model x two sums, and the loss difference's
    # exactly: the sums live in the train state, built by one step program (the log interval is not in it) from the
    # same batches and the restored bits
    assert got[6] == want[6] and got[12] == want[12]
    # and the picture of them
    drawn = run_cli([str(every), "--out", str(tmp_path / "geometry.png")], module="scripts.tools.plot_geometry")
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert "update geometry of model" in drawn.stdout and (tmp_path / "geometry.png").stat().st_size > 20_000
