"""`no_device_to_host()`: a region of the loop where reading a device array's values on the host raises.

Such a read makes the host wait until the device has computed the array, so dispatch cannot run ahead; across
processes a collective read makes every host wait for the slowest. `system.transfer_guard=true` runs the loop's steps
that do not log, evaluate, save or agree to stop inside this region, to prove they never do.

On GPUs and TPUs this is JAX's own guard, `jax.transfer_guard_device_to_host("disallow")`. On CPU, device memory is
host memory and JAX's guard never fires (with jax 0.10.2, `float(x)`, `np.asarray(x)` and `jax.device_get(x)` all
pass under it), so on CPU the same rule is also checked in Python where values are read: `jax.Array`'s value
(`float`, `int`, `bool`, `.item()`, `.tolist()`, `jax.device_get`) and JAX's multi-host helpers (`process_allgather`,
`broadcast_one_to_all`, `sync_global_devices`). One read escapes the CPU check: `np.asarray` of a CPU array, which
NumPy takes through the buffer protocol without calling into Python. The check is a thread-local flag, so other
threads (the batch prefetcher) and code outside the region are never affected.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import jax

_region = threading.local()
_installed = False


class HostTransferError(RuntimeError):
    pass


def _refuse(what: str) -> None:
    if getattr(_region, "active", False):
        raise HostTransferError(
            f"Disallowed device-to-host transfer ({what}) at a step that does not log, evaluate, "
            "save or agree to stop (system.transfer_guard=true)"
        )


def _install_cpu_checks() -> None:
    """Wrap the Python-level doors to an array's values once; each checks the thread-local flag first."""
    global _installed
    if _installed:
        return
    from jax._src import array as jax_array
    from jax.experimental import multihost_utils

    value = jax_array.ArrayImpl._value

    def guarded_value(self):
        _refuse("reading a jax.Array's value")
        return value.fget(self)

    jax_array.ArrayImpl._value = property(guarded_value)
    for name in ("process_allgather", "broadcast_one_to_all", "sync_global_devices"):
        original = getattr(multihost_utils, name)

        @functools.wraps(original)
        def guarded(*args, _original=original, _name=name, **kwargs):
            _refuse(f"multihost_utils.{_name}")
            return _original(*args, **kwargs)

        setattr(multihost_utils, name, guarded)
    _installed = True


@contextlib.contextmanager
def no_device_to_host() -> Iterator[None]:
    if jax.default_backend() == "cpu":
        _install_cpu_checks()
    _region.active = True
    try:
        with jax.transfer_guard_device_to_host("disallow"):
            yield
    finally:
        _region.active = False
