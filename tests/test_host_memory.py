"""system.reuse_host_memory (training/loop/host_memory.py): freed host memory stays in the process for the next step."""

import subprocess
import sys

import pytest

import train_jax
from helpers import tiny_overrides

# In a fresh interpreter (the allocator's settings are the process's for good): 64 MiB taken with malloc, written,
# freed, taken and written again, as XLA:CPU does with a step's buffers; prints the page faults of the second time.
SECOND_TIME_FAULTS = """
import ctypes, resource, sys
from training.loop.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
block = libc.malloc(size); ctypes.memset(block, 1, size); libc.free(block)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = libc.malloc(size); ctypes.memset(block, 1, size); libc.free(block)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def second_time_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SECOND_TIME_FAULTS, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_a_freed_block_is_reused_without_faulting_its_pages_in_again():
    pages = (64 << 20) // 4096
    assert second_time_faults("default") > pages // 2  # glibc hands a block this large back to the OS, and faults it in
    assert second_time_faults("keep") < pages // 100


@pytest.mark.parametrize("setting", [True, False])
def test_a_run_asks_for_it_before_anything_else_as_its_config_says(setting, monkeypatch, capsys, data_cache):
    """train_jax.py hands `system.reuse_host_memory` to the allocator first thing: here a run stopped at its device
    check (num_devices=16 of 8), one line and exit 2, has asked already."""
    asked = []
    monkeypatch.setattr(train_jax, "init_host_memory", asked.append)
    overrides = tiny_overrides(data_cache, "system.num_devices=16", f"system.reuse_host_memory={setting}")
    assert train_jax.command_line(overrides) == 2
    assert "system.num_devices" in capsys.readouterr().err
    assert asked == [setting]
