"""Correlated-noise mechanisms: BLT and BandMF against the reference implementation's published values,
their closed forms against brute force, their streamed noise's covariance against their factorisations,
the amplified BandMF accounting against dp-accounting, and the degenerate settings that are the Gaussian
mechanism."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant

from raysim.privacy.accounting import StepEvent, compute_epsilon, pld_discretization_interval
from raysim.privacy.mechanisms.bandmf import (BandMFNoise, amplified_bandmf_event, amplified_steps, bandmf_loss,
                                              bandmf_sensitivity_squared, optimize_bandmf)
from raysim.privacy.mechanisms.blt import (BLT, BLTNoise, blt_max_error, blt_max_loss, blt_sensitivity_squared,
                                           optimize_blt)
from raysim.privacy.mechanisms.toeplitz import (inverse_coefs, materialize, minsep_sensitivity_squared,
                                                per_query_error, sqrt_coefs)
from raysim.privacy.population import prefix_noise, tree_nodes


def brute_max_loss(coefs: np.ndarray, n: int, min_sep: int = 1, participations: int | None = 1) -> float:
    """max error × sensitivity² from materialised matrices (the worst participation vector by enumeration)."""
    c = materialize(coefs, n)
    b = np.tril(np.ones((n, n))) @ np.linalg.inv(c)
    error = float(np.max(np.sum(b * b, axis=1)))
    k = math.ceil(n / min_sep) if participations is None else participations
    best = 0.0
    for start in range(n):   # non-increasing non-negative columns: the worst pattern is evenly spaced
        u = np.zeros(n)
        u[start::min_sep][:k] = 1.0
        best = max(best, float(np.sum((c @ u) ** 2)))
    return error * best


# --- the square-root factorisation and the Toeplitz algebra -----------------------------------------------

def test_square_root_factorisation_inverse_coefficients():
    assert np.allclose(inverse_coefs(sqrt_coefs(5), 5), [1, -1 / 2, -1 / 8, -1 / 16, -5 / 128], rtol=0, atol=1e-15)
    a = materialize(sqrt_coefs(8), 8)
    assert np.allclose(a @ a, np.tril(np.ones((8, 8))))


@pytest.mark.parametrize("min_sep, k", [(1, 1), (1, None), (3, 2), (4, None), (7, 3)])
def test_minsep_sensitivity_matches_brute_force(min_sep, k):
    c = np.sort(np.random.default_rng(min_sep).uniform(0, 1, 20))[::-1]
    brute = brute_max_loss(c, 20, min_sep, k) / float(np.max(per_query_error(inverse_coefs(c, 20), 20)))
    assert minsep_sensitivity_squared(c, 20, min_sep, k) == pytest.approx(brute, rel=1e-12)


# --- BLT --------------------------------------------------------------------------------------------------

def test_blt_inverse_and_closed_forms_match_materialised_matrices():
    blt = BLT.build([0.9, 0.5, 0.2], [0.2, 0.1, 0.05])
    n = 40
    assert np.allclose(blt.inverse().coefs(n), inverse_coefs(blt.coefs(n), n), atol=1e-13)
    assert blt_max_error(blt, n) == pytest.approx(per_query_error(inverse_coefs(blt.coefs(n), n), n)[-1], rel=1e-10)
    assert blt_max_loss(blt, n) == pytest.approx(brute_max_loss(blt.coefs(n), n), rel=1e-10)
    assert blt_sensitivity_squared(blt, n, 5, 3) * blt_max_error(blt, n) == pytest.approx(
        brute_max_loss(blt.coefs(n), n, 5, 3), rel=1e-10)


def test_blt_single_participation_golden():
    blt = optimize_blt(100_000, 2)
    assert np.allclose(blt.output_scale, [0.0122853238, 0.1878393665], rtol=1e-5, atol=0)
    assert np.allclose(blt.buf_decay, [0.9999528892, 0.9857068667], rtol=1e-5, atol=0)


@pytest.mark.parametrize("n, buffers, rtol", [(1_000, 2, 1.04), (10_000, 3, 1.03), (100_000, 4, 1.03)])
def test_blt_is_near_optimal(n, buffers, rtol):
    blt = optimize_blt(n, buffers)
    assert blt.buffers == buffers
    assert math.sqrt(blt_max_loss(blt, n)) <= rtol * (1 + math.log(n) / math.pi)


# BLTs published as optimised for n = 1000, 2 participations, min-separation 5.
PUBLISHED = {1: BLT.build([0.9877027559462715], [0.10595704738115597]),
             2: BLT.build([0.993433070819512, 0.6342644427247973], [0.07538320617916519, 0.5144060910151949])}


@pytest.mark.parametrize("buffers, participations, min_sep", [(2, 2, 5), (1, 4, 50)])
def test_blt_optimised_for_its_participation_beats_the_published_ones(buffers, participations, min_sep):
    n = 500
    blt = optimize_blt(n, buffers, min_sep, participations)
    ours = brute_max_loss(blt.coefs(n), n, min_sep, participations)
    assert ours <= 1.001 * brute_max_loss(PUBLISHED[buffers].coefs(n), n, min_sep, participations)
    assert ours == pytest.approx(blt_max_loss(blt, n, min_sep, participations), rel=1e-9)


# --- BandMF -----------------------------------------------------------------------------------------------

def test_bandmf_is_unit_norm_and_beats_the_banded_square_root_and_fewer_bands():
    n = 1000
    losses = []
    for bands in (1, 4, 16):
        c = optimize_bandmf(n, bands)
        assert c.shape == (bands,) and np.linalg.norm(c) == pytest.approx(1.0) and np.all(np.diff(c) <= 0)
        root = sqrt_coefs(bands)
        assert bandmf_loss(c, n) <= bandmf_loss(root / np.linalg.norm(root), n) * (1 + 1e-9)
        assert bandmf_loss(c, n) == pytest.approx(np.mean(per_query_error(inverse_coefs(c, n), n)), rel=1e-10)
        losses.append(bandmf_loss(c, n))
    assert losses[0] == pytest.approx((n + 1) / 2) and losses[0] > losses[1] > losses[2]


def test_bandmf_for_a_damped_workload_minimises_its_error_and_tends_to_independent_noise():
    n, bands = 60, 10
    prefix = optimize_bandmf(n, bands)
    assert np.array_equal(optimize_bandmf(n, bands, decay=0.0), prefix)
    for eta in (0.05, 0.3):
        c = optimize_bandmf(n, bands, decay=eta)
        assert np.linalg.norm(c) == pytest.approx(1.0) and np.all(c >= -1e-9) and np.all(np.diff(c) <= 1e-9)
        workload = materialize((1.0 - eta) ** np.arange(n), n)   # w_t = (1 − η) w_{t−1} + x_t
        b = workload @ np.linalg.inv(materialize(c, n))
        assert bandmf_loss(c, n, eta) == pytest.approx(np.mean(np.sum(b * b, axis=1)), rel=1e-9)
        assert bandmf_loss(c, n, eta) < 0.99 * bandmf_loss(prefix, n, eta)
    # a workload that forgets almost everything each round is the identity: one band is optimal
    assert np.allclose(optimize_bandmf(n, bands, decay=0.99)[1:], 0.0, atol=0.01)


def test_workload_decay_is_refused_for_a_mechanism_without_a_strategy():
    from raysim.config import ConfigError, config_from_dict
    base = {"method": "fedavg", "num_clients": 100, "clients_per_round": 10, "participation": "poisson",
            "privacy": {"unit": "client", "epsilon": 8.0}}
    with pytest.raises(ConfigError, match="'privacy.workload_decay': shapes the strategy of privacy.mechanism=bandmf"):
        config_from_dict({**base, "privacy": {**base["privacy"], "workload_decay": 0.1}})
    with pytest.raises(ConfigError, match=r"'privacy.workload_decay': must be in \[0, 1\)"):
        config_from_dict({**base, "privacy": {**base["privacy"], "mechanism": "bandmf", "workload_decay": 1.0}})
    cfg = config_from_dict({**base, "privacy": {**base["privacy"], "mechanism": "bandmf", "workload_decay": 0.1}})
    assert cfg.privacy.workload_decay == 0.1


def test_bandmf_at_large_n_is_quick_and_b_min_separation_sensitivity_counts_participations():
    c = optimize_bandmf(100_000, 8)
    assert bandmf_sensitivity_squared(c, 100_000, min_sep=8, participations=None) == pytest.approx(100_000 / 8)
    assert bandmf_sensitivity_squared(c, 64, min_sep=8, participations=3) == pytest.approx(3.0)
    assert bandmf_sensitivity_squared(c, 64, min_sep=4, participations=3) > 3.0   # closer than the bands: overlap


def test_amplified_bandmf_accounting_agrees_with_dp_accounting():
    """A worked example: 1,000 steps, 10 bands, q = 0.02 within each group, σ = 1.1, δ = 1e-6. raysim's
    accountant composes the StepEvents of the ⌈n / b⌉ participations of one group; dp-accounting's PLD
    composes the events of the mechanism directly."""
    sigma, n, bands, q, delta = 1.1, 1000, 10, 0.02, 1e-6
    ours = compute_epsilon([StepEvent(q, sigma, amplified_steps(n, bands))], delta, "pld")
    acc = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=pld_discretization_interval([StepEvent(q, sigma, 100)]))
    acc.compose(amplified_bandmf_event(sigma, n, bands, q))
    assert amplified_steps(n, bands) == 100
    assert ours == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    # one band is DP-SGD: n Poisson-subsampled Gaussian steps
    one = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=pld_discretization_interval([StepEvent(q, sigma, n)]))
    one.compose(amplified_bandmf_event(sigma, n, 1, q))
    dpsgd = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=pld_discretization_interval([StepEvent(q, sigma, n)]))
    dpsgd.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), n))
    assert one.get_epsilon(delta) == pytest.approx(dpsgd.get_epsilon(delta), rel=1e-12)
    assert ours < one.get_epsilon(delta)


# --- streamed noise: covariance and degenerate settings ---------------------------------------------------

STEPS, DRAWS = 6, 40_000


def _streamed(noise, seed: int = 0) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([noise.step(torch.randn(DRAWS, generator=gen, dtype=torch.float64))
                        for _ in range(STEPS)]).numpy()


def _covariance_matches(draws: np.ndarray, claimed: np.ndarray) -> bool:
    """The sample covariance of ``draws`` (steps × independent draws) is within five standard errors of
    ``claimed`` everywhere (the standard error of a Gaussian sample covariance: √((Σ_ii Σ_jj + Σ_ij²)/m))."""
    m = draws.shape[1]
    se = np.sqrt((np.outer(np.diag(claimed), np.diag(claimed)) + claimed ** 2) / m)
    return bool(np.all(np.abs(draws @ draws.T / m - claimed) <= 5 * se))


def _claimed(coefs: np.ndarray) -> np.ndarray:
    inv = materialize(inverse_coefs(coefs, STEPS), STEPS)
    return inv @ inv.T


@pytest.mark.parametrize("kind", ["blt", "bandmf"])
def test_streamed_noise_has_the_factorisations_covariance(kind):
    if kind == "blt":
        blt = BLT.build([0.95, 0.6], [0.1, 0.3])
        noise, coefs = BLTNoise(blt, DRAWS), blt.coefs(STEPS)
    else:
        coefs = optimize_bandmf(50, 3)
        noise = BandMFNoise(coefs, DRAWS)
    w = _streamed(noise)
    assert _covariance_matches(w, _claimed(coefs))
    assert not _covariance_matches(w, np.eye(STEPS))          # it is not independent noise
    # the stream is exactly C⁻¹ z, and resuming from the state gives the same next values
    gen = torch.Generator().manual_seed(0)
    z = torch.stack([torch.randn(DRAWS, generator=gen, dtype=torch.float64) for _ in range(STEPS)]).numpy()
    assert np.allclose(w, materialize(inverse_coefs(coefs, STEPS), STEPS) @ z, atol=1e-10)


def test_stream_state_resumes_bit_for_bit():
    blt = BLT.build([0.95, 0.6], [0.1, 0.3])
    for make in (lambda: BLTNoise(blt, 8), lambda: BandMFNoise(np.array([0.8, 0.5, 0.33]), 8)):
        zs = [torch.randn(8, generator=torch.Generator().manual_seed(t), dtype=torch.float64) for t in range(5)]
        whole = make()
        out = [whole.step(z) for z in zs]
        first = make()
        for z in zs[:3]:
            first.step(z)
        resumed = make()
        resumed.load_state_dict(first.state_dict())
        assert all(torch.equal(resumed.step(z), o) for z, o in zip(zs[3:], out[3:]))


def test_tree_noise_has_its_node_sharing_covariance():
    std = 1.0
    prefixes = np.stack([prefix_noise(3, 0, p, std, DRAWS).numpy() for p in range(1, STEPS + 1)])
    shared = np.array([[len(set(tree_nodes(s)) & set(tree_nodes(t))) for t in range(1, STEPS + 1)]
                       for s in range(1, STEPS + 1)], dtype=float)
    assert _covariance_matches(prefixes, std ** 2 * shared)


def test_degenerate_settings_are_the_gaussian_mechanism():
    z = torch.randn(STEPS, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    blt, band = BLTNoise(BLT.build([], []), 16), BandMFNoise(np.ones(1), 16)
    assert all(torch.equal(blt.step(zt), zt) and torch.equal(band.step(zt), zt) for zt in z)
    assert optimize_blt(100, 0).buffers == 0 and np.array_equal(optimize_bandmf(100, 1), [1.0])
    assert blt_sensitivity_squared(BLT.build([], []), 100) == 1.0
    # a tree of one leaf per pass: every release gets fresh N(0, std²), independent across passes
    draws = np.stack([prefix_noise(5, p, 1, 2.0, DRAWS).numpy() for p in range(STEPS)])
    assert _covariance_matches(draws, 4.0 * np.eye(STEPS))


def test_fixed_size_rounds_compose_one_rounds_curve_as_dp_accounting_composes_the_event():
    """Rounds on fixed-size cohorts (replace-one, σ/2): r rounds are r times one round's cached RDP curve,
    which gives dp-accounting's own ε of the self-composed SampledWithoutReplacement event exactly."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant
    from raysim.privacy.mechanisms.builtin import independent_epsilon
    multipliers = [1.2] * 30 + [0.9] * 10
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        500, 25, dp_accounting.GaussianDpEvent(m / 2.0)), c) for m, c in ((0.9, 10), (1.2, 30))]
    reference = rdp_privacy_accountant.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    reference.compose(dp_accounting.ComposedDpEvent(events))
    assert independent_epsilon("uniform", 500, 25, multipliers, 1e-5, "rdp") == pytest.approx(
        reference.get_epsilon(1e-5), rel=1e-12)


def test_blt_grown_start_without_logits_is_skipped(recwarn):
    # at n = 6, G = 2 the one-buffer BLT has ω ≈ θ: its grown start's inverse has a decay ≤ 0, no logit
    one = optimize_blt(6, 1, 2, None)
    two = optimize_blt(6, 2, 2, None, init=one)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert np.all((two.buf_decay > 0) & (two.buf_decay <= 1))
    assert blt_max_loss(two, 6, 2, None) <= blt_max_loss(one, 6, 2, None) * (1 + 1e-9)
