"""privacy.unit=client end to end: every method that supports the unit runs, is accounted as one
population and clips each update; the others are refused in one line (the canary-client audit:
test_client_audit.py)."""

from __future__ import annotations


import numpy as np
import pytest

from raysim.algorithms.registry import all_methods, resolve_preset
from raysim.cli import main
from raysim.config import config_from_dict
from raysim.participation import participation_schedule
from raysim.results import read_table
from raysim.runtime import execute
from tests.conftest import REPO

pytestmark = pytest.mark.simulation

CLIENT_METHODS = [s.name for s in all_methods() if "client" in s.units() and s.preset_of is None]
REFUSED = [s.name for s in all_methods() if "client" not in s.units()]
CLIP = 0.05


def client_cfg(method: str, **extra):
    values = {"method": method, "rounds": 2, "seed": 0, "num_clients": 60, "clients_per_round": 20,
              "participation": "poisson", "batch_size": 10, "lr": 0.1,
              "privacy": {"unit": "client", "epsilon": 8.0, "clip_norm": CLIP},
              "data": {"name": "digits", "partition": "iid", "min_samples_per_client": 10, "test_subsample": 200},
              "runtime": {"executor": "serial"}}
    if method == "feddimdp":
        values["feddimdp"] = {"adpc": False, "cra": False}
    for key, value in extra.items():
        node = values
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config_from_dict(values)


@pytest.mark.parametrize("method", CLIENT_METHODS)
def test_method_runs_under_the_client_unit(tmp_path, method):
    summary = execute(client_cfg(method), str(tmp_path))
    row = summary.row
    assert row["status"] == "completed" and row["clipping"] == "update"
    assert row["privacy_unit"] == "client" and row["adjacency"] == "add/remove one client"
    assert row["epsilon_scope"] == "population"
    assert row["epsilon_scope_detail"] == "the simulated population of 60 clients"
    assert 7.99 < row["epsilon"] <= 8.0 and row["noise_multiplier"] > 0
    clients = read_table(str(tmp_path), "clients")
    rounds = read_table(str(tmp_path), "rounds")
    assert (clients["noise_multiplier"] == 0).all()          # no local noise: the server noises the sum
    assert (clients["update_norm"] <= clients["clip_norm"] * (1 + 1e-5)).all()   # every upload clipped to C^(t)
    assert np.allclose(clients["aggregation_weight"], 1 / 20)    # uniform, the expected cohort size
    assert (clients["epsilon"] == rounds.set_index("round").loc[clients["round"], "epsilon"].to_numpy()).all()
    if method == "dp-fedavg-adaptive":
        assert rounds["clipped_fraction_noisy"].notna().all() and rounds["next_clip_norm"].notna().all()


def test_same_seed_same_bits_and_the_empty_cohort_still_releases_noise(tmp_path):
    cfg = client_cfg("fedavg", num_clients=12, clients_per_round=1, rounds=6, privacy__epsilon=None,
                     privacy__noise_multiplier=1.0, data__min_samples_per_client=20)
    empty = [t for t, cohort in enumerate(participation_schedule(cfg), start=1) if len(cohort) == 0]
    assert empty, "the test needs a round without participants"
    a = execute(cfg, str(tmp_path / "a"), )
    b = execute(cfg, str(tmp_path / "b"))
    ra, rb = (read_table(str(tmp_path / x), "rounds").sort_values("round") for x in "ab")
    assert np.array_equal(ra["test_loss"].to_numpy(), rb["test_loss"].to_numpy(), equal_nan=True)
    assert a.row["epsilon"] == b.row["epsilon"]
    # the ledger counts every round, also a round whose cohort came out empty
    eps = ra.set_index("round")["epsilon"]
    for t in empty:
        if t > 1:
            assert eps[t] > eps[t - 1]


def test_dp_fedsam_runs_its_published_form_under_the_client_unit():
    cfg = resolve_preset(client_cfg("dp-fedsam"))
    assert cfg.sam.mode == "both"
    example = resolve_preset(config_from_dict({"method": "dp-fedsam", "privacy": {"epsilon": 8.0}}))
    assert example.sam.mode == "previous"


def _cli_run(capsys, tmp_path, *sets: str) -> tuple[int, str]:
    argv = ["run", str(REPO / "experiments" / "quickstart.yaml"), "--results-dir", str(tmp_path),
            "--set", "runtime.executor=serial", "--set", "privacy.unit=client"]
    for item in sets:
        argv += ["--set", item]
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("method", REFUSED + ["feddimdp"])
def test_unsupported_method_fails_in_one_line_with_exit_2(capsys, tmp_path, method):
    code, err = _cli_run(capsys, tmp_path, f"method={method}")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "privacy.unit=client" in lines[0] and "Traceback" not in err


def test_tree_refused_for_a_server_rule_that_needs_each_round(capsys, tmp_path):
    code, err = _cli_run(capsys, tmp_path, "method=fedacg", "privacy.mechanism=tree", "participation=shuffle",
                         "clients_per_round=2", "privacy.accountant=rdp")
    assert code == 2 and "prefix sums" in err and len(err.strip().splitlines()) == 1
