"""Same seed ⇒ bitwise-identical rounds/clients tables, serial vs Ray with 1, 2 and 10 actors."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from raysim.runtime import execute
from raysim.results import read_table
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation


TIMING = [c for c in ("round_seconds", "client_train_seconds", "communication_seconds", "aggregation_seconds",
                      "accounting_seconds", "eval_seconds", "client_seconds")]


def _tables(folder) -> tuple[pd.DataFrame, pd.DataFrame]:
    rounds = read_table(str(folder), "rounds").drop(columns=TIMING, errors="ignore")
    clients = read_table(str(folder), "clients").drop(columns=TIMING, errors="ignore")
    return (rounds.sort_values(["run_id", "round"]).reset_index(drop=True),
            clients.sort_values(["run_id", "round", "client_id"]).reset_index(drop=True))


@pytest.fixture(scope="module")
def serial_tables(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serial")
    execute(tiny_config(num_clients=10, method="fedsa", privacy__noise_multiplier=1.0), str(folder))
    return (*_tables(folder), read_table(str(folder), "runs")["rdp_epsilons"].tolist())


@pytest.mark.parametrize("num_actors", [1, 3])
def test_ray_matches_serial_bitwise(ray_session, serial_tables, tmp_path, num_actors):
    cfg = tiny_config(num_clients=10, method="fedsa", privacy__noise_multiplier=1.0,
                      runtime__executor="ray", runtime__num_actors=num_actors)
    execute(cfg, str(tmp_path))
    rounds, clients = _tables(tmp_path)
    assert len(rounds) == 2 and len(clients) == 20
    pd.testing.assert_frame_equal(rounds, serial_tables[0], check_exact=True)
    pd.testing.assert_frame_equal(clients, serial_tables[1], check_exact=True)
    # the Ray driver computes the run's RDP curve in the background as the rounds go: the same floats
    assert read_table(str(tmp_path), "runs")["rdp_epsilons"].tolist() == serial_tables[2] != [None]


def test_different_seed_differs(serial_tables, tmp_path):
    execute(tiny_config(num_clients=10, method="fedsa", privacy__noise_multiplier=1.0, seed=1), str(tmp_path))
    rounds, _ = _tables(tmp_path)
    assert not rounds["test_loss"].equals(serial_tables[0]["test_loss"])


@pytest.mark.parametrize("method", ["scaffold", "fedacg", "feddimdp"])
def test_overlapped_rounds_match_serial_with_checkpoints(ray_session, method):
    """On Ray, Simulation.run submits round t+1 before it evaluates round t. Methods whose server
    keeps state between rounds (SCAFFOLD's c and the c_i it sent, FedACG's momentum, FedDimDP's
    ADPC/CRA state) give the serial executor's bits, and every checkpoint, taken before the next
    round is submitted, holds the same state."""
    import pickle

    from raysim.data import load_dataset
    from raysim.runtime.ray_executor import RayExecutor
    from raysim.runtime.serial import SerialExecutor
    from raysim.simulation import Simulation

    train, test = load_dataset("digits", "train", None), load_dataset("digits", "test", None)
    runs = {}
    for name, executor in (("serial", SerialExecutor()), ("ray", RayExecutor())):
        cfg = tiny_config(method=method, rounds=3, privacy__noise_multiplier=1.0, runtime__checkpoint_every=1,
                          runtime__executor=name, runtime__num_actors=2)
        sim = Simulation(cfg, train, test, executor)
        try:
            runs[name] = [(rec.round_row, rec.client_rows, pickle.loads(rec.checkpoint)) for rec in sim.run()]
        finally:
            executor.shutdown()
    assert RayExecutor.overlaps and not SerialExecutor.overlaps
    for (rs, cs, ks), (rr, cr, kr) in zip(runs["serial"], runs["ray"]):
        assert {k: v for k, v in rs.items() if k not in TIMING} == {k: v for k, v in rr.items() if k not in TIMING}
        assert [{k: v for k, v in row.items() if k not in TIMING} for row in cs] == \
               [{k: v for k, v in row.items() if k not in TIMING} for row in cr]
        assert _same_state(ks["weights"], kr["weights"])
        assert ks["server"].keys() == kr["server"].keys()
        for key in ks["server"]:
            assert _same_state(ks["server"][key], kr["server"][key]), key
        if method == "scaffold":
            assert ks["server"]["sent"] == {} == kr["server"]["sent"]
    assert len(runs["ray"]) == 3


@pytest.mark.parametrize("unit", ["example", "client"])
def test_updates_folded_as_they_arrive_give_the_serial_bits(ray_session, monkeypatch, unit):
    """For a method whose server reads the updates only through their weighted sum, Ray folds each update
    into that float64 sum as the actors' calls return (several calls per actor, shards of unequal
    size): the global weights and every row are the serial executor's bits, which sums the list."""
    import pickle

    from raysim.data import load_dataset
    from raysim.runtime.ray_executor import RayExecutor
    from raysim.runtime.serial import SerialExecutor
    from raysim.simulation import Simulation

    calls: list[int] = []
    fold = RayExecutor._collect_folded
    monkeypatch.setattr(RayExecutor, "_collect_folded", lambda self, handle: calls.append(len(handle.refs)) or
                        fold(self, handle))
    extra = dict(privacy__unit="client", privacy__clip_norm=0.5) if unit == "client" else {}
    train, test = load_dataset("digits", "train", None), load_dataset("digits", "test", None)
    runs = {}
    for name, executor in (("serial", SerialExecutor()), ("ray", RayExecutor())):
        cfg = tiny_config(method="fedavg", num_clients=12, rounds=2, privacy__noise_multiplier=1.0,
                          runtime__checkpoint_every=1, runtime__executor=name, runtime__num_actors=2, **extra)
        sim = Simulation(cfg, train, test, executor)
        try:
            runs[name] = [(rec.round_row, rec.client_rows, pickle.loads(rec.checkpoint)["weights"]) for rec in sim.run()]
        finally:
            executor.shutdown()
    assert calls == [8, 8]   # two rounds, each actor's 5 to 7 clients in four calls (e.g. 2, 2, 1, 1)
    for (rs, cs, ws), (rr, cr, wr) in zip(runs["serial"], runs["ray"]):
        assert {k: v for k, v in rs.items() if k not in TIMING} == {k: v for k, v in rr.items() if k not in TIMING}
        assert [{k: v for k, v in row.items() if k not in TIMING} for row in cs] == \
               [{k: v for k, v in row.items() if k not in TIMING} for row in cr]
        assert torch.equal(ws, wr)


