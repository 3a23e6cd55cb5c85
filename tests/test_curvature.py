"""Curvature and loss landscapes: the power iteration against a dense Hessian, the loop's `sharpness`, and the two
scripts on one tiny run (4 steps; sharpness, evaluation and a checkpoint at steps 2 and 4)."""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_jax
from helpers import read_metrics, script_in_process, tiny_overrides
from models import init_gpt
from models.config import GPTConfig
from training.analysis import curvature
from training.analysis import landscape as L


def tiny_gpt_problem():
    """A GPT with 300 parameters (n_embd 4) and a batch whose first row is partly masked, through the pipeline's
    eval loss."""
    cfg = GPTConfig(vocab_size=8, n_layer=1, n_head=2, n_embd=4, context_size=4, vocab_multiple=8)
    params, static = eqx.partition(init_gpt(cfg, jax.random.PRNGKey(0)), eqx.is_array)
    tokens = np.random.default_rng(0).integers(0, 8, (4, 5))
    mask = np.ones((4, 4), np.float32)
    mask[0, :2] = 0
    batch = {
        "inputs": jnp.asarray(tokens[:, :-1]),
        "targets": jnp.asarray(tokens[:, 1:]),
        "loss_mask": jnp.asarray(mask),
    }
    return curvature.model_loss(static), params, batch


def test_lanczos_finds_the_largest_and_smallest_eigenvalues_of_the_dense_hessian():
    """60 Lanczos steps on a 300-parameter GPT's Hessian (its spectrum has eigenvalues of both signs) against a
    float64 eigensolver on the dense Hessian: both extremes, and neither is the other's magnitude by accident."""
    from jax.flatten_util import ravel_pytree

    loss, params, batch = tiny_gpt_problem()
    flat, unravel = ravel_pytree(params)
    dense = np.asarray(jax.jit(jax.hessian(lambda f: loss(unravel(f), batch)))(flat), np.float64)
    eigenvalues = np.linalg.eigvalsh((dense + dense.T) / 2)
    top, bottom = eigenvalues[-1], eigenvalues[0]
    assert bottom < 0 < top and not np.isclose(abs(bottom), top, rtol=0.1)  # a spectrum of both signs
    got = jax.jit(lambda p, b: curvature.hessian_extremes(loss, p, b, 60, jax.random.PRNGKey(1)))(params, batch)
    # float32 Lanczos (Hessian-vector products of a float32 loss) against float64 on the dense matrix: both ends to
    # 1e-3 of the spectrum's radius
    radius = max(abs(top), abs(bottom))
    assert abs(float(got.top) - top) <= 1e-3 * radius, (float(got.top), top)
    assert abs(float(got.bottom) - bottom) <= 1e-3 * radius, (float(got.bottom), bottom)
    assert int(got.iterations) == 60


def test_lanczos_is_not_fooled_when_its_krylov_space_closes_early():
    """A diagonal 'Hessian' with 3 distinct eigenvalues: the Krylov space closes after 3 steps; 10 steps still give
    the extremes (the later steps add values inside the spectrum)."""
    scales = jnp.asarray([5.0, 5.0, -2.0, 0.5, 0.5, 0.5])
    loss = lambda p, b: 0.5 * jnp.sum(scales * p["x"] ** 2)  # noqa: E731
    got = curvature.hessian_extremes(loss, {"x": jnp.ones(6)}, None, 10, jax.random.PRNGKey(0))
    assert float(got.top) == pytest.approx(5.0, rel=1e-5) and float(got.bottom) == pytest.approx(-2.0, rel=1e-5)
    # one eigenvalue: the residual vanishes after the first step, and no later step may read as an eigenvalue 0
    flat = lambda p, b: 1.5 * jnp.sum(p["x"] ** 2)  # noqa: E731
    got = curvature.hessian_extremes(flat, {"x": jnp.ones(6)}, None, 5, jax.random.PRNGKey(0))
    assert float(got.top) == pytest.approx(3.0, rel=1e-5) and float(got.bottom) == pytest.approx(3.0, rel=1e-5)


