"""The one-run audit's statistics (Steinke, Nasr & Jagielski 2023), checked against closed forms."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from raysim.privacy.audit_bound import audit_p_value, epsilon_lower_bound


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
