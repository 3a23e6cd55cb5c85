"""XLA compilation: the run's XLA flags, a persistent cache, so repeat runs skip compiling, and a clock for how long
compiling took."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
from jax._src import xla_bridge  # backends_are_initialized: public JAX has no way to ask

from core.checks import existing_ancestor
from core.errors import ConfigError
from models.auto import DETERMINISTIC_GPU_FLAG
from training.config.system import SystemConfig

# JAX reports each phase of making an executable as a duration event; XLA's compile is the one that costs (tracing
# events nest, so summing them would count time twice). A persistent-cache hit reports no compile.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def xla_flags(system: SystemConfig) -> list[str]:
    """The XLA flags a run asks for: `system.xla_flags`, and with `system.deterministic` the deterministic kernels'
    (DETERMINISTIC_GPU_FLAG: reductions and scatters without atomics, autotuning among deterministic algorithms)."""
    flags = [*system.xla_flags, *([DETERMINISTIC_GPU_FLAG] if system.deterministic else [])]
    return list(dict.fromkeys(flags))  # each once: system.deterministic may repeat one of system.xla_flags


def init_xla_flags(system: SystemConfig) -> None:
    """Add the run's XLA flags (`xla_flags`) to XLA_FLAGS. XLA reads them once, when JAX starts its backend, so this
    must come before anything touches a device; a process whose backend already runs (a sweep's second job in the
    same process, a script that asked for the devices first) gets one line instead of flags silently ignored, unless
    XLA_FLAGS held them already, or all that is missing is the deterministic kernels on a CPU (its own are)."""
    held = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in xla_flags(system) if f not in held]
    if not flags:
        return
    if xla_bridge.backends_are_initialized():
        if flags == [DETERMINISTIC_GPU_FLAG] and jax.default_backend() == "cpu":
            return
        key = "system.xla_flags" if set(flags) & set(system.xla_flags) else "system.deterministic"
        raise ConfigError(
            f"config: {key}: the XLA backend of this process has started already, so XLA "
            f"would ignore {'them' if key == 'system.xla_flags' else 'it'}; "
            f"set XLA_FLAGS='{' '.join(flags)}' in the environment instead"
        )
    if set(flags) & set(system.xla_flags):
        refused = refused_by_xla(list(system.xla_flags))
        if refused:
            raise ConfigError(f"config: system.xla_flags: XLA refuses them ({refused}); correct or drop the flag")
    os.environ["XLA_FLAGS"] = " ".join([*held, *flags])


def refused_by_xla(flags: list[str]) -> str | None:
    """XLA's own complaint about `flags`, or None when it takes them. XLA checks its flags when a backend starts and
    aborts the process on one it does not know (or a value it cannot parse), so they are tried first in a process of
    their own: JAX's CPU backend, which knows every XLA flag, the GPU's included (0.85-1.0 s on the 2-core Xeon)."""
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    try:
        tried = subprocess.run(
            [sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired):
        return None  # no verdict: the run itself will start the backend with them
    if tried.returncode == 0:
        return None
    # XLA's first error or fatal log line (E/F<date> <time> <thread> <file>:<line>] ...), less its prefix: the unknown
    # flag, or the value it could not read (before the usage text it prints after it)
    logged = re.findall(r"^[EF]\d{4} [^\]]*\] (.*)$", tried.stderr, re.MULTILINE)
    return logged[0].strip() if logged else f"a process with them exited {tried.returncode}"


def init_compilation_cache(directory: str | None) -> None:
    """Keep compiled executables under `directory` (null: off). A second run of the same config, or of another
    config with the same shapes, loads them instead of compiling."""
    if not directory:
        return
    path = Path(directory).expanduser().absolute()
    existing_ancestor("system.compilation_cache_dir", path)  # a file on the way: one line, not a mkdir traceback
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class CompileClock:
    """Seconds XLA spent compiling since the clock was created."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._on = True
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **_) -> None:
        if self._on and event == COMPILE_EVENT:
            self.seconds += duration

    def stop(self) -> float:
        self._on = False
        return self.seconds
