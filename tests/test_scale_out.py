"""Scaling out: the same loss curve on 1 device, 8 devices (dp and fsdp) and 2 real processes (jax.distributed over
gloo on 127.0.0.1), with and without accumulation; a 2-process checkpoint continues in a 1-process run."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import ROOT, build, read_metrics, run_cli, tiny_overrides
from training.config import load_config
from training.sharding import init_mesh, per_device_bytes, state_shardings

STEPS = 5
GLOBAL_BATCH = 16


def curve(data_cache, *extra):
    parts = build(tiny_overrides(data_cache, f"train.max_steps={STEPS}", *extra))
    return [float(parts.step(s)["loss"]) for s in range(STEPS)], parts


@pytest.fixture(scope="module")
def reference(data_cache):
    """One device, no accumulation: the curve every other layout must reproduce."""
    return curve(data_cache, "system.num_devices=1", f"train.batch_size={GLOBAL_BATCH}")[0]


@pytest.mark.parametrize("layout", ["dp", "fsdp"])
@pytest.mark.parametrize("accum", [1, 2])
def test_8_devices_reproduce_the_1_device_curve(layout, accum, reference, data_cache):
    losses, parts = curve(data_cache, "system.num_devices=8", f"system.sharding={layout}",
                          f"train.batch_size={GLOBAL_BATCH // accum}", f"train.grad_accum_steps={accum}")
    np.testing.assert_allclose(losses, reference, atol=1e-4)
    spec = parts.state.model.blocks.fc.weight.sharding.spec
    assert ("data" in spec) == (layout == "fsdp")
    if layout == "fsdp" and accum == 2:  # MultiSteps' accumulator is laid out like the parameters
        assert "data" in parts.state.opt_state.acc_grads.blocks.fc.weight.sharding.spec


def test_fsdp_shards_big_arrays_on_their_largest_divisible_dimension():
    cfg = load_config(["model=gpt2-xl"])
    import equinox as eqx
    import optax

    from models import gpt_config
    from models.gpt import GPT
    from training.state import TrainState

    mesh = init_mesh(8)
    model = eqx.filter_eval_shape(GPT.init, gpt_config(cfg.model, 50257), jax.random.PRNGKey(0))
    state = eqx.filter_eval_shape(TrainState.create, model, optax.adamw(1e-4), jax.random.PRNGKey(0))
    dp, fsdp = state_shardings(state, mesh, "dp"), state_shardings(state, mesh, "fsdp")
    assert fsdp.model.blocks.fc.weight.spec == P(None, None, "data")  # [48, 1600, 6400]: 6400 is the largest
    assert fsdp.model.wte.spec == P("data", None)  # [50304, 1600]
    assert fsdp.model.ln_f.weight.spec == P()  # small arrays stay replicated
    dp_bytes, fsdp_bytes = per_device_bytes(state, dp), per_device_bytes(state, fsdp)
    assert dp_bytes > 18e9 and fsdp_bytes < dp_bytes / 7.5  # 1.56B params x (param + 2 moments) x 4 bytes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n: int, args: list[str], timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """`n` real processes joined through jax.distributed on 127.0.0.1; killed if any outlives `timeout`."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # devices come from cpu_devices_per_process
    env["PYTHONPATH"] = str(ROOT)
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, str(ROOT / "train_jax.py"), *args, f"system.num_processes={n}",
                          f"system.process_id={i}", f"system.coordinator_address=127.0.0.1:{port}",
                          "system.num_devices=null", "system.distributed_timeout_s=60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        for i in range(n)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


@pytest.mark.e2e
@pytest.mark.parametrize("accum", [1, 2])
def test_2_processes_reproduce_the_1_device_curve(accum, reference, data_cache, tmp_path):
    run_dir = tmp_path / "run"
    results = launch(2, tiny_overrides(data_cache, f"logging.run_dir={run_dir}", f"train.max_steps={STEPS}",
                                       f"train.batch_size={GLOBAL_BATCH // 2 // accum}", f"train.grad_accum_steps={accum}",
                                       "system.cpu_devices_per_process=2" if accum == 1 else "system.cpu_devices_per_process=1",
                                       "checkpoint.save=false"))
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "in 2 process(es)" in results[0].stdout
    # Only process 0 talks; the one thing process 1 prints is gloo's own connection notice (C++, unconditional).
    assert all(line.startswith("[Gloo]") for line in results[1].stdout.splitlines())
    losses = [r["loss"] for r in read_metrics(run_dir, "train")]
    np.testing.assert_allclose(losses, reference, atol=1e-4)


@pytest.mark.e2e
def test_a_2_process_checkpoint_continues_in_1_process(data_cache, tmp_path):
    schedule = ("optimizer.lr_config.max_steps=8", "train.eval_interval=4")
    straight = tmp_path / "straight"
    assert run_cli(tiny_overrides(data_cache, f"logging.run_dir={straight}", "train.max_steps=8", *schedule,
                                  f"train.batch_size={GLOBAL_BATCH}")).returncode == 0

    run_dir = tmp_path / "two"
    results = launch(2, tiny_overrides(data_cache, f"logging.run_dir={run_dir}", "train.max_steps=4", *schedule,
                                       f"train.batch_size={GLOBAL_BATCH // 2}", "system.cpu_devices_per_process=2"))
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
    assert (run_dir / "checkpoints" / "4").is_dir()

    resumed = run_cli(tiny_overrides(data_cache, "checkpoint.load=True", f"checkpoint.load_path={run_dir}",
                                     "checkpoint.overwrite_config=True", "train.max_steps=8", *schedule,
                                     f"train.batch_size={GLOBAL_BATCH}", "system.num_devices=1"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = {r["step"]: r["loss"] for r in read_metrics(straight, "train")}
    got = {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")}
    np.testing.assert_allclose([got[s] for s in range(1, 9)], [want[s] for s in range(1, 9)], atol=1e-4)
