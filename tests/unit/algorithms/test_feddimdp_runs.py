"""FedDimDP checked from the values a real (serial) run logs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raysim.algorithms.registry import get_method
from raysim.experiment import run_experiment
from raysim.results import read_table
from tests.helpers import tiny_config

COLUMNS = ["update_norm", "val_f1", "val_f1_ema", "update_norm_ema", "reliability", "nominal_weight", "deviation",
           "deviation_normalized", "robust_weight", "clip_norm", "frac_clipped", "epsilon", "update_norm_denoised"]


def _run(tmp_path_factory, method: str, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = tmp_path_factory.mktemp(method)
    run_experiment(tiny_config(method=method, rounds=2, privacy__epsilon=8, **kw), str(folder))
    clients = read_table(str(folder), "clients").sort_values(["round", "client_id"]).reset_index(drop=True)
    rounds = read_table(str(folder), "rounds").sort_values("round").reset_index(drop=True)
    return rounds, clients


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {m: _run(tmp_path_factory, m) for m in
            ("feddimdp", "feddimdp-no-adpc", "feddimdp-no-cra", "feddimdp-no-lldm")}


def _median(x: np.ndarray) -> float:
    x = np.sort(x)
    n = len(x)
    return float(x[n // 2]) if n % 2 else float((x[n // 2 - 1] + x[n // 2]) / 2)


def test_every_column_is_logged(runs):
    rounds, clients = runs["feddimdp"]
    assert list(rounds["round"]) == [1, 2]
    assert clients[COLUMNS].notna().all().all()
    assert rounds[["clip_norm", "epsilon"]].notna().all().all()


def test_next_clip_is_max_of_median_and_floor(runs):
    rounds, clients = runs["feddimdp"]
    c_min = 0.1
    for t in (1,):
        s_hat = clients.loc[clients["round"] == t, "update_norm_denoised"].to_numpy()
        expected = max(_median(s_hat), c_min)
        assert rounds.loc[rounds["round"] == t + 1, "clip_norm"].item() == pytest.approx(expected, rel=1e-12)
        assert (clients.loc[clients["round"] == t + 1, "clip_norm"] == rounds.loc[rounds["round"] == t + 1, "clip_norm"].item()).all()
    assert rounds.loc[0, "clip_norm"] == 1.0   # C^(0) = adpc.c0


def test_literal_rule_without_denoise(tmp_path_factory):
    rounds, clients = _run(tmp_path_factory, "feddimdp", adpc__denoise=False)
    s = clients.loc[clients["round"] == 1, "update_norm"].to_numpy()
    assert rounds.loc[1, "clip_norm"] == pytest.approx(max(_median(s), 0.1), rel=1e-12)


def test_robust_weights_lie_in_the_ambiguity_set(runs):
    _, clients = runs["feddimdp"]
    for _, g in clients.groupby("round"):
        p, alpha = g["robust_weight"].to_numpy(), g["nominal_weight"].to_numpy()
        assert p.sum() == pytest.approx(1.0, abs=1e-9)
        assert (p >= -1e-12).all() and (p <= 1.5 * alpha + 1e-9).all()
        assert np.allclose(g["aggregation_weight"], p)


def test_ablations_remove_exactly_their_component(runs):
    full = get_method("feddimdp")
    for name, lldm, adpc, cra in (("feddimdp-no-lldm", False, True, True), ("feddimdp-no-adpc", True, False, True),
                                  ("feddimdp-no-cra", True, True, False)):
        spec = get_method(name)
        assert spec.lldm is lldm and spec.server.use_adpc is adpc and spec.server.use_cra is cra
        assert spec.client is full.client and spec.private and spec.per_layer_clipping == full.per_layer_clipping
    full_rounds, full_clients = runs["feddimdp"]
    # w/o-ADPC: C stays at C^(0); round 1 is identical to FedDimDP (ADPC acts from round 2 on).
    r, c = runs["feddimdp-no-adpc"]
    assert (r["clip_norm"] == 1.0).all()
    pd.testing.assert_frame_equal(c[c["round"] == 1].drop(columns=["client_seconds", "run_id"]),
                                  full_clients[full_clients["round"] == 1].drop(columns=["client_seconds", "run_id"]))
    # w/o-CRA: FedAvg weights, no q_i uploaded; local training in round 1 is identical.
    r, c = runs["feddimdp-no-cra"]
    g = c[c["round"] == 1]
    assert np.allclose(g["aggregation_weight"], g["num_samples"] / g["num_samples"].sum())
    assert g["val_f1"].isna().all() and g["robust_weight"].isna().all()
    f1 = full_clients[full_clients["round"] == 1]
    assert np.array_equal(g["update_norm"].to_numpy(), f1["update_norm"].to_numpy())
    assert r.loc[1, "clip_norm"] == pytest.approx(full_rounds.loc[1, "clip_norm"], rel=1e-12)
    # w/o-LLDM: a different (plain) model, same partition and privacy plan.
    r, c = runs["feddimdp-no-lldm"]
    assert np.array_equal(c["num_samples"], full_clients["num_samples"])
    assert np.array_equal(c["noise_multiplier"], full_clients["noise_multiplier"])
    assert not np.array_equal(c["update_norm"], full_clients["update_norm"])
