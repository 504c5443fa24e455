"""Client-level DP (privacy.unit=client): the population's accounting against dp-accounting's own
events, the fixed-size and tree cohorts, deployment sizing, adaptive clipping's joint noise, and the
config checks that guard the unit."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from raysim.config import ConfigError, config_from_dict
from raysim.run_plan import run_id_for
from raysim.privacy.accounting import StepEvent, pld_discretization_interval
from raysim.privacy.population import (ADAPTIVE_COUNT_DIVISOR, client_level_plan, joint_update_sigma, prefix_noise,
                                       privacy_scope, tree_nodes)

RELATION = dp_accounting.NeighboringRelation


def client_cfg(**privacy):
    rest = {k: privacy.pop(k) for k in ("num_clients", "clients_per_round", "participation", "rounds", "method",
                                        "quantile") if k in privacy}
    values = {"method": "fedavg", "num_clients": 1000, "clients_per_round": 50, "participation": "poisson",
              "rounds": 200, **rest,
              "privacy": {"unit": "client", "epsilon": 8.0, "delta": 1e-6, **privacy}}
    return config_from_dict(values)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_population_epsilon_is_dp_accountings_poisson_composition(accountant):
    cfg = client_cfg(accountant=accountant, epsilon=None, noise_multiplier=0.9)
    plan = client_level_plan(cfg, np.ones(200), adaptive_count=False)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(50 / 1000, dp_accounting.GaussianDpEvent(0.9)), 200)
    if accountant == "pld":
        interval = pld_discretization_interval([StepEvent(0.05, 0.9, 200)])
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    else:
        acc = rdp_privacy_accountant.RdpAccountant()
    expected = acc.compose(event).get_epsilon(1e-6)
    assert plan.epsilon(200) == pytest.approx(expected, abs=1e-6)
    assert plan.sampling == "poisson" and plan.sample_rate == 0.05 and plan.denominator == 50


def test_calibrated_sigma_ends_at_the_target_and_not_below():
    plan = client_level_plan(client_cfg(), np.ones(200), adaptive_count=False)
    assert plan.epsilon(200) <= 8.0 and plan.epsilon(200) > 7.99
    assert plan.epsilon(100) < plan.epsilon(200)          # rounds carry the ε spent so far


def test_fixed_size_cohorts_are_sampling_without_replacement_under_replace_one():
    cfg = client_cfg(participation="uniform", accountant="rdp", epsilon=None, noise_multiplier=2.0)
    plan = client_level_plan(cfg, np.ones(200), adaptive_count=False)
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=RELATION.REPLACE_ONE)
    # replacing one client moves the clipped sum by up to 2C: the accounted multiplier is σ/2
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(1000, 50, dp_accounting.GaussianDpEvent(1.0)), 200))
    assert plan.epsilon(200) == pytest.approx(acc.get_epsilon(1e-6), abs=1e-6)
    assert privacy_scope(cfg)["adjacency"].startswith("replace one client")


def test_fixed_size_cohorts_with_pld_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="privacy.accountant=rdp") as info:
        client_level_plan(client_cfg(participation="uniform"), np.ones(200), adaptive_count=False)
    assert "\n" not in str(info.value)


def test_tree_accountant_is_dp_accountings_tree_aggregation_rdp():
    """A worked example: N = 1000, k = 50, so a pass is 20 rounds; 50 rounds are 2 whole trees and one of
    10 leaves. dp-accounting's tree RDP of one tree of m leaves is α·⌈log2(m)+1⌉... computed by dp-accounting
    itself; here it is composed over the passes, each client in at most one leaf of each tree."""
    cfg = client_cfg(participation="shuffle", mechanism="tree", accountant="rdp", epsilon=None,
                     noise_multiplier=3.0, rounds=50)
    plan = client_level_plan(cfg, np.ones(50), adaptive_count=False)
    assert plan.per_pass == 20
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=RELATION.REPLACE_SPECIAL)
    acc.compose(dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.SingleEpochTreeAggregationDpEvent(3.0, 20), 2),
        dp_accounting.SingleEpochTreeAggregationDpEvent(3.0, 10)]))
    assert plan.epsilon(50) == pytest.approx(acc.get_epsilon(1e-6), abs=1e-9)
    # A single tree of 20 leaves has depth 6 (nodes at levels 0..4, plus the prefix decomposition): its
    # RDP at order α is α·depth/(2σ²) for a client in one leaf; a tree of one leaf is the Gaussian.
    one = rdp_privacy_accountant.RdpAccountant(neighboring_relation=RELATION.REPLACE_SPECIAL)
    one.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(3.0, 1))
    gaussian = rdp_privacy_accountant.RdpAccountant()
    gaussian.compose(dp_accounting.GaussianDpEvent(3.0))
    assert one.get_epsilon(1e-6) == pytest.approx(gaussian.get_epsilon(1e-6), rel=1e-9)


def test_tree_prefix_decomposition_and_noise_reuse():
    assert tree_nodes(1) == [(0, 0)]
    assert tree_nodes(5) == [(2, 0), (0, 4)]
    assert tree_nodes(6) == [(2, 0), (1, 2)]
    assert tree_nodes(8) == [(3, 0)]
    # prefix 5 and prefix 6 share the node (2, 0): their difference is node (1, 2) minus node (0, 4)
    five, six, four = (prefix_noise(0, 0, t, 1.0, 1000) for t in (5, 6, 4))
    assert torch.equal(five - four, prefix_noise(0, 0, 5, 1.0, 1000) - prefix_noise(0, 0, 4, 1.0, 1000))
    assert not torch.equal(six, five)
    assert float(four.std()) == pytest.approx(1.0, rel=0.1)      # one node: std σC
    assert float(six.std()) == pytest.approx(math.sqrt(2), rel=0.1)   # two nodes


def test_noise_sized_for_a_deployment():
    cfg = client_cfg(noise_cohort_size=1000, population_size=1_000_000)
    plan = client_level_plan(cfg, np.ones(200), adaptive_count=False)
    assert plan.deployment and plan.cohort == 1000 and plan.population == 1_000_000 and plan.denominator == 50
    assert plan.sample_rate == pytest.approx(1e-3)
    # the simulated average carries the deployment average's noise σ'C/k'
    assert plan.update_noise_std(1, 2.0) == pytest.approx(plan.sigma * 2.0 / 1000)
    assert plan.epsilon(200) <= 8.0
    scope = privacy_scope(cfg)
    assert scope["epsilon_scope"] == "deployment"
    assert "deployment of 1000 clients a round out of 1000000" in scope["epsilon_scope_detail"]
    assert privacy_scope(client_cfg())["epsilon_scope"] == "population"
    assert privacy_scope(config_from_dict({"method": "fedavg", "privacy": {"epsilon": 8.0}}))["epsilon_scope"] == "per-client"


def test_adaptive_clipping_joint_noise():
    """σ_b = k/20 on Σ(b_i − 1/2) (sensitivity 1/2, multiplier 2σ_b), and σ_Δ with
    (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2) = σ: one Gaussian of multiplier σ is what is accounted."""
    plan = client_level_plan(client_cfg(), np.ones(200), adaptive_count=True)
    sigma_b = 50 / ADAPTIVE_COUNT_DIVISOR
    assert plan.count_std == sigma_b == 2.5
    assert (plan.update_sigma ** -2 + (2 * sigma_b) ** -2) ** -0.5 == pytest.approx(plan.sigma, rel=1e-12)
    assert plan.update_sigma > plan.sigma
    assert plan.count_noise_std() == pytest.approx(1 / 20)
    plain = client_level_plan(client_cfg(), np.ones(200), adaptive_count=False)
    assert plan.sigma == plain.sigma          # the joint release is accounted as the plain one
    with pytest.raises(ConfigError, match=r"raise σ_b \(quantile.noise_multiplier; default k/20\) or clients_per_round"):
        joint_update_sigma(1.0, 0.5)


def test_adaptive_clipping_sigma_b_is_configurable():
    """quantile.noise_multiplier sets σ_b under the client unit (Andrew et al.'s σ_b): the plan's count noise and
    σ_Δ follow it, the accounted joint σ does not; 0 is refused in one line."""
    cfg = client_cfg(method="dp-fedavg-adaptive", quantile={"noise_multiplier": 10.0})
    from raysim.algorithms.registry import get_method
    (upload,) = get_method("dp-fedavg-adaptive").uploads(cfg)
    assert upload.release.kind == "joint" and upload.release.noise_multiplier == 10.0
    plan = client_level_plan(cfg, np.ones(200), adaptive_count=True, count_std=10.0)
    default = client_level_plan(client_cfg(method="dp-fedavg-adaptive"), np.ones(200), adaptive_count=True)
    assert plan.count_std == 10.0 and default.count_std == 2.5 and plan.sigma == default.sigma
    assert (plan.update_sigma ** -2 + 20.0 ** -2) ** -0.5 == pytest.approx(plan.sigma, rel=1e-12)
    assert plan.sigma < plan.update_sigma < default.update_sigma     # more noise on the count, less on the update
    assert plan.count_noise_std() == pytest.approx(10.0 / 50)
    (unset,) = get_method("dp-fedavg-adaptive").uploads(client_cfg(method="dp-fedavg-adaptive"))
    assert unset.release.noise_multiplier == 0.0                     # the plan's k/20
    with pytest.raises(ConfigError, match="quantile.noise_multiplier.*must be > 0 under privacy.unit=client"):
        client_cfg(method="dp-fedavg-adaptive", quantile={"noise_multiplier": 0.0})
    with pytest.raises(ConfigError, match="quantile.norm_source.*record-level variant's key"):
        client_cfg(method="dp-fedavg-adaptive", quantile={"norm_source": "update"})


def test_adaptive_count_noise_on_the_server(monkeypatch):
    """The server's b̄: (Σ(b_i − 1/2) + N(0, σ_b²))/k + 1/2, its noise std σ_b/k over many rounds."""
    from raysim.algorithms.base import MethodContext
    from raysim.algorithms.quantile import QuantileClipServer
    from raysim.messages import ClientResult
    cfg = client_cfg(method="dp-fedavg-adaptive", num_clients=100, clients_per_round=40, rounds=400, epsilon=None,
                     noise_multiplier=1.0)
    plan = client_level_plan(cfg, np.ones(400), adaptive_count=True)
    ctx = MethodContext(cfg, "update", 3, ((0, 3),), np.full(100, 10), np.full(100, 1), np.zeros(100),
                        client_level=plan)
    server = QuantileClipServer(ctx)
    results = [ClientResult(i, 1, 10, 1, torch.zeros(3), 0.0, 0.0, uploads={"update_within_clip": float(i % 4 != 0)})
               for i in range(40)]
    clean = (30 - 20) / 40 + 0.5          # 30 of 40 unclipped
    values = np.array([server.unclipped_fraction(t, results) for t in range(1, 401)])
    assert values.mean() == pytest.approx(clean, abs=0.01)
    assert values.std() == pytest.approx(2.0 / 40, rel=0.1)     # σ_b / k = (40/20)/40


def test_unit_keys_are_checked_in_one_line():
    for values, key in [({"privacy": {"unit": "household"}}, "privacy.unit"),
                        ({"privacy": {"mechanism": "tree"}}, "privacy.mechanism"),
                        ({"privacy": {"noise_cohort_size": 10, "population_size": 100}}, "privacy.noise_cohort_size"),
                        ({"privacy": {"unit": "client", "noise_cohort_size": 10}}, "privacy.noise_cohort_size"),
                        ({"privacy": {"unit": "client", "mechanism": "tree"}, "clients_per_round": 2}, "participation"),
                        ({"participation": "shuffle", "clients_per_round": 2}, "participation"),
                        ({"privacy": {"unit": "client", "clipping": "per_sample"}}, "privacy.clipping")]:
        with pytest.raises(ConfigError, match=key) as info:
            config_from_dict(values)
        assert "\n" not in str(info.value)


#: Run ids computed before the client unit existed: the new privacy keys at their defaults leave them.
KNOWN_IDS = {"fedsa": "fedsa-digits-s0-64c10a7664", "dp-fedsam": "dp-fedsam-digits-s0-3ffa5322cb",
             "fedavg": "fedavg-digits-s0-c280665632", "scaffold": "scaffold-digits-s0-6155d29fd3"}


@pytest.mark.parametrize("method", sorted(KNOWN_IDS))
def test_example_unit_run_ids_are_unchanged(method):
    from raysim.config import load_config
    from tests.conftest import REPO
    cfg = load_config(REPO / "experiments" / "quickstart.yaml", [f"method={method}"])
    assert run_id_for(cfg) == KNOWN_IDS[method]
    assert run_id_for(cfg.replace(privacy=cfg.privacy.__class__(**{**cfg.privacy.__dict__, "unit": "client"}))) \
        != KNOWN_IDS[method]


# --- correlated noise: blt and bandmf on cyclic Poisson cohorts ----------------------------------------------

def test_cyclic_cohorts_draw_each_round_from_one_group_so_a_clients_rounds_are_g_apart():
    from raysim.participation import cyclic_groups, cyclic_rate, participation_schedule, rounds_by_client
    cfg = client_cfg(mechanism="bandmf", min_separation=4, rounds=400)
    assert (cyclic_groups(cfg), cyclic_rate(cfg)) == (4, 0.2)
    schedule = participation_schedule(cfg)
    for rounds in rounds_by_client(schedule, 1000):
        assert np.all(np.diff(rounds) % 4 == 0)
    groups = [{int(c) for t in range(g, 400, 4) for c in schedule[t]} for g in range(4)]
    assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1:])      # disjoint groups
    assert np.mean([len(c) for c in schedule]) == pytest.approx(50, rel=0.05)      # expected cohort k
    assert cyclic_groups(client_cfg(mechanism="blt", rounds=3)) == 3                # min(N // k, T)


