"""A run is planned once: its presets are applied in one place, and the plan travels to every part of the run."""

from __future__ import annotations

import pickle

import pandas as pd
import yaml

from raysim.algorithms import registry
from raysim.algorithms.registry import get_method
from raysim.cli import main
from raysim.run_plan import RunPlan, plan_run
from tests.helpers import tiny_config

ABLATION = {"method": "feddimdp-no-adpc", "rounds": 2, "seed": 0, "num_clients": 4, "batch_size": 32, "lr": 0.05,
            "privacy": {"epsilon": 8.0, "clipping": "batch"},
            "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5, "min_samples_per_client": 20},
            "runtime": {"executor": "serial"}}


def test_a_run_applies_its_presets_once(tmp_path, monkeypatch, capsys):
    calls = []
    resolve = registry.resolve_preset
    monkeypatch.setattr(registry, "resolve_preset", lambda cfg: (calls.append(cfg.method), resolve(cfg))[1])
    path = tmp_path / "ablation.yaml"
    path.write_text(yaml.safe_dump(ABLATION))
    assert main(["run", str(path), "--results-dir", str(tmp_path / "r")]) == 0
    assert calls == ["feddimdp-no-adpc"]
    run = pd.read_parquet(tmp_path / "r" / "runs").iloc[0]
    assert run["status"] == "completed" and run["clipping"] == "batch"
    assert '"adpc": false' in run["config"]   # the runs table stores the settled config


def test_a_plan_travels_by_its_method_name_and_finds_its_spec_where_it_lands():
    plan = plan_run(tiny_config(method="feddimdp-no-cra", privacy__epsilon=8.0))
    again = pickle.loads(pickle.dumps(plan))
    assert isinstance(again, RunPlan) and again == plan
    assert again.spec is get_method("feddimdp-no-cra") and again.cfg.feddimdp.on("cra") is False
    assert plan_run(plan) is plan   # a plan is never planned again


def test_a_plan_holds_what_the_run_reports():
    plan = plan_run(tiny_config(method="fedavg", privacy__unit="client", privacy__epsilon=8.0, clients_per_round=2,
                                participation="poisson", privacy__noise_cohort_size=100,
                                privacy__population_size=10_000, data__server_holdout=30))
    assert (plan.clipping, plan.epsilon_scope, plan.server_holdout) == ("update", "deployment", 30)
    assert plan.epsilon_exceptions == ""
    assert plan.needs.num_clients == 4 and plan.needs.data == plan.cfg.data
    faster = plan.with_runtime(plan.cfg.runtime.__class__(executor="ray", num_actors=2))
    assert faster.run_id == plan.run_id and faster.needs.runtime.num_actors == 2
