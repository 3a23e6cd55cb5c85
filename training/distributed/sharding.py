"""Where arrays live: processes, the device mesh, the batch and state layouts, and host -> device transfer.

Several processes (hosts) join through `jax.distributed` before anything touches a device. The mesh has two axes:
`data` over every device of every process (ordered by process, so process p's rows of a batch are the p-th slice of
the global batch) divided by `model`, the tensor-parallel axis (`system.mesh_model` devices; 1 = none). Batches are
split along their batch axis over `data` and replicated over `model`.

The train state's layout composes the two axes:
  model  the model's Megatron layout (`GPT.TENSOR_PARALLEL_AXES`): QKV and the first MLP matrix split by output
         columns, the attention output and second MLP matrix by input rows, the token embedding by vocabulary rows;
         applied to the parameters and to every optimizer or statistics buffer shaped like one (matched by the end
         of its path in the state, e.g. `...mu.blocks.fc.weight`). XLA inserts the all-reduces.
  data   `dp`: replicated; `fsdp`: each array also split along its largest other dimension that the `data` axis
         divides (arrays under FSDP_MIN_SIZE elements stay replicated). XLA inserts the gathers and reduce-scatters.
The step and the model never name devices: they receive these shardings.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import chex
import jax
import numpy as np
from jax._src import xla_bridge  # backends_are_initialized: public JAX has no way to ask
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from core.errors import ConfigError, first_line
from training.distributed.peers import JAX_HEARTBEAT_MARGIN_S, Processes

DATA_AXIS, MODEL_AXIS = "data", "model"
FSDP_MIN_SIZE = 2**14  # arrays smaller than this stay replicated: sharding them saves nothing worth a collective

State = TypeVar("State")  # the (abstract) train state; its shardings are a tree of the same type


def cluster_env_present() -> bool:
    """A launcher started several processes: SLURM (srun), Open MPI (mpirun), or JAX's own variables."""
    env = os.environ
    return (
        int(env.get("SLURM_NTASKS", "1")) > 1
        and "SLURM_JOB_ID" in env
        or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
        or "JAX_COORDINATOR_ADDRESS" in env
    )


