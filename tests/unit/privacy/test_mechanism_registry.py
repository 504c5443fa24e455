"""Client-level mechanisms are registered objects: one defined here, outside raysim, becomes a valid
``privacy.mechanism``, and the plan, the ε and a run use it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysim.config import ConfigError, config_from_dict
from raysim.privacy.mechanisms.builtin import Gaussian
from raysim.privacy.mechanisms.registry import (get_mechanism, mechanism_names, register_mechanism,
                                                unregister_mechanism)
from raysim.privacy.population import client_level_plan, privacy_scope


class HalvedGaussian(Gaussian):
    """The Gaussian mechanism accounted as if its noise were half as large (an ε on the safe side) (a toy, for the registry)."""

    name = "halved_gaussian"
    canary_audit = False
    example_unit = False   # the halving is for the client unit; DP-SGD steps keep the plain Gaussian

    def epsilon(self, plan, sigma, rounds):
        return super().epsilon(plan, 0.5 * sigma, rounds)

    def round_event(self, plan, sigma, server_round):   # the population's ledger composes these
        return super().round_event(plan, 0.5 * sigma, server_round)


@pytest.fixture
def halved():
    mechanism = register_mechanism(HalvedGaussian())
    yield mechanism
    unregister_mechanism(mechanism.name)


def client_cfg(mechanism, **top):
    values = {"method": "fedavg", "num_clients": 1000, "clients_per_round": 50, "participation": "poisson",
              "rounds": 20, **top,
              "privacy": {"unit": "client", "epsilon": 4.0, "delta": 1e-6, "accountant": "rdp",
                          "mechanism": mechanism}}
    return config_from_dict(values)


def test_the_built_in_mechanisms_are_registered_in_order():
    assert mechanism_names()[:4] == ("gaussian", "tree", "blt", "bandmf")
    assert get_mechanism("tree").prefix_sums and not get_mechanism("gaussian").prefix_sums
    assert {m for m in mechanism_names() if get_mechanism(m).correlated} >= {"blt", "bandmf"}


def test_a_registered_mechanism_is_a_config_choice_and_its_epsilon_plans_the_noise(halved):
    assert "halved_gaussian" in mechanism_names()
    cfg = client_cfg("halved_gaussian")
    assert cfg.privacy.mechanism == "halved_gaussian"
    plan = client_level_plan(cfg, np.ones(cfg.rounds), adaptive_count=False)
    base = client_level_plan(client_cfg("gaussian"), np.ones(cfg.rounds), adaptive_count=False)
    assert plan.spec is halved and plan.mechanism == "halved_gaussian"
    # its ε at σ is the Gaussian's at 2σ: the calibration finds half the Gaussian's σ for the same target
    assert plan.epsilon(cfg.rounds) == pytest.approx(base.spec.epsilon(base, 0.5 * plan.sigma, cfg.rounds))
    assert plan.sigma == pytest.approx(base.sigma * 2.0, rel=1e-3)
    assert plan.epsilon(cfg.rounds) <= 4.0
    assert privacy_scope(cfg)["privacy_mechanism"] == "halved_gaussian"


def test_an_unknown_mechanism_is_refused_in_one_line_naming_the_registered_ones(halved):
    with pytest.raises(ConfigError) as err:
        client_cfg("nonesuch")
    message = str(err.value)
    assert "\n" not in message and "privacy.mechanism" in message and "'nonesuch'" in message
    for name in ("gaussian", "tree", "blt", "bandmf", "halved_gaussian"):
        assert name in message


def test_an_unregistered_mechanism_is_no_longer_a_choice():
    register_mechanism(HalvedGaussian())
    unregister_mechanism("halved_gaussian")
    with pytest.raises(ConfigError, match="unknown value 'halved_gaussian'"):
        client_cfg("halved_gaussian")


def test_a_taken_name_and_the_declared_checks(halved):
    with pytest.raises(ValueError, match="already registered"):
        register_mechanism(HalvedGaussian())
    with pytest.raises(ValueError, match="built in"):
        unregister_mechanism("gaussian")
    # what it declares (inherited from the Gaussian's) is what the config checks
    with pytest.raises(ConfigError, match="shuffle has no amplification"):
        client_cfg("halved_gaussian", participation="shuffle")
    with pytest.raises(ConfigError, match="needs privacy.unit=client"):
        config_from_dict({"privacy": {"mechanism": "halved_gaussian"}})


def test_a_run_under_a_registered_mechanism_reports_its_epsilon(halved, tmp_path):
    from raysim.runtime import execute
    from tests.helpers import tiny_config
    privacy = {"unit": "client", "mechanism": "halved_gaussian", "noise_multiplier": 1.0, "accountant": "rdp"}
    cfg = tiny_config(rounds=1, clients_per_round=2, participation="poisson", privacy=privacy,
                      data={"name": "digits", "partition": "iid", "min_samples_per_client": 10,
                            "test_subsample": 50})
    summary = execute(cfg, str(tmp_path))
    plan = client_level_plan(cfg, np.ones(1), adaptive_count=False)
    assert summary.row["privacy_mechanism"] == "halved_gaussian"
    expected = get_mechanism("gaussian").epsilon(plan, 0.5, 1)
    assert math.isfinite(expected) and summary.row["epsilon"] == pytest.approx(expected)