def test_an_idle_actor_takes_over_waiting_calls_and_the_bits_stay(ray_session, monkeypatch):
    """One actor gets one client, the other the rest in five calls: the first runs out of work and takes
    over the other's waiting calls (each cancelled where it was queued), and the weights and rows are
    still the serial executor's bits."""
    import pickle

    from raysim.data import load_dataset
    from raysim.runtime.ray_executor import RayExecutor
    from raysim.runtime.serial import SerialExecutor
    from raysim.simulation import Simulation

    monkeypatch.setattr(RayExecutor, "balance", lambda self, clients, n: [list(range(len(clients) - 1)),
                                                                          [len(clients) - 1]])
    moved: list[bool] = []
    steal = RayExecutor._steal
    monkeypatch.setattr(RayExecutor, "_steal", staticmethod(lambda handle, idle: moved.append(steal(handle, idle))
                                                            or moved[-1]))
    train, test = load_dataset("digits", "train", None), load_dataset("digits", "test", None)
    runs = {}
    for name, executor in (("serial", SerialExecutor()), ("ray", RayExecutor())):
        cfg = tiny_config(method="fedavg", num_clients=12, rounds=2, runtime__checkpoint_every=1,
                          runtime__executor=name, runtime__num_actors=2)
        sim = Simulation(cfg, train, test, executor)
        try:
            runs[name] = [(rec.round_row, rec.client_rows, pickle.loads(rec.checkpoint)["weights"]) for rec in sim.run()]
        finally:
            executor.shutdown()
    assert any(moved)
    for (rs, cs, ws), (rr, cr, wr) in zip(runs["serial"], runs["ray"]):
        assert {k: v for k, v in rs.items() if k not in TIMING} == {k: v for k, v in rr.items() if k not in TIMING}
        assert [{k: v for k, v in row.items() if k not in TIMING} for row in cs] == \
               [{k: v for k, v in row.items() if k not in TIMING} for row in cr]
        assert torch.equal(ws, wr)


def _same_state(a, b) -> bool:
    """Equal values, bit for bit, through dicts, lists, tensors and arrays (pickled bytes also differ
    with a tensor's storage history)."""
    import numpy as np
    import torch
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)