def init_distributed(system: Processes) -> None:
    """Join the other processes when `system.num_processes` > 1 or a launcher's environment says so.

    Must run before JAX touches a device. Values left null in the config come from the environment (JAX detects
    SLURM and Open MPI itself). On CPU, `system.cpu_devices_per_process` sets how many devices each process has, in
    a single process too (it then replaces XLA_FLAGS' host device count).
    """
    n = system.cpu_devices_per_process
    if n and not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", n)
    elif n and len(jax.local_devices(backend="cpu")) != n:  # the devices were made when the backend started
        raise ConfigError(
            f"config: system.cpu_devices_per_process: the XLA backend of this process has started already with "
            f"{len(jax.local_devices(backend='cpu'))} CPU devices; run in a fresh process, or set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before it starts"
        )
    if not ((system.num_processes or 1) > 1 or cluster_env_present()):
        # a rank of one process, a coordinator with no process count: the command meant to start several (rank 0
        # trained alone); launch_multihost.sh 1 names its coordinator with num_processes=1, a single process
        coordinator = system.coordinator_address if system.num_processes is None else None
        for key, value in (("process_id", system.process_id), ("coordinator_address", coordinator)):
            if value not in (None, 0):
                raise ConfigError(
                    f"config: system.{key}: {value} is read only with system.num_processes > 1 or a launcher's "
                    "environment (SLURM, Open MPI, JAX_COORDINATOR_ADDRESS); set system.num_processes, or leave "
                    f"{key} null"
                )
        return
    if jax.distributed.is_initialized():  # the jobs of a sweep in this process (-m): joined for the first one
        return
    try:
        # JAX reads JAX_COORDINATOR_ADDRESS itself, but not the process count and id that go with it.
        num_processes = system.num_processes or _env_int("JAX_NUM_PROCESSES")
        process_id = system.process_id if system.process_id is not None else _env_int("JAX_PROCESS_ID")
        jax.distributed.initialize(
            coordinator_address=system.coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=system.distributed_timeout_s,
            # training/distributed/peers.py notices a lost process after distributed_timeout_s; this is JAX's own
            # backstop
            heartbeat_timeout_seconds=system.distributed_timeout_s + JAX_HEARTBEAT_MARGIN_S,
        )
    except (RuntimeError, ValueError) as e:
        first = first_line(e)
        count = system.num_processes or "the launcher's"
        where = system.coordinator_address or "the detected coordinator"
        raise ConfigError(f"config: system: could not join {count} processes at {where}: {first}") from None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def init_mesh(num_devices: int | None = None, model_axis: int = 1) -> Mesh:
    """A (data, model) mesh over all devices of all processes, or over the first `num_devices` local devices
    (single process). Devices are ordered by process, then id."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    if num_devices is not None:
        devices = jax.local_devices()[:num_devices]
    return Mesh(np.array(devices).reshape(-1, model_axis), (DATA_AXIS, MODEL_AXIS))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Arrays shaped [..., batch, time]: the batch axis (second to last) is split over `data`."""
    return NamedSharding(mesh, P(*([None] * (ndim - 2)), DATA_AXIS, None))


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows of a batch -> global arrays sharded over the mesh (the rows of all processes, in
    process order, make the global batch)."""
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v) for k, v in batch.items()}


def state_shardings(
    abstract_state: State, mesh: Mesh, layout: str, tensor_parallel_axes: dict[tuple[str, ...], int] | None = None
) -> State:
    """A sharding for every array leaf of the (abstract) train state, or of a model alone; `layout` is `dp` or `fsdp`;
    `tensor_parallel_axes`: the model's (path suffix -> axis split over `model`), default the state's model's own (or
    the model's, given a model)."""
    if tensor_parallel_axes is None:
        model = getattr(abstract_state, "model", abstract_state)
        tensor_parallel_axes = getattr(model, "TENSOR_PARALLEL_AXES", {})
    n_data, n_model = mesh.shape[DATA_AXIS], mesh.shape[MODEL_AXIS]

    def leaf(path: tuple, x: Any) -> NamedSharding | None:  # x: any leaf of the state
        if not hasattr(x, "shape"):
            return None
        spec: list[str | None] = [None] * len(x.shape)
        tp_axis = _tensor_parallel_axis(path, tensor_parallel_axes) if n_model > 1 else None
        if tp_axis is not None and tp_axis < len(x.shape) and x.shape[tp_axis] % n_model == 0:
            spec[tp_axis] = MODEL_AXIS
        if layout == "fsdp" and n_data > 1 and int(np.prod(x.shape)) >= FSDP_MIN_SIZE:
            free = [d for d in sorted(range(len(x.shape)), key=lambda d: -x.shape[d]) if spec[d] is None]
            divisible = [d for d in free if x.shape[d] % n_data == 0]
            if divisible:
                spec[divisible[0]] = DATA_AXIS
        while spec and spec[-1] is None:  # P("data", None) is P("data"): one spelling per layout
            spec.pop()
        return NamedSharding(mesh, P(*spec))

    return jax.tree_util.tree_map_with_path(leaf, abstract_state)


def _tensor_parallel_axis(path: tuple, axes: dict[tuple[str, ...], int]) -> int | None:
    """The axis a state leaf splits over `model`: a parameter's own, or the parameter's whose path ends this leaf's
    (Adam's moments, MultiSteps' accumulator and the statistics buffers mirror the parameters' tree)."""
    names = tuple(getattr(k, "name", getattr(k, "key", None)) for k in path)
    for suffix, axis in axes.items():
        if names[-len(suffix) :] == suffix:
            return axis
    return None


def max_over_processes(value: int) -> int:
    """The largest of every process's `value`, on every process (identity with one process)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.asarray(value, np.int32))))


def per_device_bytes(abstract_state: chex.ArrayTree, shardings: chex.ArrayTree) -> int:
    """Bytes of the state that the most loaded device holds (from shapes and shardings; nothing is allocated)."""
    per_device: dict[jax.Device, int] = {}
    for x, sharding in zip(jax.tree.leaves(abstract_state), jax.tree.leaves(shardings)):
        shard_bytes = int(np.prod(sharding.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
        for device in sharding.device_set:
            per_device[device] = per_device.get(device, 0) + shard_bytes
    return max(per_device.values())
