"""glibc malloc settings for the processes that train: keep multi-MB buffers instead of returning them.

By default glibc serves every allocation above a (dynamic) threshold of 128 kB to 32 MB with a fresh
``mmap`` and gives it back with ``munmap`` when freed, and it trims freed memory at the top of the
heap. A DP step allocates many such buffers (the noise, the per-example conv gradients, the
clipped sums, autograd's activations and output gradients), so every step pays a page fault per
4 kB page of each of them again: on the paper CNN at batch 64 with 2 threads, 8,193 minor faults
per ``bk`` step, against 128 with the settings below (the page-fault column of
``python experiments/bench/dp_step.py --no-malloc-tuning`` against its default, one run each;
``tests/unit/runtime/test_allocator.py``).

:func:`tune_malloc` raises the mmap threshold to :data:`MMAP_THRESHOLD` and the trim threshold to
:data:`TRIM_THRESHOLD` with ``mallopt``: buffers below 64 MiB come from the heap and are reused, and
up to 256 MiB of freed heap stays mapped in the process. It changes speed and resident memory,
never results. raysim applies it (``runtime.malloc_tuning``, default on) in the processes that
train or aggregate: each client actor when it configures for a run, and the driver when a
``Simulation`` starts. It cannot be undone in a process (glibc has no call that restores the
dynamic thresholds), so a pooled actor that once ran with it keeps it. On a C library other than
glibc it does nothing and says so by returning False.

:func:`spin_less` sets libgomp's spin count (``GOMP_SPINCOUNT``, :data:`GOMP_SPINCOUNT`) for a
process that has not loaded torch yet, unless it is set already. After each parallel region
libgomp's threads spin for up to 300,000 rounds (milliseconds here) before they sleep, and while
they spin they hold the cores on which raysim draws a DP step's noise with extra threads
(:mod:`raysim.noise`). The ``raysim`` command calls it before anything loads torch (a local
Ray it starts inherits the setting), and so do the client and driver actors as they start. Speed only.

This module imports only the standard library: a client actor loads it before torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Any

__all__ = ["GOMP_SPINCOUNT", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "spin_less", "tune_malloc", "malloc_tuned"]

#: Allocations below this many bytes come from the heap (glibc's default: dynamic, at most 32 MiB).
MMAP_THRESHOLD = 64 * 2**20
#: Freed memory at the top of the heap is returned to the OS only above this many bytes.
TRIM_THRESHOLD = 256 * 2**20

#: libgomp's spin count in the processes raysim starts (its default is 300,000).
GOMP_SPINCOUNT = "10000"

_M_TRIM_THRESHOLD = -1     # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3

_tuned = False


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version        # present in glibc only (not musl)
        libc.mallopt
    except (OSError, AttributeError):
        return None
    return libc


def tune_malloc() -> bool:
    """Apply the settings above to this process (idempotent); True where they are in effect."""
    global _tuned
    if _tuned:
        return True
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _tuned = ok
    return ok


def spin_less() -> None:
    """Set ``GOMP_SPINCOUNT`` to :data:`GOMP_SPINCOUNT` unless it is set, in a process that has not
    loaded torch yet (libgomp reads it once, when torch loads it)."""
    if "torch" not in sys.modules:
        os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)


def malloc_tuned() -> bool:
    """Whether :func:`tune_malloc` has taken effect in this process."""
    return _tuned


def configure_process(runtime: Any) -> None:
    """The per-process settings of a run, wherever it trains or aggregates: torch's thread count
    (``runtime.torch_threads``; the bits depend on it) and, with ``runtime.malloc_tuning``, the malloc
    thresholds above (speed only)."""
    import torch

    torch.set_num_threads(runtime.torch_threads)
    if runtime.malloc_tuning:
        tune_malloc()
