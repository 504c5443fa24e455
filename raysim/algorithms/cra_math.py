"""Constraint-aware robust aggregation (CRA, docs/methods.md): the server-side maths, framework-free.

Everything here is a pure function of float64 numpy arrays. Parts that the withdrawn paper lost and
this project reconstructs are marked (R); docs/methods.md gives each one and its default, and callers
expose them as config options.

Privacy: CRA only post-processes what clients upload. The update deltas are DP outputs (free), but the
validation macro-F1 ``q_i`` is computed from private validation data outside DP-SGD and is *not* covered
by the accountant unless the caller privatises it before passing it here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["project_capped_simplex", "ema", "CRAResult", "cra_weights"]


def _as_vector(x: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr}")
    return arr


def project_capped_simplex(v: np.ndarray, upper: np.ndarray, *, tol: float = 1e-12,
                           max_iter: int = 200) -> np.ndarray:
    """Euclidean projection of ``v`` onto P = {p : Σ p_i = 1, 0 ≤ p_i ≤ upper_i}.

    The KKT conditions give p_i(τ) = clip(v_i − τ, 0, upper_i) for the shift τ with Σ p_i(τ) = 1.
    f(τ) = Σ p_i(τ) − 1 is continuous, non-increasing and piecewise linear with breakpoints
    {v_i − upper_i} ∪ {v_i}. We bisect over the *sorted breakpoints* (not over a real interval) to find
    the segment on which f changes sign; on that segment the set of free coordinates is fixed, so τ is
    solved in closed form: τ = (Σ_free v_i + Σ_capped upper_i − 1) / |free|. The result is exact up to
    floating-point rounding (sum within ~N·eps of 1).

    Args:
        v: point to project, shape (N,).
        upper: per-coordinate caps, shape (N,), all ≥ 0 with Σ upper ≥ 1.
        tol: feasibility slack: Σ upper ∈ [1 − tol, 1) is treated as Σ upper = 1 (rounding, e.g. when
            upper = ρ·α with ρ = 1), and the only feasible point, ``upper`` itself, is returned.
        max_iter: cap on bisection steps over the 2N breakpoints (⌈log2(2N)⌉ + 1 are needed).

    Raises:
        ValueError: shapes differ, non-finite input, any upper < 0, or Σ upper < 1 − tol (P is empty).
    """
    v = _as_vector(v, "v")
    upper = _as_vector(upper, "upper")
    if v.shape != upper.shape:
        raise ValueError(f"v and upper must have the same shape, got {v.shape} and {upper.shape}")
    if np.any(upper < 0):
        raise ValueError(f"upper bounds must be >= 0, got {upper}")
    total_cap = float(upper.sum())
    if total_cap < 1.0 - tol:
        raise ValueError(f"the capped simplex is empty: sum(upper) = {total_cap} < 1")
    if total_cap <= 1.0:
        return upper.copy()

    def excess(tau: float) -> float:
        return float(np.clip(v - tau, 0.0, upper).sum()) - 1.0

    breakpoints = np.unique(np.concatenate([v - upper, v]))
    # f(min breakpoint) = Σ upper − 1 > 0 (all capped); f(max breakpoint) = −1 (all zero).
    lo, hi = 0, breakpoints.size - 1
    for _ in range(max_iter):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        if excess(breakpoints[mid]) >= 0.0:
            lo = mid
        else:
            hi = mid
    else:
        raise RuntimeError(f"capped-simplex projection did not converge in max_iter={max_iter} steps")

    # No breakpoint lies strictly inside (b_lo, b_hi), so classify against the very floats that are the
    # breakpoints: coordinate i is zero if v_i <= b_lo, capped if v_i - u_i >= b_hi, free otherwise.
    b_lo, b_hi = breakpoints[lo], breakpoints[hi]
    cap_point = v - upper
    free = (v >= b_hi) & (cap_point <= b_lo)
    capped = cap_point >= b_hi
    num_free = np.count_nonzero(free)
    if num_free:
        tau = (v[free].sum() + upper[capped].sum() - 1.0) / num_free
    else:
        # Only when rounding makes the sign change happen on a segment a few ulps wide (e.g. sum(upper)
        # = 1 + 2e-16): f is then flat there and b_lo, where f >= 0, is as good as exact.
        tau = b_lo
    return np.clip(v - tau, 0.0, upper)


def ema(prev: np.ndarray | None, value: np.ndarray, beta: float) -> np.ndarray:
    """Exponential moving average ``beta·prev + (1 − beta)·value``; initialised at ``value`` when prev is
    None, and entry-wise where prev is NaN (a client reporting for the first time under partial participation)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    value = np.asarray(value, dtype=np.float64)
    if prev is None:
        return value.copy()
    prev = np.asarray(prev, dtype=np.float64)
    if prev.shape != value.shape:
        raise ValueError(f"EMA state has shape {prev.shape}, new value has shape {value.shape}")
    out = beta * prev + (1.0 - beta) * value
    fresh = np.isnan(prev)
    if fresh.any():
        out[fresh] = value[fresh]
    return out


