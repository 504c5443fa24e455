"""Every benchmark of experiments/bench/ runs at tiny settings and prints its JSON (a smoke test of the
suite that `make bench` runs at full settings; the numbers themselves are not checked)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

#: Runs Python subprocesses: a ``make test-cluster`` test.
pytestmark = pytest.mark.cluster

BENCH = REPO / "experiments" / "bench"


def _run(script: str, *args: str, timeout: int = 600) -> str:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_dp_step_compares_engines_and_profiles_the_real_engine():
    rows = json.loads(_run("dp_step.py", "--json", "--steps", "1", "--warmup", "0", "--batch-size", "8",
                           "--threads", "1", "--engines", "plain,bk,batch"))
    assert [r["key"] for r in rows] == ["plain", "batch", "bk"] and all(r["samples_per_s"] > 0 for r in rows)
    phases = {r["phase"] for r in json.loads(_run("dp_step.py", "--profile", "--json", "--steps", "1", "--warmup",
                                                  "0", "--batch-size", "8", "--threads", "1"))}
    assert {"noise", "forward", "backward", "clip factors", "optimiser step", "TOTAL DP step"} <= phases
    assert any(p.startswith("norms ") for p in phases) and any(p.startswith("clipped sum ") for p in phases)
    assert {"plain SGD, channels-last: forward", "TOTAL plain SGD step, channels-last"} <= phases
    rows = json.loads(_run("dp_step.py", "--json", "--steps", "1", "--warmup", "0", "--batch-size", "2",
                           "--threads", "1", "--engines", "plain,bk", "--model", "char_lstm"))
    assert [r["key"] for r in rows] == ["plain", "bk"] and all(r["median_step_ms"] > 0 for r in rows)


def test_stacked_clients_trains_the_same_weights():
    arms = "loop,stacked" + (",compiled" if shutil.which("c++") else "")   # Inductor compiles C++
    out = json.loads(_run("stacked_clients.py", "--clients", "2", "--steps", "2", "--repeats", "1", "--arms", arms,
                          "--json"))
    assert [r["arm"] for r in out["rows"]] == ["one client at a time", "stacked (vmap over clients)"] + (
        ["one client at a time, torch.compile"] if "compiled" in arms else [])
    assert all(r["samples_per_s"] > 0 and r["max_abs_weight_difference"] < 1e-3 for r in out["rows"])
    assert out["rows"][0]["max_abs_weight_difference"] == 0 and out["matmul_gflops_per_s"] > 0
    assert 0.05 < out["gflop_per_sample"] < 0.2   # the paper CNN's forward and backward on 3×32×32


@pytest.mark.cluster
def test_round_overhead():
    out = json.loads(_run("round_overhead.py", "--dataset", "digits", "--num-clients", "2", "--timed-rounds", "1",
                          "--json"))
    assert out["serial"]["warm_round_s"] > 0 and out["ray"]["warm_round_s"] > 0


@pytest.mark.cluster
def test_sweep_overhead(tmp_path):
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text("name: tiny\nbase: {method: fedavg, rounds: 1, num_clients: 2, batch_size: 32,\n"
                     "  data: {name: digits, min_samples_per_client: 20, test_subsample: 100},\n"
                     "  runtime: {num_actors: 1, num_cpus_per_client: 0.5}}\ngrid: {seed: [0, 1]}\n")
    out = json.loads(_run("sweep_overhead.py", "--sweep", str(sweep), "--max-concurrent", "1", "--json"))
    assert out["arms"]["pool on"]["runs"] == 2 and out["arms"]["pool off"]["runs"] == 2
    runs = out["arms"]["pool on"]["per_run"]   # one run at a time: the first starts the actors, the second borrows them
    assert [r["warm"] for r in runs] == [False, True] and all(r["overhead_s"] > 0 for r in runs)


@pytest.mark.cluster
def test_population():
    out = _run("population.py", "--dataset", "digits", "--methods", "fedsa", "--sizes", "20", "--clients-per-round",
               "2", "--rounds", "2", "--test-subsample", "100", "--json")
    rows = json.loads(out[out.index("["):])
    assert [(r["method"], r["num_clients"]) for r in rows] == [("fedsa", 20)]


def test_adpc_sigma_h():
    out = json.loads(_run("adpc_sigma_h.py", "--config", "experiments/quickstart.yaml", "--set", "num_clients=2",
                          "--set", "rounds=2", "--grid", "25", "--json"))
    assert [r["histogram_noise_multiplier"] for r in out["rows"]] == [None, 25]
    assert out["rows"][1]["max_sigma"] >= out["rows"][0]["max_sigma"] > 0


@pytest.mark.cluster
def test_tune_speed():
    out = json.loads(_run("tune_speed.py", "--lrs", "2", "--rounds", "1", "--tuning-seeds", "1", "--final-seeds", "1",
                          "--json"))
    assert out["runs"] > 0 and out["rerun_ran_nothing"] is True


def test_accounting_round():
    rows = json.loads(_run("accounting_round.py", "--rounds", "3", "--json"))
    assert {(r["accountant"], r["schedule"]) for r in rows} == {(a, s) for a in ("pld", "rdp")
                                                                for s in ("constant", "decaying")}
    assert all(r["median_round_ms"] > 0 and 0 < r["epsilon"] < 100 for r in rows)


def test_adpc_read():
    out = _run("adpc_read.py", "--trials", "2")
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 8 and all(len(r.split("|")) == 8 for r in rows)


def test_correlated_noise():
    rows = json.loads(_run("correlated_noise.py", "--rounds", "20", "--params", "1000", "--json"))
    assert [r["mechanism"] for r in rows] == ["gaussian", "tree", "blt", "bandmf", "blt", "bandmf"]
    assert all(r["sigma"] > 0 and r["plan_seconds"] > 0 for r in rows)
    assert all((r["stream_step_ms"] is None) == (r["mechanism"] in ("gaussian", "tree")) for r in rows)


def test_step_noise():
    rows = {r["mechanism"]: r for r in json.loads(_run("step_noise.py", "--examples", "134", "--json"))}
    ind, band = rows["gaussian"], rows["bandmf"]
    assert ind["bands"] == 1 and band["bands"] == rows["bandmf-round-end"]["bands"] == 3
    assert band["sigma"] > ind["sigma"] and band["step_ratio"] > 1 and ind["prefix_round_end_ratio"] == 1
    # one band is the independent mechanism: the same σ and the same noise everywhere
    one = {r["mechanism"]: r for r in json.loads(_run("step_noise.py", "--examples", "134", "--min-separation", "1",
                                                      "--json"))}
    assert one["bandmf"]["sigma"] == pytest.approx(one["gaussian"]["sigma"])
    assert one["bandmf"]["prefix_round_end_ratio"] == pytest.approx(1.0)


def test_restoring_force():
    row = json.loads(_run("restoring_force.py", "--at", "2", "--rounds", "2", "--set", "num_clients=40",
                          "--set", "clients_per_round=10", "--json"))
    assert row["mechanism"] == "gaussian" and row["noise_std"] > 0 and row["delta0_norm"] > 0
    assert len(row["ratios"]) == 2 and all(r > 0 for r in row["ratios"]) and row["eta"] < 1


def test_mechanism_cost():
    out = json.loads(_run("mechanism_cost.py", "--dataset", "digits", "--rounds", "2", "--mechanisms",
                          "gaussian,gaussian-fixed,bandmf", "--json"))
    rows = {r["mechanism"]: r for r in out["rows"]}
    assert set(rows) == {"gaussian", "gaussian-fixed", "bandmf"}
    assert all(r["round_s"] > 0 and r["release_s"] > 0 and 0 < r["share"] < 1 for r in rows.values())
    assert rows["gaussian"]["state_bytes"] == rows["gaussian-fixed"]["state_bytes"] == 0
    assert rows["bandmf"]["state_bytes"] > 0 and rows["bandmf"]["state_bytes"] % (8 * rows["bandmf"]["num_params"]) == 0


def test_make_bench_runs_every_script():
    makefile = (REPO / "Makefile").read_text()
    target = makefile[makefile.index("\nbench:"):].split("\n\n")[0]
    assert {p.name for p in BENCH.glob("*.py")} == {line.split("experiments/bench/")[1].split()[0]
                                                    for line in target.splitlines() if "experiments/bench/" in line}


@pytest.mark.cluster
def test_cross_device():
    out = json.loads(_run("cross_device.py", "--dataset", "digits", "--timed-rounds", "1", "--set", "num_clients=6",
                          "--set", "clients_per_round=3", "--set", "data.test_subsample=100", "--json"))
    assert out["floor"]["floor_s"] > 0 and out["floor"]["clients"] == 3
    assert set(out["variants"]) == {"nodp", "record", "client"}
    for row in out["variants"].values():
        assert row["ray"]["round_s"] > 0 and row["serial"]["round_s"] > 0 and row["ray_summed"]["round_s"] > 0
        for fresh in (row["fresh"], row["fresh_waiting"]):
            assert 0 < fresh["start_s"] < fresh["first_round_s"] and fresh["round_s"] > 0
        assert row["ray_over_floor"] == row["ray"]["round_s"] / out["floor"]["floor_s"]


@pytest.mark.cluster
def test_cross_device_on_the_shakespeare_federation():
    out = json.loads(_run("cross_device.py", "--config", str(REPO / "experiments" / "paper" / "shakespeare.yaml"),
                          "--dataset", "shakespeare", "--variants", "nodp,client", "--timed-rounds", "1",
                          "--no-first-round", "--set", "num_clients=4", "--set", "clients_per_round=2",
                          "--set", "data.min_samples_per_client=1", "--set", "data.max_samples_per_user=10",
                          "--set", "data.test_subsample=20", "--json"))
    assert out["floor"]["clients"] == 2 and out["floor"]["samples"] <= 18 and "channels_last" not in out["floor"]
    assert set(out["variants"]) == {"nodp", "client"}
    assert all(row["ray"]["round_s"] > 0 for row in out["variants"].values())


@pytest.mark.cluster
def test_cross_device_startup_trace():
    out = json.loads(_run("cross_device.py", "--dataset", "digits", "--trace-startup", "--variants", "nodp", "--set",
                          "num_clients=4", "--set", "clients_per_round=2", "--set", "data.test_subsample=100", "--json"))
    ends = [at for _, at in out["stamps"]]
    assert ends == sorted(ends) and out["stamps"][-1][0] == "round 2 recorded"
    assert "warm" in {name for *_, name in out["tasks"]}


def test_first_run_times_both_arms():
    out = json.loads(_run("first_run.py", "--commands", "sweep", "--repeats", "1", "--json"))
    assert [(r["command"], r["head_start"]) for r in out["rows"]] == [("sweep", True), ("sweep", False)]
    assert all(0 < r["started_s"] <= r["setup_s"] <= r["round1_s"] <= r["exit_s"] for r in out["rows"])
