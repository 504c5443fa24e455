"""Whose ε it is, on every surface: a run whose noise is sized for a deployment (``privacy.noise_cohort_size``,
``privacy.population_size``) shows the deployment's ε, and its runs, rounds and clients tables, its progress
line, its summary and ``raysim report`` each say so. And what the server's aggregation receives: never the
values the simulation only logs."""

from __future__ import annotations

import math
import re
from typing import Sequence

import pytest
import torch
import yaml

from raysim.algorithms.base import Aggregate, ClientHooks, MethodSpec, Server, client_level_any
from raysim.algorithms.registry import register, unregister
from raysim.cli import main
from raysim.config import config_from_dict
from raysim.messages import ClientResult
from raysim.results import read_table
from raysim.runtime import execute

pytestmark = pytest.mark.simulation

DEPLOYMENT = {"method": "fedavg", "rounds": 2, "seed": 0, "num_clients": 8, "clients_per_round": 4,
              "participation": "poisson", "batch_size": 10, "lr": 0.1,
              "privacy": {"unit": "client", "epsilon": 8.0, "noise_cohort_size": 1000, "population_size": 1_000_000,
                          "accountant": "rdp"},
              "data": {"name": "digits", "partition": "iid", "min_samples_per_client": 10, "test_subsample": 100},
              "runtime": {"executor": "serial"}}


def test_a_deployment_sized_run_names_the_scope_of_its_epsilon_everywhere(tmp_path, capsys):
    config = tmp_path / "deployment.yaml"
    config.write_text(yaml.safe_dump(DEPLOYMENT))
    results = tmp_path / "results"
    assert main(["run", str(config), "--results-dir", str(results)]) == 0
    captured = capsys.readouterr()
    assert re.search(r"ε \d+\.\d\d \(deployment\)", captured.err)           # the progress line
    assert not re.findall(r"ε \d+\.\d\d(?! \(deployment\))", captured.err)     # never without its scope
    assert "(deployment)" in captured.out                                                      # the summary's ε
    assert "of a deployment of 1000 clients a round out of 1000000" in captured.out
    assert "not the simulated federation of 8" in captured.out
    runs = read_table(str(results), "runs")
    assert runs["epsilon_scope"].item() == "deployment"
    assert runs["epsilon_scope_detail"].item().startswith("a deployment of 1000 clients a round out of 1000000")
    for table in ("rounds", "clients"):
        frame = read_table(str(results), table)
        assert len(frame) and (frame["epsilon_scope"] == "deployment").all(), table
    assert main(["report", str(results), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert f"{runs['epsilon'].item():.4g} (deployment)" in md and "ε=8 (deployment), client-level" in md


# --------------------------------------------------------------------------- what the server receives

SEEN: list[ClientResult] = []


class StatefulHooks(ClientHooks):
    def finalize(self, params, num_steps):
        return {"steps": torch.tensor([float(num_steps)])}   # a state computed on the client


class RecordingServer(Server):
    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        SEEN.extend(results)
        return super().aggregate(server_round, global_weights, results)


@pytest.fixture
def recording():
    register(MethodSpec(name="recording", summary="FedAvg that keeps what its server is given (a test method)",
                        source="this test", server=RecordingServer, client=StatefulHooks, private=True,
                        client_level=client_level_any,
                        client_level_note="DP-FedAvg"))
    SEEN.clear()
    yield
    unregister("recording")


@pytest.mark.parametrize("unit, scope", [("example", "per-client"), ("client", "population")])
def test_the_server_never_receives_what_the_simulation_only_logs(recording, tmp_path, capsys, unit, scope):
    from raysim.cli.run import print_run_summary
    privacy = {"unit": unit, "noise_multiplier": 1.0}
    summary = execute(config_from_dict({**DEPLOYMENT, "method": "recording", "rounds": 1, "clients_per_round": None,
                                        "num_clients": 4, "privacy": privacy}), str(tmp_path))
    clients = read_table(str(tmp_path), "clients")
    # whose ε, outside a deployment too
    assert summary.row["epsilon_scope"] == scope and (clients["epsilon_scope"] == scope).all()
    print_run_summary([summary.row], str(tmp_path))
    assert f"{summary.row['epsilon']:.4f} ({scope})" in capsys.readouterr().out
    assert len(SEEN) == len(clients) == 4
    # the log rows keep them ...
    assert clients["train_loss"].notna().all() and clients["frac_clipped"].notna().all()
    assert clients["update_norm"].notna().all() and clients["client_seconds"].notna().all()
    # ... the server's aggregation does not see them
    for r in SEEN:
        assert math.isnan(r.train_loss) and math.isnan(r.frac_clipped) and math.isnan(r.seconds) and r.diagnostics == {}
        # ‖Δ_i‖ is a function of a DP output under the example unit, of the mechanism's input under the client unit
        assert math.isnan(r.update_norm()) == (unit == "client")
        # the client's state, which the simulation keeps for the client, is not the client unit's release
        assert (r.client_state is None) == (unit == "client")