@dataclass(frozen=True)
class CRAResult:
    """Every per-client quantity of one CRA round (all of them are logged), each of shape (N,)."""

    val_f1_ema: np.ndarray
    update_norm_ema: np.ndarray
    reliability: np.ndarray
    nominal_weight: np.ndarray
    deviation: np.ndarray
    deviation_normalized: np.ndarray
    robust_weight: np.ndarray


def cra_weights(deltas: np.ndarray, val_f1: np.ndarray, update_norm: np.ndarray, num_samples: np.ndarray,
                val_f1_ema_prev: np.ndarray | None, update_norm_ema_prev: np.ndarray | None, *,
                beta: float = 0.9, rho: float = 1.5, eta_p: float = 0.05, weight_by_samples: bool = True,
                eps0: float = 1e-8) -> CRAResult:
    """CRA aggregation weights p̃ (docs/methods.md, steps 1–7).

    1. q̃_i ← β q̃_i + (1−β) q_i and s̃_i ← β s̃_i + (1−β) s_i, initialised at the first value; β = 0.9 (R).
    2. r_i = q̃_i / (s̃_i + ε₀).
    3. α_i = n_i r_i / Σ_j n_j r_j, or r_i / Σ_j r_j when ``weight_by_samples`` is False (R).
    4. Δw̄ = Σ_i α_i Δw_i.
    5. d_i = ‖Δw_i − Δw̄‖₂ and d̂_i = d_i / (Σ_j α_j d_j + ε₀) (normalisation R).
    6. P = {p in the simplex : p_i ≤ ρ α_i}, ρ = 1.5 (R).
    7. p̃ = Π_P(α − η_p d̂), η_p = 0.05 (R).

    Edge case (not in the paper): if every r_i is 0 (e.g. all q_i = 0), α falls back to the FedAvg weights
    n_i / Σ n_j (or uniform 1/N when ``weight_by_samples`` is False), so the result never contains NaN.

    Args:
        deltas: client updates Δw_i as rows, shape (N, d), float32 or float64 (computed in float64).
        val_f1: this round's q_i ≥ 0, shape (N,). Not DP-protected unless the caller noised it.
        update_norm: this round's s_i ≥ 0 (in whatever unit ADPC uses), shape (N,).
        num_samples: local training sizes n_i > 0, shape (N,).
        val_f1_ema_prev, update_norm_ema_prev: the clients' last q̃, s̃, or None in the first round (NaN
            entries: clients without an earlier report, initialised at this round's value).

    Returns:
        A :class:`CRAResult`; ``robust_weight`` is p̃, and the caller aggregates Σ_i p̃_i Δw_i (step 8).
    """
    deltas = np.asarray(deltas)
    if deltas.ndim != 2 or deltas.shape[0] == 0:
        raise ValueError(f"deltas must have shape (num_clients, num_params), got {deltas.shape}")
    num_clients = deltas.shape[0]
    q = _as_vector(val_f1, "val_f1")
    s = _as_vector(update_norm, "update_norm")
    n = _as_vector(num_samples, "num_samples")
    for name, arr in (("val_f1", q), ("update_norm", s), ("num_samples", n)):
        if arr.shape != (num_clients,):
            raise ValueError(f"{name} must have shape ({num_clients},), got {arr.shape}")
    if np.any(q < 0) or np.any(s < 0):
        raise ValueError("val_f1 and update_norm must be >= 0")
    if np.any(n <= 0):
        raise ValueError(f"num_samples must be > 0, got {n}")
    if rho < 1.0:
        raise ValueError(f"rho must be >= 1 for the ambiguity set to be non-empty, got {rho}")
    if eta_p < 0.0 or eps0 <= 0.0:
        raise ValueError(f"need eta_p >= 0 and eps0 > 0, got eta_p={eta_p}, eps0={eps0}")

    q_ema = ema(val_f1_ema_prev, q, beta)
    s_ema = ema(update_norm_ema_prev, s, beta)
    reliability = q_ema / (s_ema + eps0)

    scale = n if weight_by_samples else np.ones(num_clients)
    raw = scale * reliability
    if not raw.sum() > 0.0:
        raw = scale
    alpha = raw / raw.sum()

    # Row by row: never materialises an (N, d) float64 copy of a float32 model-sized matrix.
    nominal = np.zeros(deltas.shape[1], dtype=np.float64)
    for i in range(num_clients):
        nominal += alpha[i] * deltas[i].astype(np.float64)
    deviation = np.array([np.linalg.norm(deltas[i].astype(np.float64) - nominal) for i in range(num_clients)])
    deviation_normalized = deviation / (float(alpha @ deviation) + eps0)

    robust = project_capped_simplex(alpha - eta_p * deviation_normalized, rho * alpha)
    return CRAResult(val_f1_ema=q_ema, update_norm_ema=s_ema, reliability=reliability, nominal_weight=alpha,
                     deviation=deviation, deviation_normalized=deviation_normalized, robust_weight=robust)
