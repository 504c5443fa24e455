"""raysim.allocator: the malloc settings take effect, stop the per-step page faults, and are applied
where raysim trains."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from raysim import allocator
from raysim.config import Config, RuntimeConfig, result_hash

_FAULTS = textwrap.dedent("""
    import resource, sys
    import torch
    from raysim.allocator import tune_malloc
    tuned = tune_malloc() if sys.argv[1] == "on" else False
    def step():
        # multi-MB buffers allocated, written and freed every step; the 40 MB one is above the largest
        # threshold glibc's own adaptation reaches (32 MiB), so with its defaults it is a fresh mmap
        bufs = [torch.empty(n).fill_(1.0) for n in (10_000_000, 2_200_000, 1_000_000)]
        return sum(float(b[0]) for b in bufs)
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(tuned, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
""")


def _faults_per_step(mode: str) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], check=True, capture_output=True, text=True)
    tuned, faults = out.stdout.split()
    return tuned == "True", float(faults)


@pytest.mark.skipif(allocator._glibc() is None, reason="glibc's mallopt is not available on this platform")
def test_tuning_removes_page_faults_of_multi_mb_buffers():
    tuned_off, faults_off = _faults_per_step("off")
    tuned_on, faults_on = _faults_per_step("on")
    assert not tuned_off and tuned_on
    # the 40 MB buffer alone is ~9,800 fresh 4 kB pages a step with glibc's defaults
    assert faults_off > 5000
    assert faults_on < faults_off / 10         # measured here: 0 against 9,981


def test_tune_malloc_is_idempotent_and_reported():
    first = allocator.tune_malloc()
    assert allocator.tune_malloc() == first == allocator.malloc_tuned()


def test_malloc_tuning_is_a_runtime_knob_outside_the_run_id():
    base = Config()
    assert base.runtime.malloc_tuning is True
    off = base.replace(runtime=RuntimeConfig(malloc_tuning=False))
    assert result_hash(off) == result_hash(base)
