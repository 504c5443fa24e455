"""The privacy cost of private tuning: RDP curves and the Papernot–Steinke bounds."""

from __future__ import annotations

import math

import dp_accounting
from dp_accounting import dp_event
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from raysim.privacy.accounting import StepEvent, compute_epsilon
from raysim.privacy.tuning import (ORDERS, CandidateCount, max_rdp_curve, rdp_curve, rdp_from_json, rdp_to_json,
                                   tuned_epsilon, tuned_rdp)
from raysim.rng import np_generator

# A plain Gaussian mechanism (sensitivity 1, noise σ) composed T times is (λ, Tλ/(2σ²))-RDP.
SIGMA, T = 2.0, 10
RHO = T / (2.0 * SIGMA**2)
HAND_ORDERS = [1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0]
DELTA = 1e-5


def tnb(eta, **kw):
    return CandidateCount.from_mapping({"distribution": "truncated_negative_binomial", "eta": eta, **kw})


def poisson(mean):
    return CandidateCount.from_mapping({"distribution": "poisson", "mean": mean})


def gaussian_curve(orders):
    return [RHO * lam for lam in orders]


# -- independent arithmetic ---------------------------------------------------------------------

def hand_monotone(values, orders):
    return [min(v for v, o in zip(values, orders) if o >= lam) for lam in orders]


def hand_epsilon(orders, rdp, delta):
    """min over λ of r + log(1 − 1/λ) − log(δλ)/(λ − 1)  (the conversion, written out)."""
    return max(0.0, min(r + math.log((lam - 1) / lam) - (math.log(delta) + math.log(lam)) / (lam - 1)
                        for lam, r in zip(orders, rdp)))


def hand_delta(orders, rdp, eps):
    """min over λ of min(√(1 − e^(−r)), (1 − 1/λ)^(λ−1) e^((λ−1)(r − ε)) / λ), in logs."""
    return math.exp(min(min(0.5 * math.log(1 - math.exp(-r)),
                            (lam - 1) * math.log(1 - 1 / lam) + (lam - 1) * (r - eps) - math.log(lam))
                        for lam, r in zip(orders, rdp)))


def test_truncated_negative_binomial_bound_by_hand():
    # Theorem 2: ε'(λ) = ε(λ) + (1+η)(1 − 1/λ̂)ε(λ̂) + (1+η)log(1/γ)/λ̂ + log(E[K])/(λ − 1), best λ̂.
    for eta, gamma in [(1.0, 0.1), (0.0, 0.05), (0.5, 0.2)]:
        count = tnb(eta, gamma=gamma)
        if eta == 1.0:
            mean = 1 / gamma
        elif eta == 0.0:
            mean = (1 / gamma - 1) / math.log(1 / gamma)
        else:
            mean = eta * (1 - gamma) / (gamma * (1 - gamma**eta))
        assert count.mean == pytest.approx(mean, rel=1e-12)
        best_hat = min((1 + eta) * (1 - 1 / h) * RHO * h + (1 + eta) * math.log(1 / gamma) / h for h in HAND_ORDERS)
        raw = [RHO * lam + best_hat + math.log(mean) / (lam - 1) for lam in HAND_ORDERS]
        expected_rdp = hand_monotone(raw, HAND_ORDERS)
        got = tuned_rdp(gaussian_curve(HAND_ORDERS), HAND_ORDERS, count)
        np.testing.assert_allclose(got, expected_rdp, rtol=1e-9)
        got_eps = tuned_epsilon([gaussian_curve(HAND_ORDERS)], HAND_ORDERS, DELTA, count)
        assert got_eps == pytest.approx(hand_epsilon(HAND_ORDERS, expected_rdp, DELTA), rel=1e-12)
    # The released model's ε is larger than one run's.
    single = hand_epsilon(HAND_ORDERS, gaussian_curve(HAND_ORDERS), DELTA)
    assert tuned_epsilon(gaussian_curve(HAND_ORDERS), HAND_ORDERS, DELTA, tnb(1, gamma=0.1)) > single


