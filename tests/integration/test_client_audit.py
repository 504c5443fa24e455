"""The canary-client audit (privacy.unit=client): canaries are trained by the real clients' runner, a clean
run stays below the claim, and bugs injected into the real clients' and the server's code are caught."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from raysim.audit_clients import run_client_audit
from raysim.cli import main
from raysim.client import ClientRunner
from raysim.config import config_from_dict, read_yaml
from raysim.privacy import clipping
from raysim.privacy.population import ClientLevelPlan
from raysim.runtime.serial import SerialExecutor
from tests.conftest import REPO

pytestmark = pytest.mark.simulation

AUDIT = read_yaml(REPO / "experiments" / "audit_client.yaml")
CLAIM = AUDIT["privacy"]["epsilon"]
#: 30 rounds of cohorts of 2 real clients among about 25 canaries: enough rounds for a bug that hits one
#: client a round to reach a score of canaries (C small: the noise on the average of 2 is σC/2 per coordinate).
LONG = {**AUDIT, "rounds": 30, "num_clients": 20, "clients_per_round": 2,
        "privacy": {**AUDIT["privacy"], "clip_norm": 0.001}}


def _audit(values=AUDIT, canaries=500):
    return run_client_audit(config_from_dict(values), SerialExecutor(), canaries=canaries)


def _unclipped(delta, clip_norm):
    return delta, float(delta.double().norm())


def test_clean_run_stays_below_the_claim_and_canaries_are_trained_by_the_client_runner():
    real = ClientRunner.train
    canary_tasks = []

    def train(self, payload, task, client):
        if task.client_id >= AUDIT["num_clients"]:
            canary_tasks.append(task)
        return real(self, payload, task, client)

    with mock.patch.object(ClientRunner, "train", train):
        result = _audit()
    assert result.epsilon_audited == result.epsilon_accounted == pytest.approx(CLAIM, abs=1e-3)
    assert result.audited_scope == result.accounted_scope == "the simulated population of 200 clients"
    assert max(result.epsilon_lower_bound, result.epsilon_lower_bound_fdp) < CLAIM and not result.refutes
    assert result.can_refute and result.epsilon_ceiling_fdp > CLAIM
    assert len(canary_tasks) == result.insertions > 0 and 0 < result.members < result.canaries


def test_no_client_clipping_is_caught():
    with mock.patch.object(clipping, "clip_update", _unclipped):
        result = _audit()
    assert result.refutes and result.epsilon_lower_bound_fdp > CLAIM


def test_server_noise_below_the_accounted_is_caught():
    real = ClientLevelPlan.update_noise_std
    with mock.patch.object(ClientLevelPlan, "update_noise_std", lambda self, t, c: real(self, t, c) / 4):
        result = _audit()
    assert result.refutes and result.epsilon_lower_bound_fdp > CLAIM


@pytest.mark.cluster   # two 30-round audits (about a minute on 2 cores)
def test_one_client_a_round_skipping_the_clip_is_caught_and_its_clean_run_is_not():
    assert not _audit(LONG).refutes
    real_train, real_clip = ClientRunner.train, clipping.clip_update
    rounds_seen, first = set(), [False]

    def train(self, payload, task, client):   # whichever client trains first in its round skips the clip
        first[0] = task.server_round not in rounds_seen
        rounds_seen.add(task.server_round)
        return real_train(self, payload, task, client)

    def clip(delta, clip_norm):
        return _unclipped(delta, clip_norm) if first[0] else real_clip(delta, clip_norm)

    with mock.patch.object(ClientRunner, "train", train), mock.patch.object(clipping, "clip_update", clip):
        result = _audit(LONG)
    assert result.refutes and result.epsilon_lower_bound_fdp > CLAIM


#: DP-FTRL's tree over shuffled passes: 4 rounds a pass, 2 passes (C small: σ ≈ 9.9 on the average of 50).
TREE = {**AUDIT, "rounds": 8, "participation": "shuffle",
        "privacy": {**AUDIT["privacy"], "mechanism": "tree", "accountant": "rdp", "clip_norm": 0.01}}


@pytest.mark.cluster   # two 8-round audits
def test_tree_audit_follows_the_passes_and_catches_unclipped_updates():
    clean = _audit(TREE)
    assert clean.epsilon_audited == pytest.approx(CLAIM, abs=1e-3) and not clean.refutes
    per_pass = 200 // 50
    assert clean.insertions == 2 * clean.members     # every member once in each of the 2 passes
    assert TREE["rounds"] == 2 * per_pass
    with mock.patch.object(clipping, "clip_update", _unclipped):
        assert _audit(TREE).refutes


def test_deployment_sized_audit_compares_against_the_simulated_clients_own_epsilon(capsys, tmp_path):
    values = {**AUDIT, "rounds": 2, "privacy": {**AUDIT["privacy"], "noise_cohort_size": 1000,
                                                "population_size": 100_000}}
    config = tmp_path / "audit.yaml"
    config.write_text(json.dumps(values))
    assert main(["audit", str(config), "--canaries", "100", "--json"]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert found["epsilon_accounted"] == pytest.approx(CLAIM, abs=1e-3)
    assert found["epsilon_audited"] > 10 * found["epsilon_accounted"]
    assert found["audited_scope"].startswith("the simulated population of 200 clients")
    assert "deployment of 1000 clients a round out of 100000" in found["accounted_scope"]
    assert main(["audit", str(config), "--canaries", "100"]) == 0
    out = capsys.readouterr().out
    assert "audited clients' ε" in out and "the simulated population of 200 clients" in out
    assert "the deployment of 1000 clients a round out of 100000" in out


def test_audit_cli_under_the_client_unit(capsys, tmp_path):
    config = tmp_path / "audit.yaml"
    config.write_text(json.dumps({**AUDIT, "rounds": 2}))
    assert main(["audit", str(config), "--canaries", "100", "--json"]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert found["unit"] == "client" and found["canaries"] == 100 and not found["refutes"]
    assert found["epsilon_lower_bound"] < CLAIM and found["epsilon_lower_bound_fdp"] < CLAIM
    assert main(["audit", str(config), "--guess-fraction", "0.2"]) == 2   # the example unit's option, refused
    assert "--guess-fraction is for privacy.unit=example" in capsys.readouterr().err
