"""Resume: a killed sweep is rerun; completed runs are skipped, the rest redone from scratch.
Failures: a failing run is listed with its error and the exit code is 1.

The runs use the serial executor to keep this test short: resuming does not depend on where a
run's clients execute (the placement-group path runs in test_sweep_cluster.py).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from raysim.cli import main
from raysim.results import read_table
from raysim.sweep import load_sweep
from tests.integration.test_sweep_cluster import REPO, ray_env, stop_process_trees, stop_processes_under


SMOKE = REPO / "experiments" / "sweeps" / "smoke.yaml"
SERIAL = ["--set", "runtime.executor=serial"]


def _sweep_cmd(results: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "raysim.cli", "sweep", str(SMOKE), "--results-dir", str(results), *SERIAL, *extra]


def _runs(results: Path) -> pd.DataFrame:
    return read_table(str(results), "runs").set_index("run_id")


@pytest.mark.cluster
def test_killed_sweep_resumes_without_redoing_or_duplicating(ray_session, tmp_path, capsys):
    results = tmp_path / "results"
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    env = ray_env(RAY_TMPDIR=ray_tmp)   # this sweep's local Ray lives under its own temp dir
    sweep = load_sweep(SMOKE)
    first, second, third, _ = sweep.run_ids
    try:
        # One run at a time: kill the sweep (driver, its local Ray, the run in flight) once the
        # first run has completed and the second is running.
        log = tmp_path / "first.log"
        with log.open("w") as out:
            proc = subprocess.Popen(_sweep_cmd(results, "--max-concurrent", "1"), cwd=REPO, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            runs = _runs(results) if (results / "runs").is_dir() else pd.DataFrame(columns=["status"])
            if (runs["status"] == "completed").sum() >= 1 and (runs["status"] == "running").sum() >= 1:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the sweep ended before it could be killed:\n{log.read_text()[-3000:]}"
        # SIGKILL the sweep and everything under it at once (its local Ray, the run in flight),
        # as a crash would: nothing gets to mark the second run failed or finish it.
        stop_process_trees({proc.pid}, signals=(signal.SIGKILL,))
        proc.wait(timeout=30)
    finally:
        stop_processes_under(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)

    killed = _runs(results)
    assert killed.loc[first, "status"] == "completed" and killed.loc[second, "status"] == "running"
    done_at = killed.loc[first, "start_time"]
    # A run whose runs row was deleted but whose rounds survived (e.g. a crash while clearing):
    # plant a stale round 7 for the third run; the redo must remove it.
    stale = pq.read_table(results / "rounds" / f"{first}-r00001.parquet").to_pandas()
    stale["run_id"], stale["round"] = third, 7
    stale.to_parquet(results / "rounds" / f"{third}-r00007.parquet", index=False)

    # The rerun, in this process on the session's Ray (saves starting another local Ray).
    assert main(["sweep", str(SMOKE), "--results-dir", str(results), *SERIAL]) == 0
    assert "4 runs, 1 already completed, 3 to run" in capsys.readouterr().out

    runs = _runs(results)
    assert sorted(runs.index) == sorted(sweep.run_ids) and (runs["status"] == "completed").all()
    assert runs.loc[first, "start_time"] == done_at                       # skipped, not redone
    assert (runs[["rounds_completed"]].values == 2).all()
    rounds = read_table(str(results), "rounds")
    assert len(rounds) == 4 * 2 and not rounds.duplicated(["run_id", "round"]).any()
    assert set(rounds["round"]) == {1, 2}                                  # the stale round 7 is gone
    clients = read_table(str(results), "clients")
    assert len(clients) == 4 * 2 * 4 and not clients.duplicated(["run_id", "round", "client_id"]).any()
    partitions = read_table(str(results), "partitions")
    assert not partitions.duplicated(["run_id", "client_id", "label", "split"]).any()
    assert set(partitions["run_id"]) == set(sweep.run_ids)

    # Nothing left to do: exit 0.
    assert main(["sweep", str(SMOKE), "--results-dir", str(results), *SERIAL]) == 0
    assert "4 runs, 4 already completed, 0 to run" in capsys.readouterr().out


@pytest.mark.cluster
def test_failed_run_is_listed_and_exit_code_is_1(ray_session, tmp_path, capsys):
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "fails",
        "base": {"method": "fedavg", "rounds": 1, "batch_size": 32, "lr": 0.05, "runtime": {"executor": "serial"},
                 "data": {"name": "digits", "min_samples_per_client": 20}},
        # digits has 1797 samples (fewer in its train split): 4 clients run, 2000 cannot be partitioned
        "grid": {"num_clients": [4, 2000]},
    }))
    results = tmp_path / "results"
    assert main(["sweep", str(sweep_file), "--results-dir", str(results)]) == 1
    out = capsys.readouterr().out
    assert "1 run(s) did not complete" in out and "ConfigError: num_clients=2000 is more than the" in out
    runs = read_table(str(results), "runs").set_index("num_clients")
    assert runs.loc[4, "status"] == "completed" and runs.loc[2000, "status"] == "failed"
    assert "num_clients=2000" in runs.loc[2000, "error"]