def test_filter_normalised_directions_have_each_filters_norm_and_projections_recover_coordinates():
    cfg = GPTConfig(vocab_size=16, n_layer=2, n_head=2, n_embd=8, context_size=8, vocab_multiple=8)
    model = init_gpt(cfg, jax.random.PRNGKey(0))
    d = L.filter_normalised(model, jax.random.PRNGKey(1))
    norms = lambda x, axes: np.sqrt(np.sum(np.square(np.asarray(x)), axis=axes))  # noqa: E731
    # a linear layer's filter is one output unit: the weights into it (axis 1 of a [layer, in, *out] stack)
    # float32 direction rescaled to each filter's norm, against it: a few roundings (~1e-7); 1e-5 (and below)
    np.testing.assert_allclose(norms(d.blocks.qkv.weight, 1), norms(model.blocks.qkv.weight, 1), rtol=1e-5)
    np.testing.assert_allclose(norms(d.blocks.mlp_proj.weight, 1), norms(model.blocks.mlp_proj.weight, 1), rtol=1e-5)
    np.testing.assert_allclose(norms(d.wte, 1), norms(model.wte, 1), rtol=1e-5)  # an embedding's filter is a row
    assert not np.any(np.asarray(d.blocks.fc.bias)) and not np.any(np.asarray(d.ln_f.weight))  # vectors stay put
    # a vector is what the model labels one, whatever its rank: QKV's bias is [layer, 3, D], the gates [2k, K, G];
    # each value-embedding table [V, D] has a filter per row, as the token embedding
    ve = init_gpt(GPTConfig(**{**vars(cfg), "value_embeddings": 1}), jax.random.PRNGKey(3))
    ve = eqx.tree_at(lambda m: (m.blocks.qkv.bias, m.ve_gates), ve, replace_fn=lambda x: x + 0.5)
    dv = L.filter_normalised(ve, jax.random.PRNGKey(1))
    assert dv.blocks.qkv.bias.ndim == 3 and not np.any(np.asarray(dv.blocks.qkv.bias))
    assert not np.any(np.asarray(dv.ve_gates))
    np.testing.assert_allclose(norms(dv.value_embeds, 2), norms(ve.value_embeds, 2), rtol=1e-5)
    with_vectors = L.filter_normalised(ve, jax.random.PRNGKey(1), include_vectors=True)
    np.testing.assert_allclose(
        norms(with_vectors.blocks.qkv.bias, (1, 2)), norms(ve.blocks.qkv.bias, (1, 2)), rtol=1e-5
    )  # its own norm, per layer

    e = L.filter_normalised(model, jax.random.PRNGKey(2))
    offset = L.combine([0.3, -2.0], [d, e])
    coords, residual = L.project(offset, [d, e])
    np.testing.assert_allclose(coords, [0.3, -2.0], rtol=1e-5)
    assert residual < 1e-3
    principal = L.principal_directions([offset, L.combine([1.0], [d])], 2)
    assert L.project(offset, principal)[1] < 1e-3 and abs(L.dot(principal[0], principal[0]) - 1) < 1e-5


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_cache):
    """A tiny run measuring sharpness every 2 steps, with checkpoints at steps 2 and 4."""
    run_dir = tmp_path_factory.mktemp("curvature") / "run"
    assert (
        train_jax.command_line(
            tiny_overrides(
                data_cache,
                f"logging.run_dir={run_dir}",
                "train.max_steps=4",
                "train.eval_interval=2",
                "logging.hessian_every=2",
                "logging.hessian_iters=4",
            )
        )
        == 0
    )
    return run_dir


def test_hessian_every_logs_sharpness_into_metrics_jsonl(run_dir, tmp_path):
    from training.reporting.summary import plot_runs

    rows = read_metrics(run_dir, "curvature")
    assert [r["step"] for r in rows] == [2, 4]
    assert all(np.isfinite(r["sharpness"]) and r["sharpness"] != 0 for r in rows)
    assert all(r["hessian_min"] < r["sharpness"] for r in rows)  # the two ends of the spectrum
    assert all(r["sharpness_iterations"] == 4 for r in rows)
    curves = plot_runs([run_dir], tmp_path / "plots.png")  # a split without a loss is no loss curve
    assert not any("curvature" in name for name in curves)


