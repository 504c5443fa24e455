"""Tests that start Python processes importing torch: the malloc settings in a fresh process, what
importing the models loads, and the participation schedule in another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from raysim import allocator
from raysim.config import config_from_dict
from raysim.participation import participation_schedule
from tests.conftest import REPO

#: Runs Python subprocesses: a ``make test-cluster`` test.
pytestmark = pytest.mark.cluster


def _cfg(**values):
    base = {"num_clients": 50, "clients_per_round": 5, "rounds": 40, "seed": 0}
    return config_from_dict({**base, **values})


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


def test_importing_models_does_not_import_torchvision():
    code = "import sys, raysim.models; assert 'torchvision' not in sys.modules, 'torchvision imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_schedule_is_the_same_in_another_process():
    """No process state (hash seeds, torch threads, import order) enters the schedule."""
    code = ("import json; from raysim.config import config_from_dict; import torch; torch.set_num_threads(2); "
            "from raysim.participation import participation_schedule as s; "
            "print(json.dumps([c.tolist() for c in s(config_from_dict({'num_clients': 50, 'clients_per_round': 5, "
            "'rounds': 40, 'participation': 'poisson', 'runtime': {'executor': 'ray'}}))]))")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=REPO)
    here = [c.tolist() for c in participation_schedule(_cfg(participation="poisson"))]
    assert json.loads(out.stdout) == here
