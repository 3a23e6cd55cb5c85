"""Scaling out: the same loss curve on 1 device, on 8 devices in every data x model layout (dp and fsdp on `data`,
Megatron tensor parallelism on `model`) and in 2 real processes (jax.distributed over gloo on 127.0.0.1), with and
without accumulation; checkpoints continue under another layout or process count; between the steps that log,
evaluate or save, nothing moves from the devices to the host."""

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from core.errors import ConfigError
from helpers import (
    ROOT,
    build,
    communicate,
    read_metrics,
    run_cli,
    spawn,
    tiny_overrides,
    xla_flags_without_device_count,
)
from training.checkpoints.checkpointer import Checkpointer
from training.checkpoints.fit import eval_as_logged
from training.checkpoints.resume import RunPlan, plan_run
from training.checkpoints.trained import load_trained, run_data
from training.config import load_config
from training.distributed.sharding import FSDP_MIN_SIZE, init_distributed, init_mesh, per_device_bytes, state_shardings
from training.reporting.console import describe_run

STEPS = 5
GLOBAL_BATCH = 16
HEADS = "model.n_head=4"  # gpt2-tiny with 4 heads of 16, so that the `model` axis can split them 2 or 4 ways


def curve(data_cache, *extra, steps=STEPS):
    parts = build(tiny_overrides(data_cache, f"train.max_steps={STEPS}", HEADS, *extra))
    return [float(parts.step(s)["loss"]) for s in range(steps)], parts


@pytest.fixture(scope="module")
def reference(data_cache):
    """One device, no accumulation: the curve every other layout must reproduce."""
    return curve(data_cache, "system.num_devices=1", f"train.batch_size={GLOBAL_BATCH}")[0]


