"""Partial participation (``clients_per_round``) for every registered method.

Parametrised over the registry: each method runs 2 rounds of the digits quickstart (IID) with 2 of 6
clients per round (serial), and a second simulation restored from the checkpoint after round 1 must repeat
round 2 bit for bit. Also: a Poisson round without participants and the tables, and full participation
through the cohort code path. The server maths of the methods whose state is per client are in
tests/unit/algorithms/test_partial_participation.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raysim.algorithms.registry import all_methods
from raysim.config import apply_overrides, config_from_dict, read_yaml
from raysim.experiment import prepare
from raysim.participation import participation_schedule
from raysim.results import read_table
from raysim.runtime import execute
from raysim.runtime.serial import SerialExecutor
from raysim.simulation import Simulation
from tests.conftest import REPO

pytestmark = pytest.mark.simulation

METHODS = [spec.name for spec in all_methods()]
TIMING = ("round_seconds", "client_train_seconds", "communication_seconds", "aggregation_seconds",
          "accounting_seconds", "eval_seconds", "client_seconds")


def _quickstart(method: str, **changes):
    values = apply_overrides(read_yaml(REPO / "experiments" / "quickstart.yaml"), [
        ("method", method), ("rounds", 2), ("num_clients", 6), ("clients_per_round", 2), ("seed", 0),
        ("runtime.executor", "serial"), ("data.test_subsample", 100), ("data.min_samples_per_client", 20),
        ("data.partition", "iid"),    # clients of equal size and rounds share one calibration
        *changes.items()])
    return config_from_dict(values)


@pytest.fixture(scope="module")
def data():
    return prepare(_quickstart("fedsa"))


def _strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING}


def _same(a, b) -> bool:
    """Equal, NaN included (a round's logs may hold NaN, e.g. an empty round's mean loss)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _assert_rows_equal(x: list[dict], y: list[dict]) -> None:
    assert len(x) == len(y)
    for a, b in zip(x, y):
        a, b = _strip(a), _strip(b)
        assert a.keys() == b.keys()
        assert all(_same(a[k], b[k]) for k in a), {k: (a[k], b[k]) for k in a if not _same(a[k], b[k])}


def _assert_state_equal(a, b) -> None:
    """Server states equal value by value (NaN equal to NaN; pickled bytes of tensors are not canonical)."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_state_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_state_equal(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert _same(a, b)


@pytest.mark.parametrize("method", METHODS)
def test_method_runs_with_absent_clients_and_resumes_bit_for_bit(data, method):
    cfg = _quickstart(method)
    train, test = data
    sim = Simulation(cfg, train, test, SerialExecutor())
    records = list(sim.run())
    schedule = participation_schedule(cfg)
    assert [len(c) for c in schedule] == [2, 2]
    trained = set()
    for rec, cohort in zip(records, schedule):
        assert rec.round_row["participants"] == 2
        assert [row["client_id"] for row in rec.client_rows] == list(cohort)     # participants only
        trained |= set(cohort.tolist())
        assert np.isfinite(rec.round_row["test_loss"])
    assert set(sim.client_states) == trained                                      # absent clients: no state
    if sim.clipping != "none":
        assert set(sim.ledgers) == trained                                        # absent clients: no ledger
        eps = [sim.ledger(c).epsilon() for c in range(cfg.num_clients)]
        assert max(eps) <= 8.0 + 1e-9 and records[-1].round_row["epsilon"] == max(eps)
        for cid in range(cfg.num_clients):
            ledger = sim.ledger(cid)
            own = sum(cid in c for c in schedule)
            dp_sgd = sum(e.count for e in ledger.events if e.sample_rate < 1.0)
            assert dp_sgd == own * int(sim.steps[cid])                            # events for its rounds only
            assert (own == 0) == (eps[cid] == 0.0) and (own == 0) == math.isnan(sim.sigmas[cid])
    # A second simulation restored after round 1 repeats round 2 exactly.
    again = Simulation(cfg, train, test, SerialExecutor())
    again.restore(records[0].checkpoint)
    redo = list(again.run())
    assert [r.server_round for r in redo] == [2]
    for a, b in zip(records[1:], redo):
        _assert_rows_equal([a.round_row], [b.round_row])
        _assert_rows_equal(a.client_rows, b.client_rows)
    assert torch.equal(sim.weights, again.weights)
    _assert_state_equal(sim.server.state_dict(), again.server.state_dict())


def test_full_participation_path_is_unchanged(data):
    """k = N draws everyone every round: the same simulation as clients_per_round = None, bit for bit."""
    train, test = data
    sigma = {"privacy.epsilon": None, "privacy.noise_multiplier": 1.0, "rounds": 1}
    none = list(Simulation(_quickstart("feddimdp", clients_per_round=None, **sigma), train, test, SerialExecutor()).run())
    every = list(Simulation(_quickstart("feddimdp", clients_per_round=6, **sigma), train, test, SerialExecutor()).run())
    for a, b in zip(none, every):
        assert a.round_row["participants"] == b.round_row["participants"] == 6
        _assert_rows_equal([a.round_row], [b.round_row])
        _assert_rows_equal(a.client_rows, b.client_rows)


def test_poisson_round_without_participants_and_the_tables(tmp_path):
    # seed 14: the Poisson schedule (6 clients, rate 1/6) has an empty round 2 between non-empty rounds
    cfg = _quickstart("feddimdp", participation="poisson", clients_per_round=1, seed=14, rounds=3)
    schedule = participation_schedule(cfg)
    sizes = [len(c) for c in schedule]
    assert sizes[1] == 0 and sizes[0] > 0 and sizes[2] > 0, sizes
    execute(cfg, str(tmp_path))
    rounds = read_table(str(tmp_path), "rounds").sort_values("round")
    clients = read_table(str(tmp_path), "clients").sort_values(["round", "client_id"])
    runs = read_table(str(tmp_path), "runs")
    assert list(rounds["participants"]) == sizes
    for t, cohort in enumerate(schedule, start=1):
        assert list(clients.loc[clients["round"] == t, "client_id"]) == list(cohort)
    empty = rounds.iloc[1]
    # the global model is unchanged in the empty round: the same test metrics as round 1; ε and C stay
    assert empty["test_loss"] == rounds.iloc[0]["test_loss"] and math.isnan(empty["mean_train_loss"])
    assert empty["epsilon"] == rounds.iloc[0]["epsilon"] and empty["clip_norm"] == rounds.iloc[0]["next_clip_norm"]
    assert runs["status"].item() == "completed" and runs["epsilon"].item() <= 8.0 + 1e-9
    assert runs["noise_multiplier"].item() == clients["noise_multiplier"].max()
