"""The fractional-GPU path, end to end on a machine without one: Ray is told it has 2 GPUs that do not
exist (``ray.init(num_gpus=2)``), so a user's first run on a GPU cluster is not the first time this
code runs. Placement groups get GPU bundles, each client actor asks for a quarter GPU, evaluation runs
on an actor, and ``gpu_memory_fraction`` is guarded where CUDA is absent (the clients train on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raysim.results import read_table
from tests.conftest import REPO

pytestmark = pytest.mark.cluster

SCRIPT = r"""
import json, sys
import ray
from raysim.config import config_from_dict
from raysim.runtime import execute_row
from raysim.runtime.sweep_runner import run_sweep, size_run
ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
base = json.loads(sys.argv[3])
from raysim.run_plan import plan_run
cfgs = [plan_run(config_from_dict({**base, "seed": s})) for s in (0, 1)]
bundles = [size_run(c).bundles for c in cfgs]
fresh = run_sweep(cfgs, sys.argv[1], "gpu", run_one=execute_row, reuse_actors=False)
pooled = run_sweep(cfgs, sys.argv[2], "gpu", run_one=execute_row, reuse_actors=True)
print(json.dumps({"bundles": bundles, "status": sorted(o.status for o in fresh + pooled),
                  "errors": [o.error for o in fresh + pooled if o.error]}))
"""


BASE = {"method": "fedsa", "rounds": 2, "num_clients": 4, "batch_size": 32, "privacy": {"noise_multiplier": 1.0},
        "data": {"name": "digits", "min_samples_per_client": 20, "test_subsample": 100},
        "runtime": {"num_actors": 2, "num_cpus_per_client": 0.5, "num_gpus_per_client": 0.25,
                    "gpu_memory_fraction": 0.25, "eval_on": "actor"}}


def test_quarter_gpu_clients_on_declared_gpus_run_and_match_the_serial_executor(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "fresh"), str(tmp_path / "pooled"),
                           json.dumps(BASE)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"] == ["completed"] * 4, out["errors"]
    assert out["bundles"] == [[{"CPU": 0.5, "GPU": 0.25}] * 2] * 2      # placement groups with GPU bundles
    from raysim.config import config_from_dict
    from raysim.runtime import execute
    serial = tmp_path / "serial"
    for seed in (0, 1):
        execute(config_from_dict({**BASE, "seed": seed, "runtime": {"executor": "serial"}}), str(serial))
    want = read_table(str(serial), "rounds").sort_values(["run_id", "round"])
    for folder in ("fresh", "pooled"):
        got = read_table(str(tmp_path / folder), "rounds").sort_values(["run_id", "round"])
        assert got["test_accuracy"].tolist() == want["test_accuracy"].tolist()   # CPU bits, GPU scheduling
        runs = read_table(str(tmp_path / folder), "runs")
        assert all(len(json.loads(n)) >= 1 for n in runs["client_nodes"])
