"""The one-run audit's statistics (Steinke, Nasr & Jagielski 2023; Mahloujifar et al. 2024), checked against
closed forms and against jax_privacy's published test values."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from raysim.privacy.audit_bound import (audit_p_value, epsilon_lower_bound, epsilon_two_gaussians, fdp_margin, frontier_counts, score_audit,
                                        score_audit_ceiling)


@pytest.mark.parametrize("r", [50, 200, 1000])
def test_all_guesses_right_without_delta_matches_the_binomial_closed_form(r):
    # With δ = 0, P[all r right] = p^r with p = e^ε/(1+e^ε): the bound solves p^r = 0.05.
    p = 0.05 ** (1 / r)
    assert epsilon_lower_bound(r, r, r, 0.0) == pytest.approx(math.log(p / (1 - p)), rel=1e-6)


def test_p_value_is_the_binomial_tail_plus_a_delta_term():
    m, r, v, eps = 1000, 200, 150, 1.0
    tail = stats.binom.sf(v - 1, r, 1 / (1 + math.exp(-eps)))
    assert audit_p_value(m, r, v, eps, 0.0) == pytest.approx(tail, rel=1e-12)
    assert tail < audit_p_value(m, r, v, eps, 1e-5) < tail + 2 * m * 1e-5


def test_chance_level_guessing_proves_nothing_and_the_bound_grows_with_correct_guesses():
    assert epsilon_lower_bound(1000, 200, 100, 1e-5) == 0.0
    bounds = [epsilon_lower_bound(1000, 200, v, 1e-5) for v in (130, 160, 190, 200)]
    assert bounds == sorted(bounds) and bounds[0] > 0


def test_bad_counts_are_value_errors():
    with pytest.raises(ValueError):
        audit_p_value(10, 20, 5, 1.0, 1e-5)


@pytest.mark.parametrize("v", [1, 37, 150])
def test_delta_term_is_the_largest_average_of_the_lower_tail(v):
    m, r, eps, delta = 1000, 200, 0.7, 1e-5
    acc = 1 / (1 + math.exp(-eps))
    worst = max(sum(stats.binom.pmf(v - j, r, acc) for j in range(1, i + 1)) / i for i in range(1, v + 1))
    want = stats.binom.sf(v - 1, r, acc) + 2 * m * delta * worst
    assert audit_p_value(m, r, v, eps, delta) == pytest.approx(want, rel=1e-10)


def _normal_quantiles(shift: float, n: int) -> np.ndarray:
    """n scores at the midpoints of n equal-probability slices of N(shift, 1): deterministic normal scores."""
    return stats.norm.ppf((np.arange(n) + 0.5) / n) + shift


# jax_privacy's auditing tests: 10,000 member scores ~ N(shift, 1) and 10,000 non-member scores ~ N(0, 1) at
# deterministic quantiles, significance 0.05, δ = 1e-6, one-sided guesses with Bonferroni over the thresholds.
@pytest.mark.parametrize("shift, steinke, fdp", [(1, 1.13346, 2.164749), (2, 2.311945, 4.7218075),
                                                 (4, 4.395568, 9.133752)])
def test_score_audit_matches_the_published_reference_values(shift, steinke, fdp):
    found = score_audit(_normal_quantiles(shift, 10_000), _normal_quantiles(0, 10_000), delta=1e-6, significance=0.05)
    assert found.epsilon_steinke == pytest.approx(steinke, rel=1e-5)
    assert found.epsilon_fdp == pytest.approx(fdp, rel=1e-5)
    assert found.canaries == 20_000 and found.members == 10_000 and found.correct <= found.guesses


def test_identical_scores_refute_nothing():
    found = score_audit(_normal_quantiles(0, 500), _normal_quantiles(0, 500), delta=1e-5)
    assert found.epsilon_steinke == 0.0 and found.epsilon_fdp == 0.0


def test_frontier_counts_keep_the_concave_vertices_only():
    # members 3, 4; non-members 1, 2: guessing at 3 is perfect; the thresholds 2 and 4 lie on the straight
    # segments of the curve and are dropped.
    tp, fp = frontier_counts(np.array([3.0, 4.0]), np.array([1.0, 2.0]))
    assert list(zip(tp.tolist(), fp.tolist())) == [(2, 2), (2, 0), (0, 0)]


def test_ceiling_is_every_member_above_every_non_member_and_grows_with_the_canaries():
    small, large = score_audit_ceiling(1000, 1e-5), score_audit_ceiling(10_000, 1e-5)
    assert small.thresholds == 3 and small.guesses == small.correct == 500
    assert 0 < small.epsilon_steinke < small.epsilon_fdp < large.epsilon_fdp
    assert small.epsilon_fdp > 8.0   # the default canary-client count can refute ε = 8 with the f-DP bound


def test_fdp_test_refutes_less_as_epsilon_grows():
    margins = [fdp_margin(1000, 100, 95, e, 1e-5, 0.05) for e in (0.5, 1.0, 2.0, 4.0, 8.0)]
    assert margins[0] > 0 > margins[-1] and all(a >= b for a, b in zip(margins, margins[1:]))


# (mu1, std1, mu2, std2, delta) -> ε, computed with the formulas of Andrew et al.'s reference implementation
# (`epsilon_two_gaussians` in google-research/federated's one_shot_epe, log-domain masses).
@pytest.mark.parametrize("args, expected", [
    ((0.0, 1.0, 1.0, 1.0, 1e-5), 4.377178095681137),
    ((1.0, 1.0, 0.0, 1.0, 1e-5), 4.377178095681137),
    ((0.0, 1.0, 1.0, 1.5, 1e-5), 17.09030650197908),
    ((0.0, 1.0, 1.0, 0.7, 1e-5), 18.071729525315803),
    ((0.01, 0.011, 0.0, 0.010, 1e-6), 7.4891626935585665),
    ((0.0, 0.02, 0.004, 0.025, 1e-5), 5.401416935587499),
    ((0.0, 1.0, 0.1, 1.0, 1e-5), 0.34066936468432835),
])
def test_two_gaussians_matches_the_reference_formulas(args, expected):
    assert epsilon_two_gaussians(*args) == pytest.approx(expected, rel=1e-8)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 5.0])
def test_two_gaussians_with_one_std_is_the_gaussian_mechanism(epsilon):
    sigma = dp_accounting.get_sigma_gaussian(epsilon, 1e-5)
    assert epsilon_two_gaussians(0.0, sigma, 1.0, sigma, 1e-5) == pytest.approx(epsilon, rel=1e-6)
    assert epsilon_two_gaussians(3.0, 2 * sigma, 5.0, 2 * sigma, 1e-5) == pytest.approx(epsilon, rel=1e-6)
