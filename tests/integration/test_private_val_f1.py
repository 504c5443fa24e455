"""cra.private_val_f1: q_i is noised and its Gaussian release is composed into each client's ledger."""

from __future__ import annotations

import pytest

from raysim.runtime import execute
from raysim.privacy.accounting import StepEvent, compute_epsilon
from raysim.results import read_table
from tests.helpers import tiny_config


def test_private_val_f1_is_accounted(tmp_path):
    sigma_f1 = 4.0
    # ADPC off, so that q_i is the only release besides DP-SGD.
    cfg = tiny_config(method="feddimdp", rounds=1, privacy__noise_multiplier=1.0, feddimdp__adpc=False,
                      cra__private_val_f1=True, cra__val_f1_noise_multiplier=sigma_f1)
    execute(cfg, str(tmp_path / "private"))
    execute(tiny_config(method="feddimdp", rounds=1, privacy__noise_multiplier=1.0, feddimdp__adpc=False,
                        cra__private_val_f1=False, privacy__allow_uncovered=["cra.local_val_f1"]),
            str(tmp_path / "plain"))
    private = read_table(str(tmp_path / "private"), "clients").sort_values("client_id")
    plain = read_table(str(tmp_path / "plain"), "clients").sort_values("client_id")
    runs = read_table(str(tmp_path / "private"), "runs")
    assert "val_f1" not in runs["not_covered_by_epsilon"].item()
    plain_run = read_table(str(tmp_path / "plain"), "runs")
    assert "val_f1" in plain_run["not_covered_by_epsilon"].item()
    assert plain_run["epsilon_exceptions"].item() == "cra.local_val_f1" and runs["epsilon_exceptions"].item() == ""
    for (_, row), (_, ref) in zip(private.iterrows(), plain.iterrows()):
        q = min(1.0, cfg.batch_size / row["num_samples"])
        expected = compute_epsilon([StepEvent(q, 1.0, int(row["num_steps"])), StepEvent(1.0, sigma_f1, 1)],
                                   cfg.privacy.delta, cfg.privacy.accountant)
        assert row["epsilon"] == pytest.approx(expected, rel=1e-9)
        assert row["epsilon"] > ref["epsilon"]
        assert 0.0 <= row["val_f1"] <= 1.0
    assert not (private["val_f1"].to_numpy() == plain["val_f1"].to_numpy()).all()
