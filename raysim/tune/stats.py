"""Intervals over seeds: Student's t, paired differences, and their family-wise adjustment."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, sample std, CI low, CI high): Student's t interval over the seeds (NaN-free input;
    the interval is NaN for fewer than 2 values)."""
    from scipy import stats
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (math.nan,) * 4
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan, math.nan
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * std / math.sqrt(x.size)
    return mean, std, mean - half, mean + half


#: Family-wise adjustments of a tune's paired comparisons (``paired_comparisons``).
ADJUSTMENTS = ("bonferroni", "holm")


def paired_t(diffs: Sequence[float]) -> tuple[float, float]:
    """(t statistic, two-sided p-value) of Student's paired t-test of mean difference 0 (NaN for < 2 values;
    p = 0 or 1 for differences without spread)."""
    from scipy import stats
    x = np.asarray(diffs, dtype=np.float64)
    if x.size < 2:
        return math.nan, math.nan
    se = float(x.std(ddof=1)) / math.sqrt(x.size)
    mean = float(x.mean())
    if se == 0.0:
        return (math.copysign(math.inf, mean), 0.0) if mean != 0.0 else (0.0, 1.0)
    t = mean / se
    return t, float(2.0 * stats.t.sf(abs(t), x.size - 1))


def adjust_p(pvalues: Sequence[float], method: str = "holm") -> list[float]:
    """Family-wise adjusted p-values, as ``statsmodels.stats.multitest.multipletests`` computes them.

    ``bonferroni``: min(1, m·p). ``holm`` (step-down): sorted p_(1) ≤ … ≤ p_(m), adjusted
    p̃_(i) = max over j ≤ i of min(1, (m − j + 1)·p_(j)). NaN entries are left out of the family."""
    if method not in ADJUSTMENTS:
        raise ValueError(f"unknown adjustment {method!r}; choose one of {', '.join(ADJUSTMENTS)}")
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out.tolist()
    if method == "bonferroni":
        out[ok] = np.minimum(1.0, m * p[ok])
        return out.tolist()
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for rank, idx in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[idx]))
        out[idx] = running
    return out.tolist()


def bonferroni_ci(diffs: Sequence[float], family: int, level: float = 0.95) -> tuple[float, float]:
    """Simultaneous interval of the mean difference for a family of ``family`` comparisons: Student's t
    interval at level 1 − (1 − ``level``)/``family`` (Bonferroni). It excludes 0 exactly when the
    Bonferroni-adjusted p-value of :func:`paired_t` is below 1 − ``level``."""
    if family < 1:
        raise ValueError(f"family must be >= 1, got {family}")
    _, _, lo, hi = mean_ci(diffs, 1.0 - (1.0 - level) / family)
    return lo, hi


def objective_se(values: Sequence[float], holdout: int | None = None) -> float:
    """Standard error of a candidate's objective, the mean of ``values`` over its tuning seeds.

    Two sources of noise: the seeds (their sample variance) and the finite hold-out of ``holdout`` images,
    whose binomial variance p(1 − p)/n bounds an accuracy's from below for a single seed. The SE is
    sqrt(max(s², p(1 − p)/n) / S) over S seeds (s² = 0 for one seed); NaN without values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or not np.all(np.isfinite(x)):
        return math.nan
    var = float(x.var(ddof=1)) if x.size > 1 else 0.0
    if holdout:
        p = min(max(float(x.mean()), 0.0), 1.0)
        var = max(var, p * (1.0 - p) / holdout)
    return math.sqrt(var / x.size)