def test_poisson_bound_by_hand():
    # Theorem 6: ε'(λ) = ε(λ) + μ δ̂ + log(μ)/(λ − 1), δ̂ = δ at ε̂ = log(1 + 1/(λ − 1)).
    curve = gaussian_curve(HAND_ORDERS)
    for mu in (1.0, 3.0, 10.0):
        raw = [r + mu * hand_delta(HAND_ORDERS, curve, math.log(1 + 1 / (lam - 1))) + math.log(mu) / (lam - 1)
               for lam, r in zip(HAND_ORDERS, curve)]
        expected_rdp = hand_monotone(raw, HAND_ORDERS)
        np.testing.assert_allclose(tuned_rdp(curve, HAND_ORDERS, poisson(mu)), expected_rdp, rtol=1e-9)
        assert tuned_epsilon(curve, HAND_ORDERS, DELTA, poisson(mu)) == pytest.approx(
            hand_epsilon(HAND_ORDERS, expected_rdp, DELTA), rel=1e-12)


@pytest.mark.parametrize("shape,mean", [(1.0, 10.0), (0.0, 10.0), (1.0, 3.0), (math.inf, 10.0)])
def test_agrees_with_dp_accountings_repeat_and_select(shape, mean):
    event = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1))
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(ORDERS))
    acc.compose(dp_event.RepeatAndSelectDpEvent(dp_accounting.SelfComposedDpEvent(event, 200), mean, shape))
    reference = acc.get_epsilon(DELTA)
    if shape == math.inf:
        count = poisson(mean)
    else:   # γ from the mean as dp_accounting solves it (its bisection), so the two use the same γ
        count = tnb(shape, gamma=rdp_privacy_accountant._gamma_truncated_negative_binomial(shape, mean))
    ours = tuned_epsilon(rdp_curve([StepEvent(0.05, 1.1, 200)]), ORDERS, DELTA, count)
    if shape == math.inf:   # ours also lowers the Poisson curve by monotonicity in the order
        assert ours <= reference * (1 + 1e-12) and ours == pytest.approx(reference, rel=0.01)
    else:
        # (dp_accounting takes log of the mean it was given; ours, of the mean of the solved γ)
        assert ours == pytest.approx(reference, rel=1e-9)


def test_rdp_curve_matches_dp_accounting():
    events = [StepEvent(0.02, 1.5, 50), StepEvent(0.01, 1.0, 100), StepEvent(1.0, 3.0, 2), StepEvent(1.0, 4.0, 1)]
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(ORDERS))
    for e in events:
        acc.compose(e.to_dp_event())
    np.testing.assert_allclose(rdp_curve(events), acc.rdp, rtol=1e-9)
    # A plain Gaussian: λ/(2σ²) per release.
    np.testing.assert_allclose(rdp_curve([StepEvent(1.0, SIGMA, T)], HAND_ORDERS), gaussian_curve(HAND_ORDERS),
                               rtol=1e-9)
    # The same ε as raysim's RDP accounting, through dp_accounting's conversion.
    eps, _ = rdp_privacy_accountant.compute_epsilon(ORDERS, rdp_curve(events), DELTA)
    assert eps == pytest.approx(compute_epsilon(events, DELTA, "rdp"), rel=0.02)
    assert not rdp_curve([]).any()
    assert np.isinf(rdp_curve([StepEvent(0.1, 0.0, 3)])).all()


def test_max_rdp_curve_is_the_pointwise_maximum():
    clients = [[StepEvent(0.1, 1.0, 30)], [StepEvent(0.05, 1.0, 80), StepEvent(1.0, 4.0, 2)], [],
               [StepEvent(0.1, 1.0, 10), StepEvent(0.1, 1.0, 20)]]
    expected = np.max([rdp_curve(events) for events in clients], axis=0)
    np.testing.assert_array_equal(max_rdp_curve(clients), expected)
    assert not max_rdp_curve([]).any()
    text = rdp_to_json(expected)
    np.testing.assert_array_equal(rdp_from_json(text), expected)
    assert np.isinf(rdp_from_json(rdp_to_json([math.inf] * len(ORDERS)))).all()
    with pytest.raises(ValueError, match="orders"):
        rdp_from_json(rdp_to_json(expected[:-1]))
    with pytest.raises(ValueError, match="rdp_epsilons"):
        rdp_from_json("{not json")


