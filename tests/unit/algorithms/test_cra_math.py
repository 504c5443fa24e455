"""CRA maths: the capped-simplex projection against a QP solver, and a hand-computed CRA round."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from raysim.algorithms.cra_math import CRAResult, cra_weights, ema, project_capped_simplex


def qp_projection(v: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """min ||p - v||^2 s.t. sum p = 1, 0 <= p <= upper, solved by SLSQP at tight tolerance."""
    res = minimize(
        lambda p: float(np.sum((p - v) ** 2)),
        x0=upper / upper.sum(),
        jac=lambda p: 2.0 * (p - v),
        bounds=list(zip(np.zeros_like(upper), upper)),
        constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1.0, "jac": lambda p: np.ones_like(p)}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 1000},
    )
    # Status 8 ("positive directional derivative in linesearch") is SLSQP stalling at the optimum under
    # ftol = 1e-14; the comparison at 1e-6 below still judges the point, and feasibility is checked here.
    assert res.status in (0, 8), res.message
    assert abs(res.x.sum() - 1.0) < 1e-9 and np.all(res.x >= -1e-12) and np.all(res.x <= upper + 1e-12)
    return res.x


@st.composite
def projection_cases(draw):
    n = draw(st.integers(2, 20))
    v = np.array(draw(st.lists(st.floats(-2.0, 2.0), min_size=n, max_size=n)))
    raw = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    assume(raw.sum() > 1e-3)
    # sum(upper) = 1 makes P a single point, degenerate for a QP solver; test_projection_hand_cases covers it.
    total = draw(st.floats(1.001, float(n)))
    upper = raw * (total / raw.sum())
    assume(upper.sum() >= 1.0)
    return v, upper


def assert_in_capped_simplex(p: np.ndarray, upper: np.ndarray) -> None:
    assert abs(p.sum() - 1.0) <= 1e-9
    assert np.all(p >= 0.0)
    assert np.all(p <= upper)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(projection_cases())
def test_projection_matches_qp_solver(case):
    v, upper = case
    p = project_capped_simplex(v, upper)
    assert_in_capped_simplex(p, upper)
    np.testing.assert_allclose(p, qp_projection(v, upper), atol=1e-6)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(projection_cases())
def test_projection_is_idempotent(case):
    v, upper = case
    p = project_capped_simplex(v, upper)
    np.testing.assert_allclose(project_capped_simplex(p, upper), p, atol=1e-12)
    inside = upper / upper.sum()  # a point of P built directly: sums to 1, and <= upper as sum(upper) >= 1
    np.testing.assert_allclose(project_capped_simplex(inside, upper), inside, atol=1e-12)


def test_projection_hand_cases():
    # Plain simplex (caps inactive): v = [0.5, 0.5, 0.5] shifts by tau = 1/6 to 1/3 each.
    np.testing.assert_allclose(project_capped_simplex(np.array([0.5, 0.5, 0.5]), np.ones(3)), [1 / 3] * 3)
    # Cap binds: v = [2, 0, 0], upper = [0.5, 1, 1] -> p1 = 0.5, the rest 0.25 each.
    np.testing.assert_allclose(project_capped_simplex(np.array([2.0, 0.0, 0.0]), np.array([0.5, 1.0, 1.0])),
                               [0.5, 0.25, 0.25])
    # Zero cap forces a coordinate to zero.
    np.testing.assert_allclose(project_capped_simplex(np.array([5.0, 0.0]), np.array([0.0, 2.0])), [0.0, 1.0])
    # sum(upper) == 1: P = {upper}.
    upper = np.array([0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_capped_simplex(np.array([9.0, -9.0, 0.0]), upper), upper)


def test_projection_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        project_capped_simplex(np.array([0.3, 0.3]), np.array([0.4, 0.4]))
    with pytest.raises(ValueError, match="shape"):
        project_capped_simplex(np.array([0.3, 0.3]), np.array([1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=">= 0"):
        project_capped_simplex(np.array([0.3, 0.3]), np.array([2.0, -0.5]))
    with pytest.raises(ValueError, match="finite"):
        project_capped_simplex(np.array([np.nan, 0.3]), np.array([1.0, 1.0]))


def test_ema():
    value = np.array([1.0, 2.0])
    first = ema(None, value, 0.9)
    np.testing.assert_array_equal(first, value)
    assert first is not value
    np.testing.assert_allclose(ema(np.array([10.0, 0.0]), value, 0.9), [9.1, 0.2])
    with pytest.raises(ValueError):
        ema(np.zeros(3), value, 0.9)


# ---- a hand-computed CRA round ------------------------------------------------------------------
# Three clients, d = 2. EMAs (beta = 0.9):
#   q~ = 0.9*[0.8, 0.65, 0.4] + 0.1*[0.8, 0.15, 0.4] = [0.8, 0.6, 0.4]
#   s~ = 0.9*[2.2, 1.0, 4.0]  + 0.1*[0.2, 1.0, 4.0]  = [2.0, 1.0, 4.0]
# Reliability r = q~/s~ = [0.4, 0.6, 0.1] (eps0 = 1e-8 changes it by ~1e-9 relative).
# With n = [100, 100, 200]: n*r = [40, 60, 20], alpha = [1/3, 1/2, 1/6].
# Deltas [3, 4], [0, 0], [-6, -8]: nominal = [1 - 1, 4/3 - 8/6] = [0, 0], so d = [5, 0, 10],
# sum_j alpha_j d_j = 5/3 + 10/6 = 10/3, d^ = d * 3/10 = [1.5, 0, 3].
# Caps rho*alpha = [0.5, 0.75, 0.25].
DELTAS = np.array([[3.0, 4.0], [0.0, 0.0], [-6.0, -8.0]])
Q_PREV, Q = np.array([0.8, 0.65, 0.4]), np.array([0.8, 0.15, 0.4])
S_PREV, S = np.array([2.2, 1.0, 4.0]), np.array([0.2, 1.0, 4.0])
N = np.array([100.0, 100.0, 200.0])


def run_cra(**kwargs) -> CRAResult:
    return cra_weights(DELTAS, Q, S, N, Q_PREV, S_PREV, **kwargs)


def test_cra_hand_computed_default_step():
    res = run_cra()
    np.testing.assert_allclose(res.val_f1_ema, [0.8, 0.6, 0.4], rtol=1e-12)
    np.testing.assert_allclose(res.update_norm_ema, [2.0, 1.0, 4.0], rtol=1e-12)
    np.testing.assert_allclose(res.reliability, [0.4, 0.6, 0.1], rtol=1e-7)
    np.testing.assert_allclose(res.nominal_weight, [1 / 3, 1 / 2, 1 / 6], rtol=1e-7)
    np.testing.assert_allclose(res.deviation, [5.0, 0.0, 10.0], atol=1e-6)
    np.testing.assert_allclose(res.deviation_normalized, [1.5, 0.0, 3.0], rtol=1e-7, atol=1e-7)
    # v = alpha - 0.05 d^ = [1/3 - 0.075, 0.5, 1/6 - 0.15], sum v = 0.775; no bound binds, so
    # tau = (0.775 - 1)/3 = -0.075 and p~ = v + 0.075 = [1/3, 0.575, 1/6 - 0.075].
    np.testing.assert_allclose(res.robust_weight, [1 / 3, 0.575, 1 / 6 - 0.075], atol=1e-7)
    assert_in_capped_simplex(res.robust_weight, 1.5 * res.nominal_weight)


def test_cra_hand_computed_with_binding_bounds():
    res = run_cra(eta_p=0.3)
    # v = alpha - 0.3 d^ = [1/3 - 0.45, 0.5, 1/6 - 0.9] = [-0.1167, 0.5, -0.7333].
    # Free {1, 2}: tau = (-0.1167 + 0.5 - 1)/2 = -0.3083 -> p2 = 0.8083 > cap 0.75, so p2 = 0.75;
    # then free {1}: tau = -0.1167 + 0.75 - 1 = -0.3667, p1 = 0.25 (< cap 0.5), p3 = -0.7333 + 0.3667 < 0 -> 0.
    np.testing.assert_allclose(res.robust_weight, [0.25, 0.75, 0.0], atol=1e-7)
    assert_in_capped_simplex(res.robust_weight, 1.5 * res.nominal_weight)


def test_cra_without_sample_weighting():
    res = run_cra(weight_by_samples=False)
    # alpha = r / sum r = [4, 6, 1] / 11; nominal = [(12 - 6)/11, (16 - 8)/11] = [6, 8]/11.
    alpha = np.array([4.0, 6.0, 1.0]) / 11
    np.testing.assert_allclose(res.nominal_weight, alpha, rtol=1e-7)
    # Deviations along the (3, 4) direction: [45, 10, 120]/11; sum alpha d = (180 + 60 + 120)/121 = 360/121.
    d = np.array([45.0, 10.0, 120.0]) / 11
    np.testing.assert_allclose(res.deviation, d, rtol=1e-7)
    d_hat = d * 121 / 360  # = [1.375, 0.30556, 3.66667]
    np.testing.assert_allclose(res.deviation_normalized, d_hat, rtol=1e-7)
    # v = alpha - 0.05 d^; all free would give p3 = v3 - (sum v - 1)/3 < 0, so p3 = 0 and
    # tau = (v1 + v2 - 1)/2; both p1, p2 stay below their caps 1.5 * alpha.
    v = alpha - 0.05 * d_hat
    assert v[2] - (v.sum() - 1.0) / 3 < 0
    tau = (v[0] + v[1] - 1.0) / 2
    expected = np.array([v[0] - tau, v[1] - tau, 0.0])
    assert np.all(expected <= 1.5 * alpha)
    np.testing.assert_allclose(res.robust_weight, expected, atol=1e-7)


def test_cra_all_zero_quality_falls_back_without_nan():
    res = cra_weights(DELTAS, np.zeros(3), S, N, None, None)
    np.testing.assert_allclose(res.nominal_weight, N / N.sum())
    for field in res.__dataclass_fields__:
        assert np.all(np.isfinite(getattr(res, field))), field
    assert_in_capped_simplex(res.robust_weight, 1.5 * res.nominal_weight)
    uniform = cra_weights(DELTAS, np.zeros(3), np.zeros(3), N, None, None, weight_by_samples=False)
    np.testing.assert_allclose(uniform.nominal_weight, [1 / 3] * 3)


def test_cra_identical_updates_keep_nominal_weights():
    deltas = np.tile(np.array([1.0, -2.0, 0.5], dtype=np.float32), (4, 1))
    res = cra_weights(deltas, np.array([0.5, 0.6, 0.7, 0.8]), np.ones(4), np.array([1.0, 2.0, 3.0, 4.0]),
                      None, None)
    np.testing.assert_allclose(res.deviation, 0.0, atol=1e-6)
    np.testing.assert_allclose(res.robust_weight, res.nominal_weight, atol=1e-9)


def test_cra_rejects_bad_input():
    with pytest.raises(ValueError):
        cra_weights(DELTAS, Q, S, N[:2], None, None)
    with pytest.raises(ValueError):
        cra_weights(DELTAS, Q, S, N, None, None, rho=0.9)
    with pytest.raises(ValueError):
        cra_weights(DELTAS, -Q, S, N, None, None)
