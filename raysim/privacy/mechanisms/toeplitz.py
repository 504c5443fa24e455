"""Lower-triangular Toeplitz matrices on the prefix-sum workload: the algebra every correlated mechanism shares.

A matrix mechanism releases the prefix sums ``A x`` (``A`` the all-ones lower triangle) of a stream of
clipped updates as ``B (C x + z)`` with ``A = B C``: the strategy ``C`` is what the noise ``z`` protects, so
its sensitivity sizes the noise; the noising matrix ``C⁻¹`` correlates the noise that each step's update
receives, ``x_t + (C⁻¹ z)_t``. For a lower-triangular Toeplitz ``C`` (the same coefficient on every
diagonal), ``C⁻¹`` and ``B`` are Toeplitz too, and each is given by its first column, its *coefficients*.

* :func:`inverse_coefs`: the coefficients of ``C⁻¹``.
* :func:`per_query_error`: the variance of each released prefix sum, for unit noise on ``C x``.
* :func:`minsep_sensitivity_squared`: the worst squared L2 norm of ``C`` times a participation vector with
  at most ``k`` ones, any two at least ``min_sep`` apart (McMahan et al. 2024, Theorem 2: exact for
  non-negative, non-increasing coefficients; otherwise the coefficients are first replaced by their
  non-increasing envelope of absolute values, an upper bound).
* :func:`sqrt_coefs`: ``C = A^{1/2}``, the square-root factorisation (Fichtenberger et al. 2023), optimal for
  the largest error under one participation among Toeplitz strategies; its generating function is
  ``(1 − x)^{-1/2}``, that of its inverse ``(1 − x)^{1/2}``.

Everything here is float64 numpy; ``n`` is the number of steps.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import lfilter

__all__ = ["inverse_coefs", "per_query_error", "minsep_sensitivity_squared", "max_participations",
           "sqrt_coefs", "materialize"]


def _pad(coefs: np.ndarray, n: int) -> np.ndarray:
    c = np.asarray(coefs, dtype=np.float64)[:n]
    return np.pad(c, (0, n - c.size))


def materialize(coefs: np.ndarray, n: int) -> np.ndarray:
    """The ``n × n`` lower-triangular Toeplitz matrix with first column ``coefs`` (zeros past its end)."""
    c = _pad(coefs, n)
    i, j = np.indices((n, n))
    return np.where(i >= j, c[np.clip(i - j, 0, n - 1)], 0.0)


def inverse_coefs(coefs: np.ndarray, n: int) -> np.ndarray:
    """First column of ``C⁻¹`` for the lower-triangular Toeplitz ``C`` with first column ``coefs`` (c_0 ≠ 0)."""
    c = np.asarray(coefs, dtype=np.float64)[:n]
    if c.size == 0 or c[0] == 0.0:
        raise ValueError("a lower-triangular Toeplitz matrix is invertible only with a non-zero diagonal")
    impulse = np.zeros(n)
    impulse[0] = 1.0
    return lfilter([1.0], c, impulse)


def per_query_error(noising_coefs: np.ndarray, n: int) -> np.ndarray:
    """Variance of each of the ``n`` released prefix sums under unit-variance noise on ``C x``: the squared
    row norms of ``B = A C⁻¹``, for ``C⁻¹`` with first column ``noising_coefs``. Non-decreasing in t."""
    b = np.cumsum(_pad(noising_coefs, n))
    return np.cumsum(b * b)


def max_participations(n: int, min_sep: int, participations: int | None = None) -> int:
    """How many times one participant can take part in ``n`` steps, any two at least ``min_sep`` apart
    (``participations`` caps it)."""
    if min_sep < 1 or n < 1:
        raise ValueError(f"min_sep and n must be >= 1, got min_sep={min_sep}, n={n}")
    most = math.ceil(n / min_sep)
    return most if participations is None else max(1, min(int(participations), most))


def minsep_sensitivity_squared(strategy_coefs: np.ndarray, n: int, min_sep: int = 1,
                               participations: int | None = None) -> float:
    """Largest ``‖C u‖²`` over participation vectors ``u`` with at most ``participations`` ones (at most
    ``ceil(n / min_sep)``), any two ``min_sep`` or more steps apart. The worst pattern of a non-negative,
    non-increasing column is that many participations exactly ``min_sep`` apart, starting at step 0."""
    k = max_participations(n, min_sep, participations)
    c = np.maximum.accumulate(np.abs(_pad(strategy_coefs, n))[::-1])[::-1]
    pad = (-n) % min_sep                 # strided running sums: every[t] = Σ_{p ≥ 0} c[t − p·min_sep]
    every = np.pad(c, (0, pad)).reshape(-1, min_sep).cumsum(axis=0).reshape(-1)[:n]
    column = every.copy()               # keep the first k terms only: column[t] = every[t] − every[t − k·min_sep]
    column[k * min_sep:] -= every[:max(n - k * min_sep, 0)]
    return float(column @ column)


def sqrt_coefs(n: int) -> np.ndarray:
    """Coefficients of ``A^{1/2}``: binom(2k, k) / 4^k = 1, 1/2, 3/8, 5/16, 35/128, …"""
    k = np.arange(1, n, dtype=np.float64)
    return np.concatenate([[1.0], np.cumprod((2 * k - 1) / (2 * k))])