def test_more_candidates_cost_more_and_never_less_than_one_run():
    curve = rdp_curve([StepEvent(0.02, 1.0, 500)])
    single, _ = rdp_privacy_accountant.compute_epsilon(ORDERS, curve, DELTA)
    for make in (lambda m: tnb(1, mean=m), lambda m: tnb(0, mean=m), lambda m: tnb(2, mean=m), poisson):
        eps = [tuned_epsilon(curve, ORDERS, DELTA, make(m)) for m in (1.5, 3.0, 10.0, 100.0)]
        assert all(a < b for a, b in zip(eps, eps[1:])), eps
        assert eps[0] >= single
    # A more private run gives a more private tune.
    loose = rdp_curve([StepEvent(0.02, 0.8, 500)])
    assert tuned_epsilon(loose, ORDERS, DELTA, tnb(1, mean=10)) > tuned_epsilon(curve, ORDERS, DELTA, tnb(1, mean=10))


def test_candidates_are_bounded_by_their_worst_curve():
    a = rdp_curve([StepEvent(0.02, 1.0, 500)])
    b = rdp_curve([StepEvent(0.2, 3.0, 100)])
    count = tnb(1, mean=10)
    both = tuned_epsilon([a, b], ORDERS, DELTA, count)
    assert both == tuned_epsilon(np.maximum(a, b), ORDERS, DELTA, count)
    assert both >= max(tuned_epsilon(a, ORDERS, DELTA, count), tuned_epsilon(b, ORDERS, DELTA, count))
    assert both == tuned_epsilon(np.stack([a, b]), ORDERS, DELTA, count)


@pytest.mark.parametrize("count", [
    {"distribution": "truncated_negative_binomial", "eta": 0, "mean": 5},
    {"distribution": "truncated_negative_binomial", "eta": 0.5, "mean": 5},
    {"distribution": "truncated_negative_binomial", "eta": 1, "gamma": 0.2},
    {"distribution": "truncated_negative_binomial", "eta": 3, "gamma": 0.4},
    {"distribution": "poisson", "mean": 5},
])
def test_sample_mean_matches_mean(count):
    dist = CandidateCount.from_mapping(count)
    rng = np_generator(0, "test-candidate-count")
    draws = np.array([dist.sample(rng) for _ in range(20000)])
    stderr = draws.std() / math.sqrt(draws.size)
    assert abs(draws.mean() - dist.mean) < 5 * stderr
    if dist.distribution != "poisson":
        assert draws.min() >= 1


def test_describe():
    assert tnb(1, mean=10).describe() == "the geometric distribution (η = 1, γ = 0.1)"
    assert tnb(0, gamma=0.05).describe() == "the logarithmic distribution (η = 0, γ = 0.05)"
    assert tnb(2.5, gamma=0.05).describe() == "a truncated negative binomial distribution (η = 2.5, γ = 0.05)"
    assert poisson(10).describe() == "a Poisson distribution (μ = 10)"


def test_mean_is_the_pmf_mean():
    # Definition 1: P[K=k] = (1−γ)^k / (γ^(−η) − 1) · Π_{ℓ<k} (ℓ+η)/(ℓ+1); η = 0: (1−γ)^k / (k log(1/γ)).
    for eta, gamma in [(0.0, 0.3), (0.5, 0.3), (2.0, 0.3)]:
        total = mean = 0.0
        weight = 1.0
        for k in range(1, 2000):
            if eta == 0.0:
                p = (1 - gamma) ** k / (k * math.log(1 / gamma))
            else:
                weight *= (k - 1 + eta) / k
                p = (1 - gamma) ** k / (gamma ** (-eta) - 1) * weight
            total += p
            mean += k * p
        assert total == pytest.approx(1.0, rel=1e-9)
        assert tnb(eta, gamma=gamma).mean == pytest.approx(mean, rel=1e-9)
    # Given the mean, γ is solved so that the mean is at least the one asked for (conservative).
    for eta in (0.0, 0.5, 2.0):
        got = tnb(eta, mean=7.0).mean
        assert 7.0 <= got <= 7.0 * (1 + 1e-9)


