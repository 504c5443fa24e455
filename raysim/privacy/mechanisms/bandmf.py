"""Banded matrix factorisation (BandMF; Choquette-Choo et al., NeurIPS 2023): strategy, noise and accounting.

The strategy ``C`` here is lower-triangular Toeplitz with ``b`` bands: coefficients ``c_0, …, c_{b−1}``
and zeros below (McKenna 2024's banded Toeplitz strategies). Its columns have unit L2 norm, and two
columns ``b`` or more apart have disjoint support, so a participant who takes part at most once in any
``b`` consecutive steps (*b-min-separation*) adds k orthogonal unit columns: the sensitivity is √k.

* :func:`optimize_bandmf`: the coefficients minimising the mean error of the ``n`` released prefix sums
  times the squared sensitivity (scale-free, so ``c_0 = 1`` is fixed during the search and the result is
  normalised to unit norm). The error and its gradient come from two recursive filters over n steps
  (``C⁻¹`` and ``C⁻ᵀ``), so L-BFGS over b − 1 numbers costs O(n·b) a step. With ``decay`` η > 0 the
  workload is the damped sums ``w_t = (1 − η) w_{t−1} + x_t`` instead (the Toeplitz ``A`` with first
  column ``(1 − η)^t``): the model under a loss that pulls it back by η of its displacement a round.
* :class:`BandMFNoise`: the correlated noise ``(C⁻¹ z)_t``, from the recursion
  ``w_t = (z_t − Σ_{j=1}^{b−1} c_j w_{t−j}) / c_0``: the last b − 1 noise vectors are the whole state.
* :func:`amplified_bandmf_event`: under cyclic Poisson participation (the participants of step t drawn with
  probability q from group t mod b of a fixed partition into b groups), each participant's group takes
  part in ⌈n / b⌉ steps, b apart, each a Poisson-subsampled Gaussian release of multiplier σ on one unit
  column, and these compose (Choquette-Choo et al. 2023, Theorem 4): the event dp-accounting composes.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.signal import lfilter

from raysim.privacy.mechanisms.toeplitz import minsep_sensitivity_squared

__all__ = ["optimize_bandmf", "bandmf_loss", "bandmf_sensitivity_squared", "BandMFNoise",
           "amplified_bandmf_event", "amplified_steps", "bandmf_for"]


def _error_and_grad(coefs: np.ndarray, n: int, decay: float = 0.0,
                    released: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Mean over the released queries (``released``, indices; default all n) of the workload A (prefix
    sums, or damped sums with ``decay``) of their variance (unit noise on C x), and its gradient in ``coefs``.

    x = C⁻¹ a, a = A's first column ((1 − η)^t), is the first column of B = A C⁻¹ (Toeplitz matrices
    commute); the error of query t is Σ_{s≤t} x_s², so the mean is Σ_s x_s² w_s with w_s the share of the
    released queries at or after s ((n − s)/n when all are). With y = C⁻ᵀ (u ∘ x), u_s = 2 w_s:
    ∂/∂c_j = −Σ_s y_s x_{s−j}."""
    x = lfilter([1.0], coefs, (1.0 - decay) ** np.arange(n))
    queries = np.arange(n) if released is None else np.sort(np.asarray(released))
    weight = (len(queries) - np.searchsorted(queries, np.arange(n))) / len(queries)
    error = float(np.sum(weight * x * x))
    y = lfilter([1.0], coefs, (2.0 * weight * x)[::-1])[::-1]
    grad = np.array([-float(y[j:] @ x[:n - j]) for j in range(len(coefs))])
    return error, grad


def bandmf_loss(coefs: np.ndarray, n: int, decay: float = 0.0) -> float:
    """Mean error × squared sensitivity (one participation) of the banded strategy ``coefs``."""
    c = np.asarray(coefs, dtype=np.float64)
    return _error_and_grad(c, n, decay)[0] * float(c @ c)