def test_hessian_script_prints_the_eigenvalue_the_loop_and_the_function_measure(run_dir, tmp_path, monkeypatch, capsys):
    from training.checkpoints.trained import load_trained, run_data

    png = tmp_path / "sharpness.png"
    result = script_in_process(
        "scripts.tools.hessian", [str(run_dir), "--step", "4", "--plot", str(png)], monkeypatch, capsys
    )
    assert result.returncode == 0, result.stderr
    printed = float(re.search(r"step 4: sharpness (\S+), ", result.stdout).group(1))
    trained = load_trained(str(run_dir), "4")
    batch = jax.tree.map(jnp.asarray, curvature.fixed_batch(run_data(trained)))
    assert curvature.sharpness_fn(4) is curvature.sharpness_fn(4)  # one function per iters: the script's programs
    expected = float(curvature.sharpness_fn(4)(trained.model, batch, jax.random.PRNGKey(curvature.SEED)).top)
    assert printed == pytest.approx(expected, rel=1e-5)  # the same computation; the printed value's digits
    logged = read_metrics(run_dir, "curvature")[-1]["sharpness"]
    assert printed == pytest.approx(logged, rel=1e-4)  # the loop's measurement at step 4, repeated
    assert png.stat().st_size > 10_000

    (tmp_path / "a-file").write_text("mine")
    for args, why in (  # the tool's own names for the path and the step; a picture's path before the measuring
        ([str(tmp_path / "nothing")], f"error: run: {tmp_path / 'nothing'} does not exist"),
        ([str(run_dir), "--step", "3"], "error: --step: step 3 is not in"),
        ([str(run_dir), "--step", "4", "--plot", str(tmp_path / "s.txt")], "error: --plot: "),
        ([str(run_dir), "--step", "4", "--plot", str(tmp_path / "a-file" / "s.png")], "a-file is a file, not a"),
    ):
        result = script_in_process("scripts.tools.hessian", args, monkeypatch, capsys)
        assert result.returncode == 2 and why in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert not result.stdout, result.stdout  # nothing measured
    # --iters or --seed with --plot measure the latest checkpoint, as they would without --plot
    result = script_in_process(
        "scripts.tools.hessian", [str(run_dir), "--iters", "4", "--plot", str(png)], monkeypatch, capsys
    )
    assert result.returncode == 0 and f"step 4: sharpness {printed:.6g}, " in result.stdout, result


def test_landscape_script_draws_a_contour_with_the_trajectory_and_a_line(run_dir, tmp_path, monkeypatch, capsys):
    contour = tmp_path / "plane.png"
    result = script_in_process(
        "scripts.tools.landscape", [str(run_dir), "--out", str(contour), "--grid", "5"], monkeypatch, capsys
    )
    assert result.returncode == 0, result.stderr
    assert "25 points around step 4" in result.stdout and "step 2: at (" in result.stdout
    assert contour.stat().st_size > 10_000

    line = run_dir / "landscape-step4-last-update-1d.png"  # no --out: beside the run, named by its directions
    result = script_in_process(
        "scripts.tools.landscape",
        [str(run_dir), "--dims", "1", "--last-update", "--grid", "5"],
        monkeypatch,
        capsys,
    )
    assert result.returncode == 0, result.stderr
    assert "step 2: at (-1), 0% of its offset off the line" in result.stdout  # the previous checkpoint, exactly
    assert result.stdout.startswith(f"{line}: ") and line.stat().st_size > 10_000
    result = script_in_process("scripts.tools.landscape", [str(run_dir), "--to-step", "3"], monkeypatch, capsys)
    assert result.returncode == 2 and "step 3" in result.stderr
    (tmp_path / "a-file").write_text("mine")  # where the picture's folder goes: one line before the computing
    out = tmp_path / "a-file" / "x.png"
    result = script_in_process("scripts.tools.landscape", [str(run_dir), "--out", str(out)], monkeypatch, capsys)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: --out: {out.parent}") and "is a file, not a directory" in result.stderr


def test_landscapes_of_one_step_along_other_directions_have_other_default_names():
    """The default picture beside the run names its directions: a line and a plane, another seed, random directions
    that move vectors, toward a step, the last update or the trajectory's principal directions do not overwrite
    each other."""
    import argparse

    from scripts.tools.landscape import default_name

    def args(**given):
        base = {"to_step": None, "last_update": False, "pca": False, "include_vectors": False, "seed": 0, "dims": 2}
        return argparse.Namespace(**(base | given))

    kinds = [{}, {"dims": 1}, {"seed": 1}, {"include_vectors": True}, {"to_step": 3}, {"last_update": True}]
    kinds += [{"to_step": 3, "seed": 1}, {"last_update": True, "seed": 1}]  # a plane's second direction is random
    names = [default_name(args(**kind), 7) for kind in kinds + [{"pca": True}]]
    assert len(set(names)) == len(names) and all(n.startswith("landscape-step7-") for n in names), names