@pytest.mark.parametrize("mapping,key", [
    ({"distribution": "geometric"}, "distribution"),
    ({"distribution": "truncated_negative_binomial", "eta": -0.5, "gamma": 0.1}, "eta"),
    ({"distribution": "truncated_negative_binomial", "eta": 1, "gamma": 1.0}, "gamma"),
    ({"distribution": "truncated_negative_binomial", "eta": 1, "gamma": "x"}, "gamma"),
    ({"distribution": "truncated_negative_binomial", "eta": 1, "mean": 0.5}, "mean"),
    ({"distribution": "truncated_negative_binomial", "eta": 1, "mean": 5, "gamma": 0.2}, "gamma"),
    ({"distribution": "truncated_negative_binomial", "gamma": 0.2}, "eta"),
    ({"distribution": "poisson", "mean": 0.5}, "mean"),
    ({"distribution": "poisson", "mean": True}, "mean"),
    ({"distribution": "poisson", "mean": 3, "eta": 1}, "eta"),
    ({"distribution": "poisson", "mean": 3, "mu": 3}, "mu"),
])
def test_bad_parameters_name_the_key(mapping, key):
    with pytest.raises(ValueError) as info:
        CandidateCount.from_mapping(mapping, prefix="tune.candidates.")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"tune.candidates.{key} "), message


def test_bad_bound_inputs():
    count = tnb(1, mean=10)
    with pytest.raises(ValueError, match="orders"):
        tuned_rdp([1.0, 2.0], [2.0], count)
    with pytest.raises(ValueError, match="> 1"):
        tuned_rdp([1.0], [1.0], count)
    with pytest.raises(ValueError, match="delta"):
        tuned_epsilon(gaussian_curve(HAND_ORDERS), HAND_ORDERS, 0.0, count)
    with pytest.raises(ValueError, match="CandidateCount"):
        tuned_rdp(gaussian_curve(HAND_ORDERS), HAND_ORDERS, {"distribution": "poisson", "mean": 3})


def test_warmed_unit_curves_are_the_ones_max_rdp_curve_sums():
    from raysim.privacy.tuning import _unit_curve, curve_pairs, warm_unit_curves
    lists = [[StepEvent(0.25, 1.3, 40), StepEvent(1.0, 5.0, 2)], [StepEvent(0.1, 0.9, 100)]]
    _unit_curve.cache_clear()
    cold = max_rdp_curve(lists)
    _unit_curve.cache_clear()
    warm_unit_curves(curve_pairs(lists)).result()
    assert _unit_curve.cache_info().currsize == 3
    hits = _unit_curve.cache_info().hits
    np.testing.assert_array_equal(max_rdp_curve(lists), cold)
    assert _unit_curve.cache_info().hits == hits + 3   # summed from the warmed curves, none computed again


def test_orders_dp_accounting_leaves_out_are_inf_and_not_logged(caplog):
    # At q = 0.33, σ = 1.94 the series of the orders 1.1-1.8 does not converge: dp_accounting leaves
    # them out of the conversion (+inf) and warns once per order, which must not reach the console.
    from raysim.privacy.tuning import _unit_curve
    _unit_curve.cache_clear()
    with caplog.at_level("WARNING"):
        curve = rdp_curve([StepEvent(0.326531, 1.942755, 1)])
    assert np.isinf(curve[ORDERS.index(1.1)]) and np.isfinite(curve[ORDERS.index(2.0)])
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]