def optimize_bandmf(n: int, bands: int, steps: int = 500, decay: float = 0.0,
                    released: np.ndarray | None = None) -> np.ndarray:
    """The ``bands`` coefficients (unit L2 norm, c_0 > 0) of the banded Toeplitz strategy minimising
    :func:`bandmf_loss` over ``n`` steps (the workload damped by ``decay``; only the queries ``released``
    counted, default all). One band is the identity: independent Gaussian noise."""
    if n < 1 or bands < 1:
        raise ValueError(f"n and bands must be >= 1, got n={n}, bands={bands}")
    bands = min(bands, n)
    if bands == 1:
        return np.ones(1)

    def fun(tail: np.ndarray) -> tuple[float, np.ndarray]:
        c = np.concatenate([[1.0], tail])
        error, grad = _error_and_grad(c, n, decay, released)
        norm = float(c @ c)
        return error * norm, (2.0 * c * error + norm * grad)[1:]

    start = np.cumprod((2 * np.arange(1, bands) - 1) / (2 * np.arange(1, bands)))  # square root's, cut to b
    result = minimize(fun, start, jac=True, method="L-BFGS-B",
                      options={"maxiter": steps, "ftol": 1e-13, "gtol": 1e-10})
    c = np.concatenate([[1.0], result.x])
    return c / np.linalg.norm(c)


def bandmf_sensitivity_squared(coefs: np.ndarray, n: int, min_sep: int, participations: int | None = None) -> float:
    """Squared sensitivity of the banded strategy when participations are at least ``min_sep`` steps apart
    (exact for non-negative non-increasing coefficients; with ``min_sep`` ≥ the bands and unit-norm columns
    it is the participation count)."""
    return minsep_sensitivity_squared(coefs, n, min_sep, participations)


def amplified_steps(n: int, bands: int) -> int:
    """Steps in which one group of the cyclic partition takes part: ⌈n / b⌉."""
    return math.ceil(n / bands)


def amplified_bandmf_event(noise_multiplier: float, n: int, bands: int, sample_rate: float):
    """dp-accounting's event of amplified BandMF (unit-norm columns, noise multiplier σ), under add/remove
    of one participant: ⌈n / b⌉ compositions of the Poisson-subsampled Gaussian of rate q."""
    import dp_accounting
    event = dp_accounting.PoissonSampledDpEvent(float(sample_rate), dp_accounting.GaussianDpEvent(float(noise_multiplier)))
    return dp_accounting.SelfComposedDpEvent(event, amplified_steps(n, bands))


class BandMFNoise:
    """The correlated noise ``(C⁻¹ z)_t`` of a banded strategy, one step at a time; the state is the last
    b − 1 noise vectors (float64, a ring: step t writes slot t mod (b − 1)) and the step count. ``z_t`` is
    supplied by the caller (raysim draws it from a keyed stream). :meth:`state_dict` /
    :meth:`load_state_dict` carry the state through a checkpoint."""

    def __init__(self, coefs: np.ndarray, size: int) -> None:
        c = np.asarray(coefs, dtype=np.float64)
        self.c0 = float(c[0])
        self.tail = c[1:]                                       # c_1 … c_{b−1}
        self.past = torch.zeros((len(c) - 1, size), dtype=torch.float64)
        self.steps = 0

    def step(self, z: torch.Tensor) -> torch.Tensor:
        w = z.double().clone()
        slots = len(self.tail)
        if slots:
            weights = np.zeros(slots)                           # c_j on the slot of w_{t−j}
            for j in range(1, min(self.steps, slots) + 1):
                weights[(self.steps - j) % slots] = self.tail[j - 1]
            w -= torch.from_numpy(weights) @ self.past
        w /= self.c0
        if slots:
            self.past[self.steps % slots] = w
        self.steps += 1
        return w

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        return {"past": self.past.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, torch.Tensor | int]) -> None:
        self.past = state["past"].clone()
        self.steps = int(state["steps"])


@functools.lru_cache(maxsize=256)
def bandmf_for(rounds: int, bands: int, decay: float = 0.0) -> tuple[float, ...]:
    """The BandMF coefficients for T rounds, b bands and the workload's ``decay`` (a pure function, kept like
    :func:`blt_for`'s)."""
    return tuple(float(c) for c in optimize_bandmf(rounds, bands, decay=decay))
