"""The statistics of a one-run privacy audit (Steinke, Nasr & Jagielski 2023, "Privacy auditing with
one (1) training run", NeurIPS 2023, their Theorem 3.1 / Algorithm 1's p-value).

m canaries are each included independently with probability 1/2; the auditor guesses in/out for r
of them and gets v right. Under (ε, δ)-DP the number of correct guesses is at most as large as
Binomial(r, e^ε/(1 + e^ε)) except for a term that grows with δ, so an observed v that would be
improbable under ε is evidence that the mechanism is not ε-DP. The lower bound is the largest ε
rejected at the given confidence. Pure numerics (scipy), no torch.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

__all__ = ["audit_p_value", "epsilon_lower_bound"]


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
