"""Method-specific facts of the baselines, read from real (serial) runs; the generic contract (runs,
ε ≤ target, determinism, declared releases) is tests/unit/algorithms/test_method_contract.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from raysim.runtime import execute
from raysim.results import read_table
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation

DP_METHODS = ("dp-acdn", "awdp-fl", "dp-fedavg-adaptive")
NON_PRIVATE = ("fedprox", "scaffold")
# Two equal iid clients share one σ calibration, which keeps these runs short.
SMALL = {"num_clients": 2, "data__partition": "iid"}


def _run(tmp_path, method, **kw):
    summary = execute(tiny_config(method=method, **SMALL, **kw), str(tmp_path))
    return summary.row, read_table(str(tmp_path), "rounds").sort_values("round"), read_table(str(tmp_path), "clients")


@pytest.mark.parametrize("method", DP_METHODS)
def test_dp_baseline_server_rules(tmp_path, method):
    row, rounds, clients = _run(tmp_path, method, privacy__noise_multiplier=1.0)
    assert row["status"] == "completed" and row["rounds_completed"] == 2 and row["clipping"] == "per_sample"
    if method == "dp-fedavg-adaptive":
        assert rounds["clip_norm"].iloc[0] == 1.0
        assert rounds["clip_norm"].iloc[1] == pytest.approx(rounds["next_clip_norm"].iloc[0])
        assert "unclipped_count" not in row["not_covered_by_epsilon"]   # noised by default (σ_b = 25), accounted
    if method == "awdp-fl":
        for cell in clients["layer_clip_norms"]:
            assert sum(c * c for c in json.loads(cell)) == pytest.approx(1.0, rel=1e-6)   # Σ C_k² = C² = 1
    if method == "dp-acdn":
        np.testing.assert_allclose(rounds["noise_multiplier_scale"], [1.0, 0.99])
        by_round = clients.groupby("round")["noise_multiplier"].first()
        assert by_round[2] == pytest.approx(0.99 * by_round[1])


@pytest.mark.parametrize("method", NON_PRIVATE)
def test_non_private_baseline_completes(tmp_path, method):
    row, rounds, _ = _run(tmp_path, method)
    assert row["status"] == "completed" and row["clipping"] == "none"
    assert math.isinf(row["epsilon"]) or math.isnan(row["epsilon"])
    assert np.isfinite(rounds["test_accuracy"]).all()
