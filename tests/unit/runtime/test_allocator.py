"""raysim.allocator: the malloc settings are idempotent, reported, and outside the run id (that they stop
the per-step page faults is measured in tests/integration/test_processes.py)."""
from __future__ import annotations


from raysim import allocator
from raysim.config import Config, RuntimeConfig, result_hash


def test_tune_malloc_is_idempotent_and_reported():
    first = allocator.tune_malloc()
    assert allocator.tune_malloc() == first == allocator.malloc_tuned()


def test_malloc_tuning_is_a_runtime_knob_outside_the_run_id():
    base = Config()
    off = base.replace(runtime=RuntimeConfig(malloc_tuning=False))
    assert result_hash(off) == result_hash(base)