@pytest.mark.parametrize("changes, key", [
    (dict(mechanism="blt", participation="uniform"), "participation"),
    (dict(mechanism="bandmf", min_separation=21), "privacy.min_separation"),
    (dict(mechanism="gaussian", min_separation=2), "privacy.min_separation"),
    (dict(mechanism="blt", noise_cohort_size=10, population_size=10_000), "privacy.noise_cohort_size"),
])
def test_pairings_without_accounting_are_refused_in_one_line(changes, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'") as info:
        client_cfg(**changes)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("method, message", [("dp-fedavg-adaptive", "adaptive clipping's count"),
                                             ("dp-acdn", "dp-acdn's noise schedule changes it")])
def test_methods_correlated_noise_cannot_account_are_refused_before_the_run(method, message):
    from raysim.run_plan import plan_run
    for mechanism in ("blt", "bandmf"):
        with pytest.raises(ConfigError, match=message):
            plan_run(client_cfg(mechanism=mechanism, rounds=6, method=method))
    assert plan_run(client_cfg(mechanism="blt", rounds=6, method="fedacg")).clipping == "update"


def test_bandmf_plan_is_amplified_bandmf_on_dp_accounting():
    from raysim.privacy.mechanisms.bandmf import amplified_bandmf_event
    cfg = client_cfg(mechanism="bandmf", min_separation=5, rounds=60, epsilon=None, noise_multiplier=0.8)
    plan = client_level_plan(cfg, np.ones(60), adaptive_count=False)
    assert plan.correlated and (plan.groups, plan.sample_rate) == (5, 0.25)
    assert len(plan.strategy) == 5 and np.linalg.norm(plan.strategy) == pytest.approx(1.0)
    acc = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=pld_discretization_interval([StepEvent(0.25, 0.8, 12)]))
    acc.compose(amplified_bandmf_event(0.8, 60, 5, 0.25))
    assert plan.epsilon(60) == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9)
    assert plan.epsilon(1) < plan.epsilon(30) < plan.epsilon(60)
    assert plan.correlated_noise_std(2.0) == pytest.approx(0.8 * 2.0 / 50)
    scope = privacy_scope(cfg)
    assert scope["privacy_mechanism"] == "bandmf" and scope["adjacency"].startswith("add/remove one client")
    assert scope["participation"].startswith("cyclic poisson: 5 groups") and "rate 0.25" in scope["participation"]


def test_blt_plan_is_one_gaussian_on_its_strategy_and_calibrates_to_the_target():
    cfg = client_cfg(mechanism="blt", min_separation=4, rounds=20)
    plan = client_level_plan(cfg, np.ones(20), adaptive_count=False)
    assert plan.epsilon(20) == pytest.approx(8.0, rel=1e-3)
    gaussian = pld_privacy_accountant.PLDAccountant()
    gaussian.compose(dp_accounting.GaussianDpEvent(plan.sigma))
    assert plan.epsilon(20) == pytest.approx(gaussian.get_epsilon(1e-6), rel=1e-3)
    assert 1 <= plan.strategy.buffers <= 4 and plan.sensitivity > 1.0     # 5 participations, 4 apart
    assert plan.epsilon(4) < plan.epsilon(12) < plan.epsilon(20)            # fewer rows: less sensitivity
    assert plan.correlated_noise_std(1.0) == pytest.approx(plan.sigma * plan.sensitivity / 50)
