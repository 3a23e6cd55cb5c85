"""Host memory that a process keeps for its next step instead of handing it back to the OS (`system.reuse_host_memory`).

XLA:CPU allocates each call's buffers with malloc and frees them when the call ends: for gpt2-mini at batch 16 about
1.5 GB a step, in blocks far above glibc's mmap threshold. glibc serves such blocks with mmap (or from a thread's own
64 MiB heaps, which it unmaps when they empty) and hands them back at free, so every step faults ~370,000 pages in
again and the kernel zeroes each one. Told to serve large blocks from its heap (no mmap), never to trim it, and to keep
one arena (every thread's blocks come from the main heap), glibc reuses the freed pages: 3.1M page faults over a
short benchmark became 0.5M, and the CPU step 1.07-1.10x faster (BENCHMARKS.md, "Host memory"). Two arenas were as
fast only when XLA's threads happened to land on the main one (a race: 1.2M-3.1M faults from run to run). The price:
a process keeps its peak host memory until it ends, and its threads share one arena's lock. This must run before
XLA starts its threads (an arena a thread has already stays its own). Other C libraries (macOS, musl) are left as
they are.
"""

from __future__ import annotations

import ctypes

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
ARENAS = 1  # see above: with two, whether XLA's threads reuse memory depends on which arena each lands on


def init_host_memory(reuse: bool) -> bool:
    """Keep freed host memory for reuse when `reuse` is true; True when glibc took it. Before the backend starts its
    threads: an arena a thread already has stays its own."""
    return reuse and keep_freed_memory()


def keep_freed_memory() -> bool:
    """Large blocks from the heap (no mmap), no trimming (-1 turns it off), one arena. False where the C library
    has no glibc mallopt, or refuses a parameter."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(
        mallopt(param, value) == 1 for param, value in ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1), (M_ARENA_MAX, ARENAS))
    )
