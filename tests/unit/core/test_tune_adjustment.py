"""Family-wise adjustment of a tune's paired comparisons: against statsmodels and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from raysim.tune.stats import adjust_p, bonferroni_ci, paired_t

P = [0.01, 0.04, 0.03, 0.20, 0.005, 0.5, 0.012, 0.9]


@pytest.mark.parametrize("method", ["bonferroni", "holm"])
def test_adjusted_p_values_match_statsmodels(method):
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    _, expected, _, _ = multitest.multipletests(P, alpha=0.05, method=method)
    assert adjust_p(P, method) == pytest.approx(list(expected), rel=1e-12)


def test_holm_by_hand():
    # sorted: 0.01 (×3 = 0.03), 0.02 (×2 = 0.04), 0.04 (×1 = 0.04); back in input order
    assert adjust_p([0.04, 0.01, 0.02], "holm") == pytest.approx([0.04, 0.03, 0.04])
    assert adjust_p([0.04, 0.01, 0.02], "bonferroni") == pytest.approx([0.12, 0.03, 0.06])
    assert adjust_p([0.6, math.nan], "bonferroni")[0] == 0.6 and math.isnan(adjust_p([0.6, math.nan])[1])
    with pytest.raises(ValueError, match="unknown adjustment"):
        adjust_p(P, "fdr")


def test_bonferroni_interval_by_hand_and_dual_to_the_adjusted_test():
    d = np.array([0.10, 0.02, 0.18, 0.05, 0.16])          # five seeds' paired differences
    m = 8
    half = stats.t.ppf(1 - 0.05 / (2 * m), d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    assert bonferroni_ci(d, m) == pytest.approx((d.mean() - half, d.mean() + half))
    lo1, hi1 = bonferroni_ci(d, 1)
    assert (lo1, hi1) == pytest.approx(tuple(stats.ttest_1samp(d, 0.0).confidence_interval(0.95)))
    t, p = paired_t(d)
    assert p == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue)
    for family in (1, 2, 8, 30):
        lo, _ = bonferroni_ci(d, family)
        assert (lo > 0) == (min(1.0, family * p) < 0.05)
