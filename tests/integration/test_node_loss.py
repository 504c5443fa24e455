"""Node loss: the worker node of a 2-node cluster dies (its raylet and everything under it is
SIGKILLed) in the middle of a sweep. Runs that lost their actors are resumed from their checkpoints
on the head, every run completes, and the tables equal an undisturbed (serial) run's, bit for bit."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time

import pandas as pd
import pytest
import yaml

from raysim.results import read_table
from raysim.runtime import execute
from raysim.sweep import load_sweep
from tests.integration.test_sweep_cluster import (REPO, _proc_table, ray_env, start_two_nodes, stop_process_trees,
                                                  stop_processes_under)

pytestmark = pytest.mark.cluster

SWEEP = {
    "name": "nodeloss",
    "base": {"rounds": 8, "num_clients": 4, "batch_size": 32, "lr": 0.05,
             "privacy": {"noise_multiplier": 1.0},
             "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5, "min_samples_per_client": 20},
             "runtime": {"num_actors": 2, "num_cpus_per_client": 0.5}},
    "grid": {"method": ["fedsa", "feddimdp"], "seed": [0, 1]},
}
TIMING = ("round_seconds", "client_train_seconds", "communication_seconds", "aggregation_seconds",
          "accounting_seconds", "eval_seconds", "client_seconds")


def _clean(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.drop(columns=[c for c in TIMING if c in df]).sort_values(keys).reset_index(drop=True)


def test_worker_node_dies_mid_sweep(tmp_path):
    sweep_file = tmp_path / "nodeloss.yaml"
    sweep_file.write_text(yaml.safe_dump(SWEEP))
    temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    env = ray_env()
    results = tmp_path / "results"
    try:
        gcs, _ = start_two_nodes(temp_dir, env)
        sweep = subprocess.Popen([sys.executable, "-m", "raysim.cli", "sweep", str(sweep_file), "--results-dir",
                                  str(results), "--address", f"127.0.0.1:{gcs}"], env=env, cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 300
        while time.time() < deadline and len(list((results / "rounds").glob("*.parquet"))) < 3:
            time.sleep(0.2)
        assert len(list((results / "rounds").glob("*.parquet"))) >= 3, "the sweep did not get going"
        table = _proc_table()
        worker = {p for p, (_, cmd) in table.items() if "raylet" in cmd and "worker_node" in cmd}
        assert len(worker) == 1
        stop_process_trees(worker, signals=(9,), table=table)        # the node dies, with its workers
        out, _ = sweep.communicate(timeout=900)
    finally:
        stop_processes_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert sweep.returncode == 0, out[-3000:]

    configs = load_sweep(sweep_file).configs
    runs = read_table(str(results), "runs")
    assert len(runs) == len(configs) and (runs["status"] == "completed").all(), runs[["run_id", "status", "error"]]
    for cfg in configs:   # the undisturbed reference: serial, bitwise equal to Ray (test_determinism)
        execute(cfg.replace(runtime=cfg.runtime.__class__(executor="serial")), str(tmp_path / "reference"))
    for name, keys in (("rounds", ["run_id", "round"]), ("clients", ["run_id", "round", "client_id"])):
        got, want = read_table(str(results), name), read_table(str(tmp_path / "reference"), name)
        assert not got.duplicated(keys).any()
        pd.testing.assert_frame_equal(_clean(got, keys), _clean(want, keys))
    assert "was lost to the cluster" in out and "resuming it from its last checkpoint" in out, out[-3000:]
