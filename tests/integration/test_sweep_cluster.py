"""The smoke sweep as a Ray job on a 2-node cluster started on this machine.

Everything Ray runs in subprocesses with their own temp dir and ports, so the session's shared
``ray_session`` (and any other Ray on the machine) is untouched. ``ray stop`` would stop every
Ray on the machine, so the test stops its own cluster by the processes under its temp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from raysim.results import read_table
from raysim.sweep import load_sweep

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SMOKE = "experiments/sweeps/smoke.yaml"


def ray_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def _proc_table() -> dict[int, tuple[int, str]]:
    table = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            table[int(d.name)] = (ppid, cmd)
    return table


def stop_processes_under(marker: str, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL, the processes whose command line names ``marker`` (a temp dir only
    this test uses) and their descendants; never this process or its ancestors."""
    table = _proc_table()
    stop_process_trees({p for p, (_, cmd) in table.items() if marker in cmd}, timeout, table)


def stop_process_trees(roots: set[int], timeout: float = 15.0, table: dict | None = None,
                       signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL)) -> None:
    """Signal ``roots`` and all their descendants (found before any signal is sent, so children
    cannot escape by being re-parented), escalating through ``signals``."""
    table = table or _proc_table()
    mine, pid = set(), os.getpid()
    while pid > 1 and pid in table:
        mine.add(pid)
        pid = table[pid][0]
    found = set(roots) - mine
    todo = list(found)
    while todo:
        parent = todo.pop()
        for child, (ppid, _) in table.items():
            if ppid == parent and child not in found and child not in mine:
                found.add(child)
                todo.append(child)
    for sig in signals:
        for p in found:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(_alive(p) for p in found):
                return
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(args[:4])} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def start_two_nodes(temp_dir: str, env: dict[str, str], dashboard: bool = False) -> tuple[int, int]:
    """A head and a worker node (resource ``worker_node``) of 1 CPU each, on free ports, under
    ``temp_dir``; returns (GCS port, dashboard port)."""
    gcs, dash, client, *agent = free_ports(11)
    ray = str(BIN / "ray")
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    head_dashboard = (["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}"]
                      if dashboard else ["--include-dashboard=false"])
    _run([ray, "start", "--head", f"--port={gcs}", *head_dashboard, f"--ray-client-server-port={client}",
          f"--dashboard-agent-listen-port={agent[0]}", f"--dashboard-agent-grpc-port={agent[1]}",
          f"--runtime-env-agent-port={agent[2]}", f"--metrics-export-port={agent[3]}", *common], env, 180)
    _run([ray, "start", f"--address=127.0.0.1:{gcs}", '--resources={"worker_node": 1}',
          f"--dashboard-agent-listen-port={agent[4]}", f"--dashboard-agent-grpc-port={agent[5]}",
          f"--runtime-env-agent-port={agent[6]}", f"--metrics-export-port={agent[7]}", *common], env, 180)
    return gcs, dash


def test_smoke_sweep_as_ray_job_on_two_nodes(tmp_path):
    temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")   # short: Ray's socket paths must fit 107 chars
    env = ray_env()
    ray = str(BIN / "ray")
    results = tmp_path / "results"
    try:
        _, dash = start_two_nodes(temp_dir, env, dashboard=True)
        address = f"http://127.0.0.1:{dash}"
        job = _run([ray, "job", "submit", "--address", address, "--working-dir", ".", "--",
                    sys.executable, "-m", "raysim.cli", "sweep", SMOKE, "--results-dir", str(results)], env, 600)
        nodes = json.loads(_run([ray, "list", "nodes", "--address", address, "--format", "json"], env, 60).stdout)
        tune_file = tmp_path / "tune.yaml"   # `raysim tune` is two sweeps on the same runner: it runs as a job too
        tune_file.write_text(json.dumps({
            "base": {"rounds": 2, "num_clients": 4, "batch_size": 32, "privacy": {"epsilon": 8.0},
                     "data": {"name": "digits", "server_holdout": 100, "min_samples_per_client": 20}},
            "methods": ["fedsa"], "space": {"lr": [0.05, 0.2]}, "tuning_seeds": [5], "final_seeds": [0]}))
        tune_cmd = [ray, "job", "submit", "--address", address, "--working-dir", ".", "--", sys.executable, "-m",
                    "raysim.cli", "tune", str(tune_file), "--results-dir", str(tmp_path / "tuned")]
        tuned = [_run(tune_cmd, env, 600).stdout for _ in range(2)]
    finally:
        stop_processes_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert "4 runs, 0 already completed, 4 to run" in job.stdout

    head = {n["node_id"] for n in nodes if n["is_head_node"]}
    workers = {n["node_id"] for n in nodes if not n["is_head_node"]}
    assert len(head) == 1 and len(workers) == 1

    sweep = load_sweep(REPO / SMOKE)
    runs = read_table(str(results), "runs")
    assert sorted(runs["run_id"]) == sorted(sweep.run_ids)
    assert (runs["status"] == "completed").all() and (runs["sweep_id"] == sweep.sweep_id).all()
    assert set(runs["writer_node"]) == head                      # every row written on the head…
    client_nodes = {n for cell in runs["client_nodes"] for n in json.loads(cell)}
    assert client_nodes == head | workers                        # …while clients ran on both nodes
    for name, keys, count in (("rounds", ["run_id", "round"], 4 * 2), ("clients", ["run_id", "round", "client_id"], 4 * 2 * 4)):
        table = read_table(str(results), name)
        assert len(table) == count and not table.duplicated(keys).any()

    assert "search: 2 runs, 0 done, 2 to run" in tuned[0] and "Tuned:" in tuned[0]
    assert "search: 2 runs, 2 done, 0 to run" in tuned[1] and "0 to run" in tuned[1].split("final:")[1]
    tuning = read_table(str(tmp_path / "tuned"), "tuning")
    assert sorted(tuning["stage"]) == ["final", "fixed", "search", "search"]
    assert (tuning["status"] == "completed").all()
