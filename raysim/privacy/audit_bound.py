"""The statistics of a one-run privacy audit.

m canaries are each included independently with probability 1/2; the auditor guesses in/out for r
of them and gets v right.

* Steinke, Nasr & Jagielski 2023 ("Privacy auditing with one (1) training run", NeurIPS 2023, their
  Theorem 3.1 / Algorithm 1's p-value): under (ε, δ)-DP the number of correct guesses is at most as
  large as Binomial(r, e^ε/(1 + e^ε)) except for a term that grows with δ, so an observed v that would
  be improbable under ε is evidence that the mechanism is not ε-DP.
* Mahloujifar, Melis & Chaudhuri 2024 ("Auditing f-differential privacy in one run"): the same
  experiment judged against the whole trade-off curve of the Gaussian mechanism that is (ε, δ)-DP
  instead of against (ε, δ) alone, which bounds the correct guesses more tightly and so refutes
  larger ε from the same scores.

Each lower bound is the largest ε rejected at the given significance. :func:`score_audit` chooses
the guesses from the scores as jax_privacy's auditing library does (one-sided guesses, Bonferroni over
every threshold on the ROC curve's concave frontier). Pure numerics (scipy, dp-accounting), no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import dp_accounting
import numpy as np
from scipy import optimize, special, stats

__all__ = ["audit_p_value", "epsilon_lower_bound", "ScoreAudit", "frontier_counts", "fdp_margin", "score_audit",
           "score_audit_ceiling", "epsilon_two_gaussians"]


def audit_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[≥ v correct of r guesses] for an (ε, δ)-DP mechanism with m canaries (an upper bound)."""
    if not (0 <= v <= r <= m) or epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need 0 <= v <= r <= m, epsilon >= 0, delta in [0, 1]; got {m}, {r}, {v}, {epsilon}, {delta}")
    accuracy = 1.0 / (1.0 + math.exp(-epsilon))     # ε-DP randomised response's accuracy
    tail = float(stats.binom.sf(v - 1, r, accuracy))  # P[Binomial(r, accuracy) >= v]
    # The δ term: the largest average, over i = 1..v, of P[v - i <= Binomial < v] / i, times 2mδ.
    worst = 0.0
    if v > 0:
        below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, accuracy))   # i = 1..v
        worst = float(np.max(below / np.arange(1, v + 1)))
    return min(1.0, tail + 2.0 * m * delta * worst)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε whose (ε, δ)-DP null hypothesis is rejected at ``confidence`` (0 if none is)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    if r == 0 or audit_p_value(m, r, v, 0.0, delta) > alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while audit_p_value(m, r, v, hi, delta) <= alpha:   # the p-value grows with ε
        lo, hi = hi, 2 * hi
        if hi > 100:
            return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        if audit_p_value(m, r, v, mid, delta) <= alpha:
            lo = mid
        else:
            hi = mid
    return lo


# --------------------------------------------------------------------------- guesses chosen on the scores

@dataclass(frozen=True)
class ScoreAudit:
    """The one-run bounds from canaries' membership scores (:func:`score_audit`)."""

    epsilon_steinke: float         # Steinke, Nasr & Jagielski 2023
    epsilon_fdp: float             # Mahloujifar, Melis & Chaudhuri 2024
    canaries: int
    members: int
    thresholds: int                # frontier thresholds the significance is divided among (Bonferroni)
    guesses: int                   # one-sided guesses at the threshold that gave the f-DP bound
    correct: int


