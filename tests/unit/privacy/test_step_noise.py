"""Correlated noise on each client's DP-SGD steps (privacy.unit=example, privacy.mechanism=bandmf)."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import torch

from raysim.config import ConfigError, client_mechanism
from raysim.noise import GaussianNoise, StreamedNoise
from raysim.privacy.accounting import PrivacyLedger, StepEvent
from raysim.privacy.mechanisms.bandmf import BandMFNoise, amplified_bandmf_event, optimize_bandmf
from raysim.run_plan import plan_run
from raysim.training import CorrelatedSteps
from tests.helpers import tiny_config

BANDMF = client_mechanism("bandmf")


@pytest.mark.parametrize("separation, bands, rate, events", [(1, 1, 0.05, 20), (3, 2, 0.1, 10), (4, 4, 0.2, 5),
                                                              (5, 5, 0.25, 4), (100, 20, 1.0, 1)])
def test_a_client_takes_the_largest_divisor_of_its_steps_as_its_bands(separation, bands, rate, events):
    # n = 200, B = 10: 20 steps a round; b divides 20, is at most the separation and ⌈n/B⌉; rate b·B/n ≤ 1
    cfg = tiny_config(method="fedsa", batch_size=10, privacy__mechanism="bandmf", privacy__min_separation=separation,
                      privacy__epsilon=8.0)
    steps = BANDMF.example_steps(cfg, 200, 20)
    assert (steps.bands, steps.rate, steps.events) == (bands, pytest.approx(rate), events)
    independent = client_mechanism("gaussian").example_steps(cfg, 200, 20)
    assert (independent.bands, independent.rate, independent.events) == (1, pytest.approx(0.05), 20)


def test_the_groups_partition_the_examples_once_for_the_run():
    groups = CorrelatedSteps.partition(103, 4, seed=0, client_id=7)
    assert sorted(np.concatenate(groups).tolist()) == list(range(103))
    assert {len(g) for g in groups} == {25, 26}
    again = CorrelatedSteps.partition(103, 4, seed=0, client_id=7)
    assert all(np.array_equal(a, b) for a, b in zip(groups, again))


def test_the_accounting_is_dp_accounting_composing_amplified_bandmf():
    """A client of n = 200 examples at B = 10, one epoch a round (τ = 20) and b = 4 bands, over 6 rounds:
    each round is StepEvent(q = 0.2, σ, 5), and the 6 rounds are jax_privacy's amplified BandMF event for
    120 steps and 4 bands (30 compositions of the Poisson-subsampled Gaussian), composed by dp-accounting."""
    cfg = tiny_config(method="fedsa", batch_size=10, privacy__mechanism="bandmf", privacy__min_separation=4,
                      privacy__epsilon=8.0)
    steps, sigma = BANDMF.example_steps(cfg, 200, 20), 1.3
    for accountant in ("rdp", "pld"):
        ledger = PrivacyLedger(1e-5, accountant)
        for _ in range(6):
            ledger.record(StepEvent(steps.rate, sigma, steps.events))
        reference = (dp_accounting.rdp.RdpAccountant() if accountant == "rdp" else
                     dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
        reference.compose(amplified_bandmf_event(sigma, 120, 4, steps.rate))
        assert ledger.epsilon() == pytest.approx(reference.get_epsilon(1e-5), rel=1e-5 if accountant == "pld" else 1e-12)


def test_the_streamed_noise_is_the_strategy_inverse_of_the_draws():
    """The noise w the client adds at step t satisfies Σ_j c_j w_{t−j} = z_t: it is (C⁻¹ z)_t, so the noise
    on the prefix sums of the steps is the factorisation's."""
    coefs = optimize_bandmf(30, 3)
    tensors = [torch.zeros(3), torch.zeros(2, 2)]
    stream = BandMFNoise(coefs, 7)
    draws, noise = [], []
    for t in range(30):
        z = torch.cat([g.reshape(-1) for g in GaussianNoise(5, "dp-noise", 1, 0, t, 0).like(tensors, 1.0)]).double()
        draws.append(z)
        got = StreamedNoise(GaussianNoise(5, "dp-noise", 1, 0, t, 0), stream).like(tensors, 0.5)
        assert [g.shape for g in got] == [t_.shape for t_ in tensors]
        noise.append(torch.cat([g.reshape(-1) for g in got]).double() / 0.5)
    for t in range(30):
        mixed = sum(coefs[j] * noise[t - j] for j in range(len(coefs)) if t - j >= 0)
        assert torch.allclose(mixed, draws[t], atol=1e-5)


def test_one_band_is_the_independent_draw():
    tensors = [torch.zeros(4, 3), torch.zeros(5)]
    plain = GaussianNoise(3, "dp-noise", 2, 1, 0, 0).like(tensors, 0.7)
    streamed = StreamedNoise(GaussianNoise(3, "dp-noise", 2, 1, 0, 0), BandMFNoise(np.ones(1), 17)).like(tensors, 0.7)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(plain, streamed))


@pytest.mark.parametrize("changes, message", [
    ({"privacy__mechanism": "bandmf"}, "needs its bands b"),
    ({"privacy__mechanism": "tree"}, "needs privacy.unit=client"),
])
def test_the_config_refuses_what_the_steps_cannot_take(changes, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(method="fedsa", privacy__epsilon=8.0, **changes)


@pytest.mark.parametrize("method, changes, message", [
    ("fedsa", {"privacy__clipping": "batch"}, "needs privacy.clipping=per_sample"),
    ("dp-fedsam", {"sam__mode": "both"}, "makes 2 DP releases a step"),
    ("dp-acdn", {}, "changes σ by round"),
])
def test_a_run_refuses_a_method_the_strategy_cannot_account(method, changes, message):
    cfg = tiny_config(method=method, privacy__epsilon=8.0, privacy__mechanism="bandmf", privacy__min_separation=2,
                      **changes)
    with pytest.raises(ConfigError, match=message):
        plan_run(cfg)


def test_the_record_level_audit_refuses_correlated_step_noise():
    from raysim.audit import run_audit
    cfg = tiny_config(method="fedsa", privacy__epsilon=8.0, privacy__mechanism="bandmf", privacy__min_separation=2)
    with pytest.raises(ConfigError, match="correlates it across steps and is not audited"):
        run_audit(cfg, canaries=100)
