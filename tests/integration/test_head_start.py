"""A `raysim run` that starts its own Ray trains its first clients in the launching process, then
hands the rest to the actors: the tables are the serial executor's, bit for bit. A `raysim sweep`
that starts its own Ray does the same with its first run, whose actors come from the sweep's pool."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from raysim.cli import main
from raysim.results import read_table
from raysim.runtime.head_start import HeadStartExecutor
from raysim.runtime.serial import SerialExecutor
from raysim.simulation import Simulation
from tests.conftest import REPO
from tests.helpers import tiny_config
from tests.integration.test_determinism import TIMING, _tables

pytestmark = pytest.mark.simulation

QUICKSTART = str(REPO / "experiments" / "quickstart.yaml")
SMOKE = str(REPO / "experiments" / "sweeps" / "smoke.yaml")
ARGS = ["--set", "method=fedsa", "--set", "rounds=4"]

#: ``raysim`` with the hand-over made deterministic: the actors are waited for once ``argv[1]``
#: clients trained here, and not looked at before.
_HANDS_OVER_AFTER = textwrap.dedent("""
    import json, sys
    import raysim.runtime.head_start as hs
    here, after = [], int(sys.argv[1])
    train = hs.ClientRunner.train
    def counted(self, payload, task, client):
        here.append([task.server_round, task.client_id])
        return train(self, payload, task, client)
    hs.ClientRunner.train = counted
    on_ray = hs.HeadStartExecutor._on_ray
    def after_n(self):
        if len(here) < after:
            return False
        if not self.on_ray:
            self._started.wait()
            self.remote.ready()
        return on_ray(self)
    hs.HeadStartExecutor._on_ray = after_n
    from raysim.cli import main
    code = main(sys.argv[2:])
    print(json.dumps(here))
    sys.exit(code)
