"""Where arrays live: the device mesh, the batch and state layouts, and host -> device transfer.

The mesh has one axis, `data`. Batches are split along their batch axis over it. Parameters and optimizer state are
replicated (`dp`) or split along each array's largest dimension that the axis divides (`fsdp`); XLA inserts the
gathers and reductions. The step and the model never name devices: they receive these shardings.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"
FSDP_MIN_SIZE = 2**14  # arrays smaller than this stay replicated: sharding them saves nothing worth a collective


def init_mesh(num_devices: int | None = None) -> Mesh:
    """A 1-D mesh over all devices of all processes, or over the first `num_devices` local ones (single process)."""
    devices = jax.devices() if num_devices is None else jax.local_devices()[:num_devices]
    return Mesh(np.array(devices), (DATA_AXIS,))


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape[DATA_AXIS]


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Arrays shaped [..., batch, time]: the batch axis (second to last) is split over `data`."""
    return NamedSharding(mesh, P(*([None] * (ndim - 2)), DATA_AXIS, None))


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows of a batch -> global arrays sharded over the mesh (the rows of all processes, in
    process order, make the global batch)."""
    return {
        k: jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v) for k, v in batch.items()
    }


def state_shardings(abstract_state: Any, mesh: Mesh, layout: str) -> Any:
    """A sharding for every array leaf of the (abstract) train state; `layout` is `dp` or `fsdp`."""
    n = data_parallel_size(mesh)
    replicated = NamedSharding(mesh, P())

    def leaf(x: Any) -> Any:
        if not hasattr(x, "shape"):
            return None
        if layout != "fsdp" or n == 1 or int(np.prod(x.shape)) < FSDP_MIN_SIZE:
            return replicated
        dims = sorted(range(len(x.shape)), key=lambda d: -x.shape[d])
        for d in dims:
            if x.shape[d] % n == 0:
                spec = [None] * len(x.shape)
                spec[d] = DATA_AXIS
                return NamedSharding(mesh, P(*spec))
        return replicated

    return jax.tree.map(leaf, abstract_state)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())