def frontier_counts(member_scores, other_scores) -> tuple[np.ndarray, np.ndarray]:
    """(true positives, false positives) of guessing "in" every canary scoring at or above a threshold, at
    each threshold whose (false negatives, true negatives) is a vertex of the concave frontier of those
    points over every threshold (each distinct score, and one above them all). A threshold off the
    frontier is beaten by a random mix of two on it, so only the frontier's are tried."""
    inside, outside = np.sort(np.asarray(member_scores, float)), np.sort(np.asarray(other_scores, float))
    if inside.ndim != 1 or outside.ndim != 1 or not len(inside) or not len(outside):
        raise ValueError("need a non-empty 1-D array of member scores and one of non-member scores")
    cuts = np.append(np.union1d(inside, outside), np.inf)
    fn = np.searchsorted(inside, cuts, side="left")
    tn = np.searchsorted(outside, cuts, side="left")
    hull: list[int] = []
    for i in range(len(cuts)):          # the upper hull, left to right, without collinear vertices
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (tn[b] - tn[a]) * (fn[i] - fn[b]) - (tn[i] - tn[b]) * (fn[b] - fn[a]) > 0:
                break
            hull.pop()
        hull.append(i)
    keep = np.array(hull)
    return len(inside) - fn[keep], len(outside) - tn[keep]


def _steinke_margin(m: int, guesses: int, correct: int, epsilon: float, delta: float, alpha: float) -> float:
    """α − p-value: positive when the guesses refute (ε, δ)-DP at level α."""
    return alpha - audit_p_value(m, guesses, correct, epsilon, delta)


def _gaussian_blow_up_inverse(epsilon: float, delta: float) -> Callable[[float], float]:
    """x ↦ Φ(Φ⁻¹(x) − 1/σ), σ that of the Gaussian mechanism (sensitivity 1) that is exactly (ε, δ)-DP:
    the smallest error rate of one kind its trade-off curve allows at error rate 1 − x of the other."""
    sigma = dp_accounting.get_sigma_gaussian(epsilon, delta)
    if sigma == 0:
        return lambda x: float(x >= 1.0)
    shift = 1.0 / sigma
    return lambda x: float(special.ndtr(special.ndtri(x) - shift))


def fdp_margin(m: int, guesses: int, correct: int, epsilon: float, delta: float, alpha: float) -> float:
    """Mahloujifar et al.'s test of (ε, δ)-DP through the Gaussian trade-off curve that is (ε, δ)-DP:
    positive when ``correct`` of ``guesses`` one-sided guesses over m canaries refute it at level α.
    From the α-scaled masses of right and wrong guesses, the curve forces more wrong-guess mass for
    the right-guess mass, one correct guess at a time (the i-th adding i/(guesses − i) of the increase
    to the right-guess mass); the claim is refuted when the two masses exceed the guessed fraction."""
    if guesses == 0:
        return -1.0
    blow_up = _gaussian_blow_up_inverse(epsilon, delta)
    right, wrong = alpha * correct / m, alpha * (guesses - correct) / m
    for i in range(correct - 1, -1, -1):
        raised = max(wrong, blow_up(right))
        if raised == wrong:          # nothing moves again
            break
        right = min(right + i / (guesses - i) * (raised - wrong), 1.0)
        wrong = raised
    return right + wrong - guesses / m


def _largest_refuted(margin: Callable[[float], float], start: float) -> float:
    """The largest ε ≥ ``start`` with margin(ε) > 0 (the margin falls with ε); ``start`` if none."""
    if margin(start) <= 0:
        return start
    lo, hi = start, max(1.0, 2 * start)
    while margin(hi) > 0:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            return lo
    return float(optimize.brentq(margin, lo, hi, xtol=1e-9))


def score_audit(member_scores, other_scores, delta: float, significance: float = 0.05) -> ScoreAudit:
    """Both one-run bounds from the canaries' scores (higher: more likely a member), at confidence
    1 − ``significance`` each: the threshold is chosen among :func:`frontier_counts`'s, each tried at
    ``significance`` over their number (Bonferroni), so the bound holds whichever one wins."""
    if not 0 < significance < 1 or not 0 < delta <= 1:
        raise ValueError(f"need significance in (0, 1) and delta in (0, 1]; got {significance}, {delta}")
    tp, fp = frontier_counts(member_scores, other_scores)
    members, m = int(tp.max()), int(tp.max() + fp.max())
    alpha = significance / len(tp)
    guesses, correct = tp + fp, tp
    order = np.argsort(-(correct / np.maximum(guesses, 1)), kind="stable")   # the most precise first
    bounds, at = [], (0, 0)
    for margin in (_steinke_margin, fdp_margin):
        best = 0.0
        for i in order:
            g, c = int(guesses[i]), int(correct[i])
            # a precision at or below e^ε/(1 + e^ε) cannot refute ε, nor anything above it
            if g == 0 or c / g <= special.expit(best):
                continue
            found = _largest_refuted(lambda e: margin(m, g, c, e, delta, alpha), best)
            if found > best:
                best, at = found, (g, c)
        bounds.append(best)
    return ScoreAudit(bounds[0], bounds[1], m, members, len(tp), *at)


