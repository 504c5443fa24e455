"""Partial participation: the server maths of the methods whose state is per client (SCAFFOLD's
controls, CRA's EMAs) on hand-computed toys. Whole runs with cohorts are in
tests/integration/test_partial_participation.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.algorithms.base import MethodContext
from raysim.algorithms.cra_math import ema
from raysim.algorithms.feddimdp import FedDimDPServer
from raysim.algorithms.scaffold import ScaffoldServer
from raysim.config import config_from_dict
from raysim.messages import ClientResult


# --------------------------------------------------------------------------- server maths on toys

def _ctx(cfg, num_clients):
    return MethodContext(cfg, "per_sample", 2, ((0, 2),), np.full(num_clients, 100), np.full(num_clients, 4),
                         np.zeros(num_clients))


def _result(cid, delta, *, num_samples=100, state=None, uploads=None):
    return ClientResult(cid, 1, num_samples, 2, torch.tensor(delta, dtype=torch.float32), 0.0, 0.0,
                        uploads=dict(uploads or {}), client_state=state)


def test_scaffold_control_uses_the_population_in_its_denominator():
    cfg = config_from_dict({"method": "scaffold", "num_clients": 4, "clients_per_round": 2})
    server = ScaffoldServer(_ctx(cfg, 4))
    tasks = server.tasks(1, {}, [1, 3])
    assert [t.client_id for t in tasks] == [1, 3]
    results = [_result(1, [2.0, 0.0], state={"control": torch.tensor([4.0, 0.0])}),
               _result(3, [0.0, -2.0], state={"control": torch.tensor([0.0, 8.0])})]
    agg = server.aggregate(1, torch.zeros(2), results)
    # x ← x + mean over the cohort S of Δy; c ← c + (1/N) Σ_{i∈S} Δc_i with N = 4, not |S| = 2
    torch.testing.assert_close(agg.global_weights, torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(server.control, torch.tensor([1.0, 2.0]))
    # c stays the mean of all four c_i (absent clients 0 and 2 still hold c_i = 0)
    torch.testing.assert_close(server.control, torch.stack([torch.zeros(2), torch.tensor([4.0, 0.0]), torch.zeros(2),
                                                            torch.tensor([0.0, 8.0])]).mean(0))


def test_cra_emas_are_kept_for_absent_clients():
    cfg = config_from_dict({"method": "feddimdp", "num_clients": 3, "clients_per_round": 2,
                            "feddimdp": {"adpc": False}, "cra": {"beta": 0.5}})
    server = FedDimDPServer(_ctx(cfg, 3))

    def res(cid, q):
        return _result(cid, [1.0, 0.0], uploads={"val_f1": q})

    server.aggregate(1, torch.zeros(2), [res(0, 0.4), res(1, 0.8)])
    np.testing.assert_array_equal(server.val_f1_ema, [0.4, 0.8, np.nan])
    agg = server.aggregate(2, torch.zeros(2), [res(1, 0.2), res(2, 0.6)])
    # client 0 absent: kept; client 1: 0.5·0.8 + 0.5·0.2; client 2 first report: its value
    np.testing.assert_allclose(server.val_f1_ema, [0.4, 0.5, 0.6], rtol=0, atol=1e-15)
    # weights over the two participants only; equal norms, so nominal α ∝ n·q̃: 0.5 : 0.6
    np.testing.assert_allclose([r["nominal_weight"] for r in agg.client_logs], [0.5 / 1.1, 0.6 / 1.1], rtol=1e-12)
    assert sum(r["aggregation_weight"] for r in agg.client_logs) == pytest.approx(1.0, abs=1e-12)


def test_ema_initialises_nan_entries_at_the_value():
    np.testing.assert_array_equal(ema(np.array([1.0, np.nan]), np.array([3.0, 5.0]), 0.5), [2.0, 5.0])
