"""Checkpoint and resume: an interrupted run continues from its last checkpoint and ends with tables
equal to an uninterrupted run's, bit for bit, with no duplicate rows."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from raysim.results import ResultsSink, read_table
from raysim.runtime import execute
from tests.conftest import REPO
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation

TIMING = ("round_seconds", "client_train_seconds", "communication_seconds", "aggregation_seconds",
          "accounting_seconds", "eval_seconds", "client_seconds")


def _tables(folder) -> tuple[pd.DataFrame, pd.DataFrame]:
    rounds = read_table(str(folder), "rounds").sort_values("round").reset_index(drop=True)
    clients = read_table(str(folder), "clients").sort_values(["round", "client_id"]).reset_index(drop=True)
    return (rounds.drop(columns=[c for c in TIMING if c in rounds]),
            clients.drop(columns=[c for c in TIMING if c in clients]))


def _assert_same(a, b) -> None:
    for x, y in zip(_tables(a), _tables(b)):
        assert not x.duplicated(subset=[c for c in ("run_id", "round", "client_id") if c in x]).any()
        pd.testing.assert_frame_equal(x, y)


class Stop(Exception):
    pass


#: Client-level runs: the population ledger, adaptive C with its noised count, the DP-FTRL tree's pass state.
CLIENT_LEVEL = {
    "fedavg-client": dict(method="fedavg", num_clients=8, clients_per_round=4, participation="poisson",
                          privacy__unit="client", privacy__clip_norm=0.01),
    "adaptive-client": dict(method="dp-fedavg-adaptive", num_clients=8, clients_per_round=4,
                            participation="poisson", privacy__unit="client", privacy__clip_norm=0.01,
                            privacy__noise_multiplier=0.3),   # below 2σ_b = 2k/20: the count's share
    "tree-client": dict(method="fedavg", num_clients=8, clients_per_round=3, participation="shuffle",
                        privacy__unit="client", privacy__mechanism="tree", privacy__accountant="rdp",
                        privacy__clip_norm=0.01),
    # correlated noise: the BLT's buffers and BandMF's last noise vectors (two cyclic groups of 4 clients)
    "blt-client": dict(method="fedavg", num_clients=8, clients_per_round=2, participation="poisson",
                       privacy__unit="client", privacy__mechanism="blt", privacy__min_separation=2,
                       privacy__clip_norm=0.01),
    "bandmf-client": dict(method="fedavg", num_clients=8, clients_per_round=2, participation="poisson",
                          privacy__unit="client", privacy__mechanism="bandmf", privacy__min_separation=2,
                          privacy__clip_norm=0.01),
}


#: Correlated noise on the DP-SGD steps: each client's BandMF noise state, kept with its state between rounds.
STEP_NOISE = {"bandmf-steps": dict(method="fedsa", num_clients=8, clients_per_round=4, participation="poisson",
                                   privacy__mechanism="bandmf", privacy__min_separation=2)}


@pytest.mark.parametrize("method", ["feddimdp", "scaffold", *CLIENT_LEVEL, *STEP_NOISE])   # ADPC/CRA server state;
def test_interrupted_run_resumes_bit_for_bit(tmp_path, method):      # per-client controls; client-level state
    extra = {**CLIENT_LEVEL, **STEP_NOISE}.get(method, {"method": method})
    cfg = tiny_config(rounds=4, **{"privacy__noise_multiplier": 1.0, "data__min_samples_per_client": 10, **extra})
    execute(cfg, str(tmp_path / "whole"))

    def stop_after_2(rec):
        if rec.server_round == 2:
            raise Stop

    with pytest.raises(Stop):
        execute(cfg, str(tmp_path / "cut"), on_round=stop_after_2)
    sink = ResultsSink(str(tmp_path / "cut"))
    run_id = read_table(str(tmp_path / "cut"), "runs")["run_id"].item()
    assert sink.read_run(run_id)["status"] == "failed" and sink.read_checkpoint(run_id) is not None
    # a half-written round 3: its clients file landed, its rounds file did not
    clients = tmp_path / "cut" / "clients"
    shutil.copy(clients / f"{run_id}-r00002.parquet", clients / f"{run_id}-r00003.parquet")

    resumed = []
    summary = execute(cfg, str(tmp_path / "cut"), on_round=lambda rec: resumed.append(rec.server_round))
    assert resumed == [3, 4] and summary.row["status"] == "completed" and summary.row["rounds_completed"] == 4
    _assert_same(tmp_path / "whole", tmp_path / "cut")
    assert sink.read_checkpoint(run_id) is None          # a completed run keeps no checkpoint


@pytest.mark.parametrize("key, saved", [("client_device", "cuda"), ("torch_threads", 2)])
def test_a_resume_that_would_release_other_bits_is_refused_in_one_line(tmp_path, key, saved):
    """A checkpoint records the clients' device and the thread count; redoing its unsaved rounds under
    another one would be a second, different release of data the ledger counted once."""
    import pickle

    from raysim.simulation import CheckpointError
    cfg = tiny_config(method="fedsa", rounds=3, privacy__noise_multiplier=1.0)

    def stop(rec):
        raise Stop

    with pytest.raises(Stop):
        execute(cfg, str(tmp_path), on_round=stop)
    sink = ResultsSink(str(tmp_path))
    run_id = read_table(str(tmp_path), "runs")["run_id"].item()
    state = pickle.loads(sink.read_checkpoint(run_id))
    assert state["release"] == {"client_device": "cpu", "torch_threads": 1}
    state["release"][key] = saved                       # as if it had run elsewhere
    sink.write_checkpoint(run_id, pickle.dumps(state))
    with pytest.raises(CheckpointError, match=f"checkpointed with {key}={saved} and resumes with {key}=") as info:
        execute(cfg, str(tmp_path))
    assert "\n" not in str(info.value) and "--restart" in str(info.value)
    assert sink.read_run(run_id)["status"] == "failed"   # the refusal is recorded, nothing was redone
    assert len(read_table(str(tmp_path), "rounds")) == 1


def test_restart_ignores_the_checkpoint(tmp_path):
    cfg = tiny_config(method="fedsa", rounds=3, privacy__noise_multiplier=1.0)

    def stop(rec):
        raise Stop

    with pytest.raises(Stop):
        execute(cfg, str(tmp_path), on_round=stop)
    seen = []
    execute(cfg, str(tmp_path), restart=True, on_round=lambda rec: seen.append(rec.server_round))
    assert seen == [1, 2, 3]


@pytest.mark.cluster
@pytest.mark.parametrize("sets", [["method=feddimdp"],
                                  ["method=dp-fedavg-adaptive", "privacy.unit=client", "num_clients=30",
                                   "clients_per_round=10", "participation=poisson", "data.min_samples_per_client=10",
                                   "privacy.clip_norm=0.01", "privacy.noise_multiplier=0.3"],
                                  ["method=fedavg", "privacy.unit=client", "privacy.mechanism=blt", "num_clients=30",
                                   "clients_per_round=10", "participation=poisson", "data.min_samples_per_client=10",
                                   "privacy.clip_norm=0.01", "privacy.min_separation=2"],
                                  ["method=fedavg", "privacy.unit=client", "privacy.mechanism=bandmf", "num_clients=30",
                                   "clients_per_round=10", "participation=poisson", "data.min_samples_per_client=10",
                                   "privacy.clip_norm=0.01", "privacy.min_separation=2"]],
                         ids=["example", "client", "blt", "bandmf"])
def test_sigkilled_raysim_run_on_ray_resumes_bit_for_bit(tmp_path, sets):
    """SIGKILL the `raysim run` process (Ray, 10 actors) after round 2, rerun it, compare."""
    common = [sys.executable, "-m", "raysim.cli", "run", str(REPO / "experiments" / "quickstart.yaml"),
              "--set", "rounds=4", "--set", "privacy.epsilon=null",
              "--set", "privacy.noise_multiplier=1.0", "--set", "runtime.num_actors=10"]
    for item in sets:
        common += ["--set", item]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    subprocess.run(common + ["--set", "runtime.executor=serial", "--results-dir", str(tmp_path / "whole")],
                   check=True, env=env, cwd=REPO, capture_output=True, timeout=600)
    cut = tmp_path / "cut"
    proc = subprocess.Popen(common + ["--results-dir", str(cut)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            done = [f for f in (cut / "rounds").glob("*.parquet")] if (cut / "rounds").is_dir() else []
            if len(done) >= 2 and (cut / "checkpoints").is_dir() and any((cut / "checkpoints").rglob("state.pkl")):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run did not reach round 2")
        os.killpg(proc.pid, signal.SIGKILL)    # the run and the Ray cluster it started: nothing cleans up
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert read_table(str(cut), "runs")["status"].item() == "running"
    subprocess.run(common + ["--results-dir", str(cut)], check=True, env=env, cwd=REPO, capture_output=True,
                   timeout=600)
    assert read_table(str(cut), "runs")["status"].item() == "completed"
    _assert_same(tmp_path / "whole", cut)