def score_audit_ceiling(canaries: int, delta: float, significance: float = 0.05) -> ScoreAudit:
    """:func:`score_audit` of ``canaries`` canaries, half of them members, every member scoring above every
    non-member: the largest bounds an audit with that many canaries can report (no claim above them can
    be refuted by it)."""
    half = canaries // 2
    return score_audit(np.ones(half), np.zeros(canaries - half), delta, significance)


# --------------------------------------------------------------------------- the one-shot estimate

def _mass(lo: float, hi: float, mean: float, std: float) -> float:
    """P[lo < Y < hi] for Y ~ N(mean, std²), from the tail on the far side of the mean (no cancellation)."""
    if hi <= mean:
        return float(stats.norm.cdf(hi, mean, std) - stats.norm.cdf(lo, mean, std))
    if lo >= mean:
        return float(stats.norm.sf(lo, mean, std) - stats.norm.sf(hi, mean, std))
    return float(1.0 - stats.norm.cdf(lo, mean, std) - stats.norm.sf(hi, mean, std))


def _delta_one_way(mu1: float, std1: float, mu2: float, std2: float, epsilon: float) -> float:
    """δ(ε) of telling P = N(mu1, std1²) from Q = N(mu2, std2²): P[L > ε] − e^ε Q[L > ε], L = log dP/dQ.
    L(y) = a y² + b y + c is a quadratic in y, so {L > ε} is a half-line, an interval or the outside of one."""
    a = 0.5 * (std2 ** -2 - std1 ** -2)
    b = mu1 / std1 ** 2 - mu2 / std2 ** 2
    c = 0.5 * ((mu2 / std2) ** 2 - (mu1 / std1) ** 2) + math.log(std2) - math.log(std1)
    if a == 0:
        if b == 0:
            return 0.0                            # P = Q
        cut = (epsilon - c) / b
        region = [(cut, math.inf)] if b > 0 else [(-math.inf, cut)]
    else:
        disc = b * b - 4 * a * (c - epsilon)
        if disc <= 0:                             # L − ε keeps the sign of a everywhere: both masses 0 or 1
            return 0.0
        lo, hi = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
        region = [(-math.inf, lo), (hi, math.inf)] if a > 0 else [(lo, hi)]
    p = sum(_mass(x, y, mu1, std1) for x, y in region)
    q = sum(_mass(x, y, mu2, std2) for x, y in region)
    if q == 0.0:
        return p
    return max(0.0, p - math.exp(min(epsilon + math.log(q), 700.0)))


def epsilon_two_gaussians(mu1: float, std1: float, mu2: float, std2: float, delta: float) -> float:
    """The ε at δ of telling N(mu1, std1²) from N(mu2, std2²), the larger of the two directions: Andrew et al.
    (ICLR 2024, "One-shot empirical privacy estimation for federated learning")'s one-shot estimate, with
    the members' and the non-members' canary statistics each fitted by a Gaussian of its own mean and
    standard deviation (an estimate, not a bound)."""
    if not (std1 > 0 and std2 > 0) or not 0 < delta < 1:
        raise ValueError(f"need positive standard deviations and delta in (0, 1); got {std1}, {std2}, {delta}")

    def excess(eps: float) -> float:
        return max(_delta_one_way(mu1, std1, mu2, std2, eps), _delta_one_way(mu2, std2, mu1, std1, eps)) - delta

    if excess(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        lo, hi = hi, hi * 10
        if hi > 1e6:
            return math.inf
    return float(optimize.brentq(excess, lo, hi, xtol=1e-10))
