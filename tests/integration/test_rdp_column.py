"""runs.rdp_epsilons: the largest RDP curve over a run's clients, recomputed from the clients table."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.privacy.accounting import StepEvent
from raysim.privacy.tuning import ORDERS, rdp_curve, rdp_from_json
from raysim.results import read_table
from raysim.runtime import execute
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation


def test_rdp_epsilons_is_the_max_over_clients_of_their_curves(tmp_path):
    cfg = tiny_config(method="fedsa", privacy__epsilon=4.0)
    execute(cfg, str(tmp_path))
    runs = read_table(str(tmp_path), "runs")
    clients = read_table(str(tmp_path), "clients")
    curves = []
    for _, rows in clients.groupby("client_id"):
        q = min(1.0, cfg.batch_size / int(rows["num_samples"].iloc[0]))
        curves.append(rdp_curve([StepEvent(q, float(r["noise_multiplier"]), int(r["num_steps"]))
                                 for _, r in rows.iterrows()]))
    stored = rdp_from_json(runs["rdp_epsilons"].item())
    assert stored.shape == (len(ORDERS),)
    np.testing.assert_allclose(stored, np.max(curves, axis=0), rtol=1e-12)


def test_rdp_epsilons_is_null_without_dp(tmp_path):
    execute(tiny_config(), str(tmp_path))
    assert read_table(str(tmp_path), "runs")["rdp_epsilons"].isna().all()