""")


@pytest.mark.cluster   # a Python subprocess that starts its own Ray
def test_head_start_hands_over_mid_round_with_serial_bits(tmp_path):
    # 15 clients here: round 1's ten and the first five of round 2
    done = subprocess.run([sys.executable, "-c", _HANDS_OVER_AFTER, "15", "run", QUICKSTART, *ARGS,
                           "--results-dir", str(tmp_path / "hs")], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    here = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r for r, _ in here] == [1] * 10 + [2] * 5      # the rest of round 2, and rounds 3-4, on the actors
    assert main(["run", QUICKSTART, *ARGS, "--set", "runtime.executor=serial", "--results-dir",
                 str(tmp_path / "serial")]) == 0
    rounds, clients = _tables(tmp_path / "hs")
    serial_rounds, serial_clients = _tables(tmp_path / "serial")
    assert len(rounds) == 4 and len(clients) == 40
    pd.testing.assert_frame_equal(rounds, serial_rounds, check_exact=True)
    pd.testing.assert_frame_equal(clients, serial_clients, check_exact=True)
    runs = read_table(str(tmp_path / "hs"), "runs")
    assert runs["status"].item() == "completed" and runs["epsilon"].item() <= 8.0
    assert len(json.loads(runs["client_nodes"].item())) >= 1 and runs["writer_node"].item()
    assert runs["head_start_clients"].item() == 15


@pytest.mark.cluster   # a Python subprocess that starts its own Ray
def test_sweep_first_run_hands_over_to_pooled_actors_with_the_same_bits(tmp_path):
    """The sweep's first run (its first grid point) trains 6 clients in the sweep's process (round 1's
    four, two of round 2), then on actors from the pool; every run's tables equal those of the same
    sweep without the head start."""
    sweep_args = [SMOKE, "--set", "rounds=4", "--max-concurrent", "1"]
    done = subprocess.run([sys.executable, "-c", _HANDS_OVER_AFTER, "6", "sweep", *sweep_args,
                           "--results-dir", str(tmp_path / "hs")], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    here = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r for r, _ in here] == [1, 1, 1, 1, 2, 2]    # only the first run trained in this process
    assert main(["sweep", *sweep_args, "--set", "runtime.head_start=false", "--results-dir", str(tmp_path / "actors")]) == 0
    rounds, clients = _tables(tmp_path / "hs")
    actor_rounds, actor_clients = _tables(tmp_path / "actors")
    assert len(rounds) == 16 and len(clients) == 64
    pd.testing.assert_frame_equal(rounds, actor_rounds, check_exact=True)
    pd.testing.assert_frame_equal(clients, actor_clients, check_exact=True)
    runs = read_table(str(tmp_path / "hs"), "runs").sort_values("start_time")
    assert list(runs["status"]) == ["completed"] * 4
    assert list(runs["head_start_clients"].fillna(0)) == [6, 0, 0, 0]
    first = runs.iloc[0]
    assert first["method"] == "fedavg" and first["alpha"] == 0.3 and len(json.loads(first["client_nodes"])) == 2
    assert list(runs["warm_actors"].iloc[1:]) == [True] * 3   # the first run's actors went back to the pool


class _StandIn(SerialExecutor):
    """Ray's actors as the head start sees them: the same client code, warm once ``after`` clients
    trained in the launching process."""

    def __init__(self, here: list, after: int) -> None:
        super().__init__()
        self.here, self.after, self.trained = here, after, []

    def poll(self) -> bool:
        return len(self.here) >= self.after

    def run_placement(self) -> dict[str, str]:
        return {"client_nodes": '["stand-in"]', "writer_node": "stand-in"}

    def collect(self, handle):
        self.trained += [(t.server_round, t.client_id) for t in handle[1]]
        return super().collect(handle)


def _run(cfg, executor):
    from raysim.experiment import prepare
    sim = Simulation(cfg, *prepare(cfg), executor)
    records = list(sim.run())
    executor.shutdown()
    return [r.round_row for r in records], [r.client_rows for r in records]


def _drop_timing(rows):
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


@pytest.mark.parametrize("after", [0, 6, 100])
def test_round_split_between_here_and_the_actors(monkeypatch, after):
    """Clients train here until the stand-in for the actors is warm; a round begun here ends there."""
    cfg = tiny_config(method="fedsa", privacy__noise_multiplier=1.0, rounds=3)
    here: list = []

    def start_ray(self):
        self.remote = _StandIn(here, after)
        self.remote.start(self.plan, self.train)
        self._started.set()

    def start(self, *args):
        start_here(self, *args)
        self._started.wait()   # the stand-in is up before the first client: no race with the first poll
        train = self.runner.train
        self.runner.train = lambda payload, task, client: (here.append((task.server_round, task.client_id)),
                                                            train(payload, task, client))[1]

    start_here = HeadStartExecutor.start
    monkeypatch.setattr(HeadStartExecutor, "_start_ray", start_ray)
    monkeypatch.setattr(HeadStartExecutor, "start", start)
    executor = HeadStartExecutor()
    rounds, clients = _run(cfg, executor)
    serial_rounds, serial_clients = _run(cfg, SerialExecutor())
    assert _drop_timing(rounds) == _drop_timing(serial_rounds)
    assert [_drop_timing(c) for c in clients] == [_drop_timing(c) for c in serial_clients]
    everyone = [(t, c) for t in (1, 2, 3) for c in range(4)]
    assert here == everyone[:min(after, 12)]
    assert executor.placement == {"warm_actors": False, "head_start_clients": min(after, 12),
                                  **({} if after >= 12 else {"client_nodes": '["stand-in"]', "writer_node": "stand-in"})}


def test_ray_starts_once_the_run_is_planned(monkeypatch):
    """Ray's processes start after the run's planning (σ calibration), not beside it on the same cores."""
    events: list[str] = []

    class Side:
        parks = False

        def start(self, plan, train, planned, ended):
            planned.wait()
            events.append("ray starts")
            return None   # no actors: every client trains here

        def end(self, remote, ok):
            events.append("ray ends")

    plan = Simulation._plan

    def planning(self, *args):
        events.append("planning")
        plan(self, *args)
        events.append("planned")

    monkeypatch.setattr(Simulation, "_plan", planning)
    cfg = tiny_config(method="fedsa", privacy__epsilon=8.0, rounds=1)
    _run(cfg, HeadStartExecutor(Side()))
    assert events == ["planning", "planned", "ray starts", "ray ends"]


def test_a_failed_run_ends_its_ray_once(monkeypatch, tmp_path):
    """A run that fails mid-stream shuts its Ray down once: not again when the stream is collected,
    which would shut down a Ray this process joined later."""
    import gc
    from raysim.experiment import run_experiment
    from raysim.runtime.head_start import HeadStartHost
    ends: list[bool] = []

    class Side:
        parks = False

        def start(self, plan, train, planned, ended):
            return None

        def end(self, remote, ok):
            ends.append(ok)

    def fail(rec):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(tiny_config(method="fedsa", privacy__noise_multiplier=1.0, rounds=3), str(tmp_path), HeadStartHost(Side()), on_round=fail)
    gc.collect()
    assert ends == [False]