@pytest.mark.parametrize("layout", ["dp", "fsdp"])
@pytest.mark.parametrize("model_axis", [1, 2, 4])
def test_every_data_x_model_layout_reproduces_the_1_device_curve(model_axis, layout, reference, data_cache):
    """data=8, data=4 x model=2, data=2 x model=4, each with dp or fsdp on `data`, accumulating 2 micro-batches."""
    losses, parts = curve(
        data_cache,
        "system.num_devices=8",
        f"system.mesh_model={model_axis}",
        f"system.sharding={layout}",
        f"train.batch_size={GLOBAL_BATCH // 2}",
        "train.grad_accum_steps=2",
    )
    # two programs (1 device; 8, sharded and accumulating) over adamw steps: sums in other orders, a few ulp of
    # losses ~5 (~1e-6), grown by Adam's m/sqrt(v) in small gradients: 1e-4 (the same below)
    np.testing.assert_allclose(losses, reference, atol=1e-4)
    assert dict(parts.mesh.shape) == {"data": 8 // model_axis, "model": model_axis}
    # the start-up line's rows per device: a data shard's, which the model axis's devices share
    plan = RunPlan(parts.cfg, Path("run"), Path("run/checkpoints"), None, None, [])
    lines = describe_run(parts.cfg, plan, parts.mesh, parts.data, parts.state.model, parts.tokenizer, parts.schedule)
    batch = next(line for line in lines if line.startswith("batch"))
    assert f"x 1 process(es), {GLOBAL_BATCH // 2 // (8 // model_axis)} per device" in batch, batch
    model, mu = parts.state.model, optax.tree.get(parts.state.opt_state, "mu")  # Adam's first moment
    blocks = model.blocks  # stacked [layer, ...]: Megatron's columns and rows
    for array, axis in (
        (blocks.qkv.weight, 3),
        (blocks.fc.weight, 2),
        (blocks.attn_proj.weight, 1),
        (blocks.mlp_proj.weight, 1),
        (model.wte, 0),
        (mu.blocks.fc.weight, 2),
        (parts.state.opt_state.acc_grads.blocks.qkv.weight, 3),
    ):
        spec = tuple(array.sharding.spec) + (None,) * array.ndim
        assert (spec[axis] == "model") == (model_axis > 1), (array.shape, spec)
        assert ("data" in spec) == (layout == "fsdp" and array.size >= FSDP_MIN_SIZE)
        if model_axis > 1:  # each device really holds 1/model_axis of it
            assert array.addressable_shards[0].data.shape[axis] == array.shape[axis] // model_axis
    assert blocks.ln1.weight.sharding.spec == P() and "model" not in blocks.attn_proj.bias.sharding.spec
    if layout == "fsdp":  # MultiSteps' accumulator is laid out like the parameters
        assert "data" in parts.state.opt_state.acc_grads.blocks.fc.weight.sharding.spec


def test_a_checkpoint_saved_under_one_layout_continues_under_another(reference, data_cache, tmp_path):
    """Saved on data=4 x model=2 with fsdp, continued on data=2 x model=4 with dp (Orbax reshards on restore; onto
    one device: test_resume.py)."""
    accumulating = (f"train.batch_size={GLOBAL_BATCH // 2}", "train.grad_accum_steps=2", "system.num_devices=8")
    _, first = curve(data_cache, *accumulating, "system.mesh_model=2", "system.sharding=fsdp", steps=3)
    saver = Checkpointer(tmp_path / "ckpt")
    saver.save(first.state, {"step": 3})
    saver.close()
    parts = build(
        tiny_overrides(
            data_cache, f"train.max_steps={STEPS}", HEADS, *accumulating, "system.mesh_model=4", "system.sharding=dp"
        )
    )
    parts.state = Checkpointer(tmp_path / "ckpt", read_only=True).restore(3, parts.state)
    assert int(parts.state.step) == 3
    assert parts.state.model.blocks.fc.weight.sharding == parts.shardings.model.blocks.fc.weight  # model=4, dp
    np.testing.assert_allclose([float(parts.step(s)["loss"]) for s in (3, 4)], reference[3:], atol=1e-4)


def test_a_1_device_checkpoint_continues_on_8_devices(reference, data_cache, tmp_path):
    """Saved on one device, continued on data=4 x model=2 with fsdp: the same curve (8 devices to 1:
    test_resume.py)."""
    _, first = curve(data_cache, "system.num_devices=1", f"train.batch_size={GLOBAL_BATCH}", steps=3)
    saver = Checkpointer(tmp_path / "ckpt")
    saver.save(first.state, {"step": 3})
    saver.close()
    parts = build(
        tiny_overrides(
            data_cache,
            f"train.max_steps={STEPS}",
            HEADS,
            f"train.batch_size={GLOBAL_BATCH}",
            "system.num_devices=8",
            "system.mesh_model=2",
            "system.sharding=fsdp",
        )
    )
    parts.state = Checkpointer(tmp_path / "ckpt", read_only=True).restore(3, parts.state)
    assert int(parts.state.step) == 3
    assert parts.state.model.blocks.fc.weight.sharding == parts.shardings.model.blocks.fc.weight
    assert len(parts.state.model.blocks.fc.weight.sharding.device_set) == 8
    np.testing.assert_allclose([float(parts.step(s)["loss"]) for s in (3, 4)], reference[3:], atol=1e-4)


# What srun, mpirun (Open MPI 4) and a launcher setting JAX's variables put in each process's environment, and the
# (coordinator, process count, process id) it means.
LAUNCHERS = {
    "slurm": (
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_NODELIST": "node[007-010]",
            "SLURM_NTASKS": "4",
            "SLURM_PROCID": "2",
            "SLURM_LOCALID": "0",
        },
        ("node007:61586", 4, 2),
    ),  # port: 61440 + job id mod 4096, as JAX picks it
    "openmpi": (
        {
            "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        },
        ("10.96.0.1:62624", 4, 3),
    ),  # port: 61440 + (job id / 4096) mod 4096
    "jax": (
        {"JAX_COORDINATOR_ADDRESS": "10.0.0.5:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "1"},
        ("10.0.0.5:1234", 4, 1),
    ),
}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_launchers_environment_gives_the_process_layout(launcher, monkeypatch):
    """With the system.* keys null, a launcher's environment alone decides to join and how: what the run passes to
    jax.distributed.initialize, resolved as JAX resolves it (its cluster detection), is the launcher's layout.
    (A real join through the JAX_* variables: test_2_processes_reproduce_the_1_device_curve...)"""
    from jax._src import clusters

    for name in os.environ:
        if name.startswith(("SLURM_", "OMPI_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")):
            monkeypatch.delenv(name)
    variables, layout = LAUNCHERS[launcher]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    joined = []

    def initialize(coordinator_address, num_processes, process_id, initialization_timeout, **_):
        address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")  # as jax.distributed does
        joined.append(
            clusters.ClusterEnv.auto_detect_unset_distributed_params(
                address, num_processes, process_id, None, None, initialization_timeout
            )[:3]
        )

    monkeypatch.setattr(jax.distributed, "initialize", initialize)  # the real one would start joining
    init_distributed(load_config([]).system)
    assert joined == [layout]


def test_a_process_id_without_several_processes_is_refused_in_one_line(monkeypatch):
    """system.process_id alone, with no process count and no launcher's environment, would train one process as if
    it were rank 3 of nothing: refused, naming what reads it. Rank 0 of one process is what a single run is."""
    for name in ("SLURM_NTASKS", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match=r"^config: system.process_id: 3 is read only with system.num_processes > 1"):
        init_distributed(load_config(["system.process_id=3"]).system)
    with pytest.raises(ConfigError, match=r"^config: system.coordinator_address: 127.0.0.1:1234 is read only with"):
        init_distributed(load_config(["system.coordinator_address=127.0.0.1:1234", "system.process_id=0"]).system)
    init_distributed(load_config(["system.process_id=0"]).system)
    init_distributed(load_config([]).system)
    one = ["system.num_processes=1", "system.process_id=0", "system.coordinator_address=127.0.0.1:1234"]
    init_distributed(load_config(one).system)  # launch_multihost.sh 1: one process, its coordinator named


def test_fsdp_shards_big_arrays_on_their_largest_divisible_dimension():
    cfg = load_config(["model=gpt2-xl"])
    import equinox as eqx
    import optax

    from models import gpt_config
    from models.gpt import GPT
    from training.step.state import TrainState

    mesh = init_mesh(8)
    model = eqx.filter_eval_shape(GPT.init, gpt_config(cfg.model, 50257), jax.random.PRNGKey(0))
    state = eqx.filter_eval_shape(TrainState.create, model, optax.adamw(1e-4), jax.random.PRNGKey(0))
    dp, fsdp = state_shardings(state, mesh, "dp"), state_shardings(state, mesh, "fsdp")
    assert fsdp.model.blocks.fc.weight.spec == P(None, None, "data")  # [48, 1600, 6400]: 6400 is the largest
    assert fsdp.model.wte.spec == P("data")  # [50304, 1600]: split by rows
    assert fsdp.model.ln_f.weight.spec == P()  # small arrays stay replicated
    dp_bytes, fsdp_bytes = per_device_bytes(state, dp), per_device_bytes(state, fsdp)
    assert dp_bytes > 18e9 and fsdp_bytes < dp_bytes / 7.5  # 1.56B params x (param + 2 moments) x 4 bytes


@pytest.mark.parametrize("layout,model_axis", [("fsdp", 1), ("dp", 2)])
def test_a_fresh_model_is_made_in_its_shards_with_the_numbers_of_one_device(layout, model_axis):
    """The run's model comes out of one program already in its layout: under FSDP on 8 devices each holds its share
    of the large arrays and of their random bits, never the whole model (XLA's own count of the program's bytes on a
    device); with tensor parallelism each holds its heads and hidden units. Its numbers are those of the model made
    on one device."""
    import equinox as eqx

    from training.pipeline.build import init_model, model_maker

    cfg = load_config(
        ["model=gpt2-tiny", "system.num_devices=8", f"system.sharding={layout}", f"system.mesh_model={model_axis}"]
    )
    mesh, key = init_mesh(8, model_axis), jax.random.PRNGKey(0)
    make = model_maker(cfg, 50257, mesh)
    model, alone = make(key), init_model(cfg, 50257, key)
    whole = sum(x.nbytes for x in jax.tree.leaves(eqx.filter(alone, eqx.is_array)))
    expected = state_shardings(model, mesh, layout, model.TENSOR_PARALLEL_AXES)
    arrays = [jax.tree.leaves(eqx.filter(m, eqx.is_array)) for m in (model, alone)]
    for a, b, sharding in zip(*arrays, jax.tree.leaves(expected), strict=True):
        assert a.sharding == sharding
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if layout == "fsdp":  # 3.3M parameters, 13.3 MB on one device; here 1.7 MB out and 4.8 MB of work a device
        memory = make.lower(key).compile().compiled.memory_analysis()  # JAX's Compiled inside Equinox's
        assert memory.output_size_in_bytes < whole / 4, (memory, whole)
        assert memory.output_size_in_bytes + memory.temp_size_in_bytes < whole, (memory, whole)
        assert model.wte.addressable_shards[0].data.shape == (50304 // 8, 64)
    else:
        assert model.blocks.fc.weight.addressable_shards[0].data.shape == (2, 64, 256 // 2)


def test_the_same_model_in_the_same_layout_is_made_by_the_program_made_before():
    """A process that makes a model again (an in-process sweep's jobs, the tests) gets the program it made before,
    whatever else of the run changed, and a program of its own where the model's init differs with the same shapes
    (model.zero_init_mlp_out) or its layout does."""
    from training.pipeline.build import model_maker

    mesh, key = init_mesh(8, 1), jax.random.PRNGKey(0)
    base = ["model=gpt2-tiny", "system.num_devices=8", "system.sharding=fsdp"]
    first = model_maker(load_config([*base, "train.seed=1"]), 259, mesh)
    assert model_maker(load_config([*base, "train.seed=2", "train.max_steps=9"]), 259, mesh) is first
    zeroed = model_maker(load_config([*base, "model.zero_init_mlp_out=true"]), 259, mesh)
    dp = model_maker(load_config([*base, "system.sharding=dp"]), 259, mesh)
    assert zeroed is not first and dp is not first
    assert np.any(np.asarray(first(key).blocks.mlp_proj.weight))
    assert not np.any(np.asarray(zeroed(key).blocks.mlp_proj.weight))
    assert first(key).wte.sharding.spec == P("data") and dp(key).wte.sharding.spec == P()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    n: int, args: list[str], timeout: float = 240, num_devices: str = "null"
) -> list[subprocess.CompletedProcess]:
    """`n` real processes joined through jax.distributed on 127.0.0.1, given their layout as a launcher gives it:
    JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID, the system.* keys left null. Each is killed if it
    outlives `timeout` (the others when the test ends)."""
    port = free_port()
    procs = [
        spawn(
            [
                sys.executable,
                str(ROOT / "train_jax.py"),
                *args,
                f"system.num_devices={num_devices}",
                "system.distributed_timeout_s=60",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                "XLA_FLAGS": xla_flags_without_device_count(),  # devices: cpu_devices_per_process
                "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                "JAX_NUM_PROCESSES": str(n),
                "JAX_PROCESS_ID": str(i),
            },
        )
        for i in range(n)
    ]
    return [communicate(proc, timeout) for proc in procs]


def launch_script(n: int, args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """scripts/launch_multihost.sh with `n` processes (their output together), as docs/scaling.md says to run it;
    its activate_env.sh takes the checkout's .venv, or this Python when there is none."""
    here = str(Path(sys.executable).parent)
    proc = spawn(
        [
            "bash",
            str(ROOT / "scripts" / "launch_multihost.sh"),
            str(n),
            *args,
            "system.num_devices=null",
            "system.distributed_timeout_s=60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            "XLA_FLAGS": xla_flags_without_device_count(),
            "PYTHON": sys.executable,
            "PATH": f"{here}{os.pathsep}{os.environ['PATH']}",
        },
    )
    return communicate(proc, timeout)


@pytest.mark.e2e
def test_2_processes_reproduce_the_1_device_curve_with_no_host_sync_between_log_steps(reference, data_cache, tmp_path):
    """2 processes of 1 device each, accumulating 2 micro-batches, under system.transfer_guard. (2 processes of 2
    devices without accumulation: test_a_2_process_checkpoint_continues_in_1_process.)"""
    run_dir = tmp_path / "run"
    results = launch(
        2,
        tiny_overrides(
            data_cache,
            f"logging.run_dir={run_dir}",
            f"train.max_steps={STEPS}",
            HEADS,
            f"train.batch_size={GLOBAL_BATCH // 4}",
            "train.grad_accum_steps=2",
            "system.cpu_devices_per_process=1",
            "checkpoint.save=false",
            "train.log_interval=2",
            "system.transfer_guard=true",
        ),
    )
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "in 2 process(es)" in results[0].stdout
    # Only process 0 talks; the one thing process 1 prints is gloo's own connection notice (C++, unconditional).
    ours = [
        line
        for line in results[1].stdout.splitlines()
        if line.strip() and "Gloo" not in line and "peer ranks" not in line
    ]
    assert ours == [], results[1].stdout
    # Logged at steps 2, 4 and 5 (the mean over each interval); under the transfer guard, step 3 (no log, no stop
    # agreement, no compile report) moved nothing from the devices to the host.
    logged = read_metrics(run_dir, "train")
    assert [r["step"] for r in logged] == [2, 4, 5]
    want = [np.mean(reference[0:2]), np.mean(reference[2:4]), reference[4]]
    np.testing.assert_allclose([r["loss"] for r in logged], want, atol=1e-4)


@pytest.mark.e2e
@pytest.mark.soak
def test_a_2_process_checkpoint_continues_in_1_process(reference, data_cache, tmp_path):
    schedule = (f"optimizer.lr_config.max_steps={STEPS}", "train.eval_interval=3", HEADS)
    run_dir = tmp_path / "two"
    launched = launch_script(
        2,
        tiny_overrides(
            data_cache,
            f"logging.run_dir={run_dir}",
            "train.max_steps=3",
            *schedule,
            f"train.batch_size={GLOBAL_BATCH // 2}",
            "system.cpu_devices_per_process=2",
        ),
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "4 x cpu in 2 process(es)" in launched.stdout and (run_dir / "checkpoints" / "3").is_dir()
    # the tools rebuild the run's evaluation sets from the count it saved (a launcher's is in no config key)
    trained = load_trained(str(run_dir), "3")
    assert trained.meta["process_count"] == 2
    trained.cfg = dataclasses.replace(trained.cfg, system=dataclasses.replace(trained.cfg.system, num_processes=None))
    assert run_data(trained).evals["val"].batch_size == GLOBAL_BATCH
    # and so does mode=eval in another number of processes: the loss the run logged, not another set's
    evaluated = run_cli(
        tiny_overrides(data_cache, "mode=eval", "checkpoint.load=True", f"checkpoint.load_path={run_dir}")
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    logged = [r["loss"] for r in read_metrics(run_dir, "val") if r["step"] == 3]
    scored = json.loads((run_dir / "eval-step3.json").read_text())["results"]["val"]["loss"]
    assert scored == pytest.approx(logged[0], abs=1e-5)
    with pytest.raises(ConfigError, match=r"^mode=eval: the checkpoint's run evaluated batches of 16 sequences"):
        eval_as_logged(trained.cfg, trained.meta, 3)
    # a share the process's devices cannot split: JAX's IndivisibleError, a traceback from each process
    launched = dataclasses.replace(trained.cfg, system=dataclasses.replace(trained.cfg.system, num_devices=None))
    with pytest.raises(ConfigError, match=r"16 sequences .* 4 per process in 4, which its 8 devices cannot share"):
        eval_as_logged(launched, trained.meta, 4, 8)
    assert eval_as_logged(launched, trained.meta, 4, 4).train.batch_size == 4
    # under checkpoint.overwrite_config the command line's batch is the batch (the run's own set is not asked for)
    mine = tiny_overrides(data_cache, "mode=eval", "checkpoint.load=True", f"checkpoint.load_path={run_dir}")
    mine += ["checkpoint.overwrite_config=True", f"train.batch_size={GLOBAL_BATCH}", HEADS]
    assert plan_run(load_config(mine), mine, 0).cfg.train.batch_size == GLOBAL_BATCH

    resumed = run_cli(
        tiny_overrides(
            data_cache,
            "checkpoint.load=True",
            f"checkpoint.load_path={run_dir}",
            "checkpoint.overwrite_config=True",
            f"train.max_steps={STEPS}",
            *schedule,
            f"train.batch_size={GLOBAL_BATCH}",
            "system.num_devices=1",
        )
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")}  # steps 1-3 in 2 processes, 4-5 in 1
    np.testing.assert_allclose([got[s] for s in range(1, STEPS + 1)], reference, atol=1e-4)


@pytest.mark.soak
def test_a_sweep_of_2_process_runs_runs_every_job_in_both_processes(data_cache, tmp_path):
    """-m under the launcher: each job one 2-process run in the same processes. The second job joined the processes
    again (an error in both), and the non-zero process summarised the sweep before process 0 had recorded its end."""
    args = [
        *tiny_overrides(data_cache, "train.max_steps=2", "train.batch_size=4", "checkpoint.save=false"),
        "system.cpu_devices_per_process=1",
        "train.seed=1,2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "-m",  # after the overrides: the script puts it first
    ]
    launched = launch_script(2, args)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert launched.stdout.count("sweep: 2 of 2 jobs completed") == 1, launched.stdout[-2000:]
    assert launched.stdout.count("2 x cpu in 2 process(es)") == 2


def test_the_launch_script_exits_with_a_failed_process_status_and_one_line_of_its_own(data_cache, tmp_path):
    """Both processes refuse the config: the script exits with their status, and stderr holds their one-line errors
    and the script's one line on the first to fail (waiting on processes it had reaped printed "wait: <pid>: no such
    job")."""
    args = tiny_overrides(data_cache, f"logging.run_dir={tmp_path / 'run'}", "train.max_steps=0")
    launched = launch_script(2, args, timeout=120)
    assert launched.returncode == 2, launched.stderr[-2000:]
    lines = [line for line in launched.stderr.splitlines() if line.strip()]
    script = [line for line in lines if line.startswith("launch_multihost.sh: ")]
    assert len(script) == 1 and re.fullmatch(
        r"launch_multihost.sh: process [01] \(pid \d+\) of 2 failed with status 2; stopping the others", script[0]
    ), launched.stderr[-2000:]
    errors = [line for line in lines if line not in script]
    assert errors and all(line.startswith("error: config: train.max_steps") for line in errors), launched.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_the_launch_script_names_the_process_that_failed_and_stops_the_others(tmp_path):
    """Process 1 of 3 is killed (SIGKILL, as by the OOM killer) while the others run: the script's one line names it,
    its pid and its signal, the others are stopped, and the script exits with its status. Bash's own note named no
    process ("line N: <pid> Killed python train_jax.py ... system.process_id="$i" ..."). The script runs in a copy of
    the checkout's frame whose train_jax.py only plays its part (no training: seconds)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "launch_multihost.sh", tmp_path / "scripts")
    (tmp_path / "activate_env.sh").write_text("")
    (tmp_path / "train_jax.py").write_text(
        "import os, signal, sys, time\n"
        "if 'system.process_id=1' in sys.argv:\n"
        "    time.sleep(0.5)\n"
        "    print(os.getpid(), flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(120)\n"
    )
    started = time.time()
    launched = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "launch_multihost.sh"), "3"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PORT": "1"},  # no coordinator: nothing joins
    )
    assert launched.returncode == 137 and time.time() - started < 30, launched.stderr
    pid = launched.stdout.strip()
    assert launched.stderr.splitlines() == [
        f"launch_multihost.sh: process 1 (pid {pid}) of 3 failed with status 137 (SIGKILL); stopping the others"
    ]
    for count in ("0", "-1", "two"):  # it started nothing and exited 0; `two` was bash's "unbound variable"
        launched = subprocess.run(
            ["bash", str(tmp_path / "scripts" / "launch_multihost.sh"), count], capture_output=True, text=True
        )
        assert (launched.returncode, launched.stdout, launched.stderr) == (
            2,
            "",
            f"launch_multihost.sh: NUM_PROCESSES must be a whole number >= 1; got '{count}'\n",
        )


def test_the_launch_script_puts_a_sweep_first_in_one_folder_for_every_process(tmp_path):
    """`-m` given after overrides was argparse's "unrecognized arguments"; each process named the sweep's folder by its
    own clock (two processes on either side of a second: two folders). The script's train_jax.py prints its
    arguments."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "launch_multihost.sh", tmp_path / "scripts")
    (tmp_path / "activate_env.sh").write_text("")
    (tmp_path / "train_jax.py").write_text(  # each process's arguments in a file of its own
        "import json, sys\n"
        "rank = next(a for a in sys.argv if a.startswith('system.process_id=')).split('=')[1]\n"
        "open(f'argv.{rank}', 'w').write(json.dumps(sys.argv[1:]))\n"
    )

    def argvs(*args: str) -> list[list[str]]:
        script = str(tmp_path / "scripts" / "launch_multihost.sh")
        done = subprocess.run(["bash", script, "2", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [json.loads((tmp_path / f"argv.{rank}").read_text()) for rank in (0, 1)]

    both = argvs("train.seed=1,2", "-m", "hydra.job.name=lr")
    assert both[0][:2] == both[1][:2] and both[0][0] == "-m"
    assert re.fullmatch(r"hydra\.sweep\.dir=runs/sweeps/lr-\d{8}-\d{6}", both[0][1]), both
    assert both[0][2:4] == ["train.seed=1,2", "hydra.job.name=lr"] and both[0][4] == "system.num_processes=2"
    named = argvs("--multirun", "hydra.sweep.dir=mine")
    assert [argv[:2] for argv in named] == [["-m", "hydra.sweep.dir=mine"]] * 2
    assert argvs("train.seed=1")[0][0] == "train.seed=1"  # no sweep: nothing added


def test_num_devices_under_a_launcher_is_one_line_in_every_process(data_cache, tmp_path):
    """system.num_devices picks a single process's devices: with the process count from the launcher's environment
    (num_processes null) each process built a mesh of its own devices and trained a model of its own, until its
    first checkpoint failed to save."""
    args = tiny_overrides(data_cache, f"logging.run_dir={tmp_path / 'run'}", "system.cpu_devices_per_process=2")
    for result in launch(2, args, timeout=120, num_devices="1"):
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.strip().splitlines() == [
            "error: config: system.num_devices: selects local devices of a single process; this run has 2 "
            "processes: leave it null"
        ]
    assert not (tmp_path / "run").exists()


def test_cpu_devices_per_process_sets_a_single_process_devices_too(data_cache, tmp_path):
    """system.cpu_devices_per_process acted only where jax.distributed starts: one process kept XLA_FLAGS' count
    without a word. Now a single process gets that many CPU devices (in place of the flag's 8 here); a process whose
    backend runs already with another count (this test's) is one line, not JAX's traceback."""
    result = run_cli(
        tiny_overrides(
            data_cache,
            f"logging.run_dir={tmp_path / 'run'}",
            "system.num_devices=null",
            "system.cpu_devices_per_process=2",
            "train.max_steps=2",
            "checkpoint.save=false",
        )
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "devices    2 x cpu in 1 process(es) | mesh data=2 x model=1" in result.stdout + result.stderr
    system = load_config(["system.cpu_devices_per_process=3"]).system
    assert jax.local_device_count() == 8  # this process's backend, started with XLA_FLAGS' count
    with pytest.raises(ConfigError, match=r"^config: system.cpu_devices_per_process: the XLA backend of this process"):
        init_distributed(system)
    init_distributed(dataclasses.replace(system, cpu_devices_per_process=jax.local_device_count()))  # as it runs
