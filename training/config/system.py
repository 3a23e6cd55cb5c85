"""The `system` section: devices, processes, numerics and tooling of the machine a run is on, and the checks on its
values that do not need the devices (those that do are `check_devices`, training/config/root.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from core.checks import fail


class Dtype(StrEnum):
    """The compute dtype; parameters, optimizer state, softmax and loss stay float32 (training/step/precision.py)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"  # with dynamic loss scaling
    fp8 = "fp8"  # bfloat16 with the blocks' matmuls in FP8 (e4m3 forward, e5m2 gradients; models/fp8.py)


class Sharding(StrEnum):
    dp = "dp"  # data parallel: parameters and optimizer state replicated on every device
    fsdp = "fsdp"  # parameters and optimizer state sharded over the `data` axis


@dataclass(frozen=True)
class SystemConfig:
    dtype: Dtype = Dtype.float32  # compute dtype
    fp8_amax_history: int = 16  # dtype=fp8: steps of amax history each tensor's scale is taken from (delayed scaling)
    # dtype=fp8: powers of two of headroom in each scale: a tensor may grow 2^margin times past its history's amax
    # before its largest values clip to the format's max, at the cost of as many powers of two of range at the bottom
    fp8_margin: int = 0
    sharding: Sharding = Sharding.dp  # how parameters and optimizer state are laid out over devices
    num_devices: Optional[int] = None  # local devices to use (single process); null = all
    mesh_model: int = 1  # devices on the mesh's `model` axis (Megatron tensor parallelism); `data` takes the rest
    peak_flops: Optional[float] = None  # per-device peak FLOP/s for MFU; null = from the table of known devices
    # processes in a multi-process (multi-host) run; null = from the launcher's environment (SLURM, Open MPI, JAX_*
    # variables)
    num_processes: Optional[int] = None
    process_id: Optional[int] = None  # this process's rank, 0 .. num_processes - 1
    coordinator_address: Optional[str] = None  # host:port of process 0
    cpu_devices_per_process: Optional[int] = None  # CPU only: devices each process simulates (one process, or each)
    distributed_timeout_s: int = 300  # how long to wait for every process to join, or for one that falls silent
    compilation_cache_dir: Optional[str] = ".cache/jax"  # persistent XLA compilation cache; null = off
    # flags added to XLA_FLAGS before the backend starts, each quoted on the command line:
    # 'system.xla_flags=["--xla_gpu_enable_latency_hiding_scheduler=true"]'; what each is worth is in BENCHMARKS.md
    xla_flags: list[str] = field(default_factory=list)
    # true: the same inputs give the same bits on a GPU too (XLA's deterministic kernels: no atomics in reductions and
    # scatters), so a resumed run equals the straight one there; costs step time (BENCHMARKS.md). XLA:CPU's kernels
    # are deterministic already
    deterministic: bool = False
    # true: any device-to-host transfer at a step that does not log, evaluate, save or agree to stop raises
    # (jax.transfer_guard): checks that the loop never makes the device wait for the host between those steps
    transfer_guard: bool = False
    # keep freed host memory for the next step instead of returning it to the OS (glibc; training/loop/host_memory.py):
    # XLA:CPU's steps then stop faulting their buffers back in, zeroed, at each call (the CPU step 1.07-1.10x faster,
    # BENCHMARKS.md); a process keeps its peak host memory until it ends
    reuse_host_memory: bool = True
    # [a, b]: trace steps a to b (counted from 1, inclusive) with jax.profiler into <run_dir>/profile, for
    # TensorBoard's profile plugin (the .xplane.pb) and Perfetto (perfetto_trace.json.gz); [] = no trace
    profile_steps: list[int] = field(default_factory=list)

    def check(self) -> None:
        for flag in self.xla_flags:
            if not (isinstance(flag, str) and flag.startswith("--xla_") and flag.split() == [flag]):
                fail("system.xla_flags", f"each must be one XLA flag, --xla_<name>[=<value>]; got {flag!r}")
        if self.peak_flops is not None and self.peak_flops <= 0:  # -1 logged an MFU of -1.6e12 %
            fail(
                "system.peak_flops",
                f"must be > 0 FLOP/s per device, or null for the known devices'; got {self.peak_flops}",
            )
        if self.cpu_devices_per_process is not None and self.cpu_devices_per_process < 1:  # 0 was ignored, unsaid
            fail(
                "system.cpu_devices_per_process",
                f"must be >= 1, or null for XLA's own count; got {self.cpu_devices_per_process}",
            )
        if self.fp8_amax_history < 1:
            fail("system.fp8_amax_history", f"must be >= 1; got {self.fp8_amax_history}")
        if not 0 <= self.fp8_margin <= 8:
            fail("system.fp8_margin", f"must be 0 to 8 (powers of two of headroom); got {self.fp8_margin}")
        if self.num_devices is not None and (self.num_processes or 1) > 1:
            fail(
                "system.num_devices", "selects local devices of a single process; leave it null with num_processes > 1"
            )
        if self.distributed_timeout_s < 10:  # a peer is lost after this long without its 1 s heartbeat
            fail(
                "system.distributed_timeout_s",
                f"must be >= 10 s (each process shows a sign of life every second); got {self.distributed_timeout_s}",
            )
        steps = self.profile_steps
        if steps and not (len(steps) == 2 and 1 <= steps[0] <= steps[1]):
            fail("system.profile_steps", f"must be [first, last] with 1 <= first <= last, or []; got {list(steps)}")
        if self.num_processes is not None and self.num_processes < 1:  # 0 or less trained one process, unsaid
            fail("system.num_processes", f"must be >= 1, or null for a launcher's count; got {self.num_processes}")
        # process_id without num_processes is not refused here: a launcher's environment may give the count
        # (JAX_NUM_PROCESSES with JAX_COORDINATOR_ADDRESS), and without one init_distributed refuses a rank other than 0
        if self.process_id is not None and self.process_id < 0:
            fail("system.process_id", f"must be >= 0; got {self.process_id}")
        if self.num_processes is not None and self.process_id is not None and self.process_id >= self.num_processes:
            fail("system.process_id", f"must be in [0, {self.num_processes}); got {self.process_id}")
