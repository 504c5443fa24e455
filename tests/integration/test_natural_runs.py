"""The natural-federation presets end to end, at a tiny size: both privacy units, resume, report, tune,
and FEMNIST on LEAF-format files."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from raysim.cli import main
from raysim.config import config_from_dict, read_yaml
from raysim.results import read_table
from raysim.experiment import prepare
from raysim.runtime import execute
from raysim.tune import choose, parse_tune, search_runs
from tests.conftest import REPO

#: Simulations on the 3.2M-row Shakespeare arrays (about 30 s on 2 cores): in make test-cluster, not make test.
pytestmark = pytest.mark.cluster

SHAKESPEARE = str(REPO / "experiments" / "paper" / "shakespeare.yaml")
FEMNIST = str(REPO / "experiments" / "paper" / "femnist.yaml")
#: A federation small enough for a test: 4 roles of at most 12 windows, 2 a round, 2 rounds.
TINY = ["num_clients=4", "clients_per_round=2", "rounds=2", "eval_every=1", "data.max_samples_per_user=12",
        "data.test_subsample=40", "runtime.executor=serial"]


def _sets(*values: str) -> list[str]:
    return [a for v in values for a in ("--set", v)]


@pytest.mark.parametrize("unit", ["example", "client"])
def test_shakespeare_preset_runs_in_both_units_and_reports(unit, tmp_path, capsys):
    results = tmp_path / "r"
    extra = [] if unit == "client" else ["privacy.unit=example", "participation=uniform"]   # the preset's: client
    assert main(["run", SHAKESPEARE, "--results-dir", str(results), *_sets(*TINY, *extra)]) == 0
    runs = read_table(str(results), "runs")
    assert runs["status"].tolist() == ["completed"] and runs["privacy_unit"].item() == unit
    assert runs["epsilon"].item() == pytest.approx(8.0, abs=1e-3)
    parts = read_table(str(results), "partitions")
    users = parts.groupby("client_id")["user"].unique()
    assert len(users) == 4 and all(len(u) == 1 and u[0] for u in users)       # one named user per client
    rounds = read_table(str(results), "rounds")
    assert rounds["test_accuracy"].between(0, 1).all() and len(rounds) == 2
    capsys.readouterr()
    assert main(["report", str(results)]) == 0
    assert "shakespeare" in (results / "report" / "report.md").read_text()


def test_shakespeare_preset_is_audited_with_canary_clients(tmp_path, capsys):
    """``raysim audit`` on the preset (client unit): canary clients join the roles' cohorts."""
    assert main(["audit", SHAKESPEARE, "--results-dir", str(tmp_path / "r"), "--canaries", "100", "--json",
                 *_sets(*TINY)]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert found["unit"] == "client" and found["canaries"] == 100
    assert found["epsilon_accounted"] == pytest.approx(8.0, abs=1e-3) and not found["refutes"]


def test_shakespeare_run_resumes_bit_for_bit(tmp_path):
    values = read_yaml(SHAKESPEARE)
    values.update(num_clients=4, clients_per_round=2, rounds=3, eval_every=1)
    values["data"].update(max_samples_per_user=12, test_subsample=40)
    values["privacy"] = {"noise_multiplier": 1.0, "delta": 1e-5}     # DP-SGD without σ's calibration
    values["runtime"] = {"executor": "serial"}
    cfg = config_from_dict(values)
    execute(cfg, str(tmp_path / "whole"))

    class Stop(Exception):
        pass

    def stop_after_2(rec):
        if rec.server_round == 2:
            raise Stop
    with pytest.raises(Stop):
        execute(cfg, str(tmp_path / "cut"), on_round=stop_after_2)
    execute(cfg, str(tmp_path / "cut"))
    for table, keys in (("rounds", ["round"]), ("clients", ["round", "client_id"])):
        a, b = (read_table(str(tmp_path / f), table).sort_values(keys).reset_index(drop=True) for f in ("whole", "cut"))
        timing = [c for c in a.columns if c.endswith("seconds")]
        pd.testing.assert_frame_equal(a.drop(columns=timing), b.drop(columns=timing))


def test_shakespeare_tune_plans_and_chooses(tmp_path):
    """``raysim tune``'s search on the preset, its runs executed in this process (the CLI runs them on Ray)."""
    tune = parse_tune({
        "base": SHAKESPEARE,
        "set": {"num_clients": 4, "clients_per_round": 2, "rounds": 1, "data.max_samples_per_user": 12,
                "data.test_subsample": 40, "data.server_holdout": 20, "privacy.epsilon": None,
                "privacy.unit": "example",
                "runtime.executor": "serial"},
        "methods": ["fedavg"], "space": {"lr": [0.4, 0.8]}, "tuning_seeds": [100], "final_seeds": [0],
    }, name="tune-shakespeare", base_dir=tmp_path)
    runs = search_runs(tune)
    data = prepare(runs[0].cfg)
    rows = {r.run_id: execute(r.cfg, str(tmp_path / "r"), data=data).row for r in runs}
    assert len(rows) == 2 and all(np.isfinite(row["final_val_accuracy"]) for row in rows.values())
    assert choose(tune, runs, rows) is not None


def test_femnist_preset_on_leaf_files(tmp_path):
    rng = np.random.default_rng(0)
    users = {f"f{k:04d}_{k:02d}": 24 for k in range(5)}
    data = {"users": list(users), "num_samples": list(users.values()), "user_data": {
        u: {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
        for u, n in users.items()}}
    folder = tmp_path / "data" / "femnist" / "all_data"
    folder.mkdir(parents=True)
    (folder / "all_data_0.json").write_text(json.dumps(data))
    results = tmp_path / "r"
    assert main(["run", FEMNIST, "--results-dir", str(results), "--data-root", str(tmp_path / "data"),
                 "--set", "data.cache_dir=" + str(tmp_path / "cache"),
                 *_sets("num_clients=4", "clients_per_round=2", "rounds=1", "data.min_samples_per_client=10",
                        "runtime.executor=serial")]) == 0
    runs = read_table(str(results), "runs")
    assert runs["status"].item() == "completed" and runs["dataset"].item() == "femnist"
    assert set(read_table(str(results), "partitions")["user"]) <= set(users)
