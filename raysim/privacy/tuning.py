"""The privacy cost of private hyperparameter tuning (Papernot & Steinke, ICLR 2022).

Procedure covered (one federation, one seed). The number of candidates K is drawn from a
:class:`CandidateCount` distribution, independently of the data; K candidates are drawn
independently from the search space, by a distribution that does not depend on the data; each is
trained once (one DP training run each, with its own independent randomness); each trained model
is scored on public data (post-processing); only the best candidate (its model and its
hyperparameters) is released. With Poisson K, K = 0 can happen, and then nothing is released.

The bound. Let Q be one candidate's run: draw the hyperparameters, train. Rényi divergence is
jointly quasi-convex (van Erven & Harremoës, "Rényi Divergence and Kullback-Leibler Divergence",
2014), so the RDP curve of Q is at most the pointwise maximum of the curves of the configurations Q
can draw (:func:`tuned_epsilon` takes that maximum over the curves it is given). The paper turns
Q's RDP curve into the RDP of the whole tune (numbering of arXiv:2110.03620v2, the version
``dp_accounting`` cites):

* Theorem 2, K from the truncated negative binomial distribution D_{η,γ} (η = 0: logarithmic
  distribution, η = 1: geometric): if Q is (λ, ε)-RDP and (λ̂, ε̂)-RDP, the tune is (λ, ε')-RDP
  with ε' = ε + (1 + η)(1 − 1/λ̂) ε̂ + (1 + η) log(1/γ)/λ̂ + log(E[K])/(λ − 1).
  :func:`tuned_rdp` minimises over λ̂ in the given orders.
* Theorem 6, K ~ Poisson(μ): if Q is (λ, ε)-RDP and (ε̂, δ̂)-DP with e^ε̂ ≤ 1 + 1/(λ − 1), the tune
  is (λ, ε')-RDP with ε' = ε + μ δ̂ + log(μ)/(λ − 1). δ̂ decreases in ε̂, so ε̂ = log(1 + 1/(λ − 1))
  exactly, and δ̂ is Q's δ at ε̂ from its RDP curve by ``dp_accounting``'s RDP-to-DP conversion
  (``rdp_privacy_accountant.compute_delta``).

Then, as ``dp_accounting``'s ``RepeatAndSelectDpEvent`` does for Theorem 2, the curve is lowered
where a higher order gives less: the Rényi divergence does not decrease with its order (van Erven &
Harremoës 2014), so ε'(λ) ≤ min over orders λ' ≥ λ of ε'(λ'). Finally ε at δ is
``rdp_privacy_accountant.compute_epsilon``, the conversion ``RdpAccountant.get_epsilon`` uses.
For geometric and logarithmic K given by γ, the result equals ``RdpAccountant`` composing a
``RepeatAndSelectDpEvent`` on the same orders (the unit tests check it).

Assumptions (each is the caller's to keep):

* The curves are data-independent upper bounds on each candidate's RDP for every client (record
  level, add/remove-one, as raysim's per-run ε): the runs table's ``rdp_epsilons`` column is the
  pointwise maximum over a run's clients. The maximum must cover every configuration the search can
  draw, not only the ones it happened to draw; the two agree when the privacy parameters (σ, q,
  steps) are the same across the space, as when only ``lr`` and ``clip_norm`` are searched at a
  fixed ε target.
* K, the candidates' hyperparameters and each training run's randomness are independent of each
  other and of the data; the score of a candidate reads only its output and public data (the
  server hold-out), so selecting the best is post-processing.
* Only the best candidate is released: its model, and optionally its hyperparameters and score.
  Publishing the other candidates, their scores or K is not covered. Nothing done with the data
  outside the K candidates' runs is covered either (in particular, reruns of the chosen
  configuration on other seeds are an evaluation device of the simulator, not part of the release).
* The bound holds for the orders it is evaluated at; finer orders can only lower it.

Pure: no Ray, no torch. Randomness (:meth:`CandidateCount.sample`) comes from the caller's
generator, which in raysim is a :mod:`raysim.rng` stream.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from raysim.privacy.accounting import RDPAccountant, StepEvent, _merge

__all__ = [
    "ORDERS",
    "DISTRIBUTIONS",
    "CandidateCount",
    "rdp_curve",
    "max_rdp_curve",
    "curve_pairs",
    "warm_unit_curves",
    "rdp_to_json",
    "rdp_from_json",
    "tuned_rdp",
    "tuned_epsilon",
]

#: RDP orders (all > 1): dp_accounting's ``DEFAULT_RDP_ORDERS`` with fewer fractional orders (a
#: fractional order costs about ten times an integer one for a subsampled Gaussian): steps of 0.1
#: from 1.1 to 2.9, of 0.25 from 3 to 8, every integer from 9 to 64, then 128, 256, 512, 1024. On
#: DP-SGD runs of ε 0.4 to 29 (q 0.01 to 0.5), ε and the tuned ε of :func:`tuned_epsilon` are
#: within 0.07 % of those on ``DEFAULT_RDP_ORDERS``.
ORDERS: tuple[float, ...] = tuple(
    [round(1.0 + k / 10.0, 10) for k in range(1, 20)]
    + [3.0 + k / 4.0 for k in range(0, 21)]
    + [float(k) for k in range(9, 65)]
    + [128.0, 256.0, 512.0, 1024.0]
)

DISTRIBUTIONS = ("truncated_negative_binomial", "poisson")


# -- RDP curves of runs ---------------------------------------------------------------------------

def _orders_array(orders: Sequence[float]) -> np.ndarray:
    arr = np.asarray(orders, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("orders must be a non-empty list of numbers")
    if not np.all(np.isfinite(arr)) or not np.all(arr > 1.0):
        raise ValueError("orders must be finite and > 1")
    return arr


def rdp_curve(events: Sequence[StepEvent], orders: Sequence[float] = ORDERS) -> np.ndarray:
    """RDP ε(λ) at ``orders`` of the composition of ``events`` (add/remove-one neighbours).

    Each :class:`~raysim.privacy.accounting.StepEvent` is ``count`` steps of the Poisson-subsampled
    Gaussian mechanism (a plain Gaussian for q = 1), composed by the registered ``rdp`` accountant
    (:class:`~raysim.privacy.accounting.RDPAccountant`, dp-accounting's public RDP API) in the canonical order :func:`raysim.privacy.accounting.compute_epsilon` uses. No events: zeros;
    an event with steps and no noise: ``inf`` at every order.
    """
    order_arr = _orders_array(orders)
    merged = _merge(events)
    acc = RDPAccountant(tuple(float(o) for o in order_arr))
    for event in merged:
        acc.compose(event)
    return acc.curve


def max_rdp_curve(event_lists: Iterable[Sequence[StepEvent]], orders: Sequence[float] = ORDERS) -> np.ndarray:
    """Pointwise maximum of :func:`rdp_curve` over ``event_lists`` (e.g. one per client; zeros if none).

    RDP composes additively, so each distinct ``(q, σ)`` is evaluated once, at one step (and cached), and a list's
    curve is the sum of ``count`` times those, added in :func:`rdp_curve`'s order (the same floats).
    """
    order_key = _order_key(orders)
    out = np.zeros(len(order_key))
    for events in event_lists:
        curve = np.zeros(len(order_key))
        for event in _merge(events):
            curve += event.count * _unit_curve(event.sample_rate, event.noise_multiplier, order_key)
        out = np.maximum(out, curve)
    return out


def _order_key(orders: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(o) for o in _orders_array(orders))


@functools.lru_cache(maxsize=1)
def _background() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="raysim-rdp")


def curve_pairs(event_lists: Iterable[Sequence[StepEvent]]) -> set[tuple[float, float]]:
    """The (q, σ) pairs whose one-step curves :func:`max_rdp_curve` sums for ``event_lists``."""
    return {(e.sample_rate, e.noise_multiplier) for events in event_lists for e in _merge(events)}


def warm_unit_curves(pairs: Iterable[tuple[float, float]], orders: Sequence[float] = ORDERS
                     ) -> concurrent.futures.Future:
    """Compute the one-step curves of ``pairs`` (:func:`curve_pairs`) into :func:`max_rdp_curve`'s cache, in a
    background thread of this process; returns its future. A driver whose clients train elsewhere
    calls this as a run's (q, σ) pairs become known, so the curve after the last round is a sum of
    cached curves instead of dp-accounting's series at 100 orders for each pair (about 0.1 s each on
    the 2-core VM), the same floats either way."""
    key = _order_key(orders)
    todo = list(pairs)

    def warm() -> None:
        for q, sigma in todo:
            _unit_curve(q, sigma, key)
    return _background().submit(warm)


@functools.lru_cache(maxsize=4096)
def _unit_curve(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    """One step's curve, kept for the process: runs of one tune share their clients' (q, σ) (σ is
    calibrated from q, the steps and the ε target, not from the learning rate), and a fractional
    order of a subsampled Gaussian costs about a millisecond."""
    curve = rdp_curve([StepEvent(q, sigma, 1)], orders)
    curve.setflags(write=False)
    return curve


def rdp_to_json(curve: Sequence[float]) -> str:
    """The runs table's ``rdp_epsilons`` text: a JSON list of floats (``Infinity`` for ∞), one per order."""
    return json.dumps([float(x) for x in curve])


def rdp_from_json(text: str, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """The curve in an ``rdp_epsilons`` cell; it must have one value per order of ``orders``."""
    try:
        values = json.loads(text)
    except (TypeError, ValueError):
        raise ValueError(f"rdp_epsilons is not a JSON list of numbers: {str(text)[:60]!r}") from None
    if not isinstance(values, list) or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        raise ValueError(f"rdp_epsilons is not a JSON list of numbers: {str(text)[:60]!r}")
    if len(values) != len(orders):
        raise ValueError(f"rdp_epsilons has {len(values)} values but there are {len(orders)} orders")
    return np.asarray(values, dtype=np.float64)


# -- The number of candidates ---------------------------------------------------------------------

def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(float(value)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def _logx_over_xm1(x: float) -> float:
    """log(x)/(x − 1), with its limit 1 at x = 1."""
    return 1.0 if x == 1.0 else math.log(x) / (x - 1.0)


def _tnb_mean(eta: float, gamma: float) -> float:
    """E[K] for D_{η,γ}: η(1 − γ)/(γ(1 − γ^η)), and (1 − γ)/(γ log(1/γ)) for η = 0 (its limit)."""
    if eta == 0.0:
        return 1.0 / (gamma * _logx_over_xm1(gamma))
    x = eta * math.log(gamma)
    return (1.0 - gamma) / (gamma * (-math.expm1(x) / eta))


def _tnb_gamma_for_mean(eta: float, mean: float) -> float:
    """The γ whose D_{η,γ} has mean ``mean`` (E[K] decreases in γ), rounded towards the smaller γ
    (a mean at least the one asked for: a larger privacy bound, never a smaller one)."""
    if eta == 1.0:
        return 1.0 / mean
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _tnb_mean(eta, mid) >= mean:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class CandidateCount:
    """The distribution of the number of candidates K (Papernot & Steinke, ICLR 2022).

    * ``truncated_negative_binomial``: D_{η,γ} of the paper's Definition 1 (arXiv:2110.03620v2),
      P[K = k] = (1 − γ)^k / (γ^(−η) − 1) · Π_{ℓ<k} (ℓ + η)/(ℓ + 1) for k ≥ 1; η = 0 is the logarithmic
      distribution P[K = k] = (1 − γ)^k / (k log(1/γ)), η = 1 the geometric P[K = k] = γ(1 − γ)^(k−1).
      Parameters ``eta`` (η ≥ 0, the range ``dp_accounting`` also takes) and ``gamma`` (0 < γ < 1).
    * ``poisson``: K ~ Poisson(``mu``), μ ≥ 1 (as ``dp_accounting`` requires); K = 0 releases nothing.

    Build from a tune file's mapping with :meth:`from_mapping` (which also takes ``mean`` instead of
    ``gamma``). Bad values raise ``ValueError`` with a one-line message naming the key.
    """

    distribution: str
    eta: float | None = None
    gamma: float | None = None
    mu: float | None = None

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {self.distribution!r}")
        if self.distribution == "poisson":
            if self.eta is not None or self.gamma is not None:
                bad = "eta" if self.eta is not None else "gamma"
                raise ValueError(f"{bad} applies to truncated_negative_binomial, not poisson")
            if self.mu is None:
                raise ValueError("mu (the mean number of candidates) is required for poisson")
            mu = _number("mu", self.mu)
            if not (1.0 <= mu and math.isfinite(mu)):
                raise ValueError(f"mu must be finite and >= 1, got {self.mu!r}")
            object.__setattr__(self, "mu", mu)
            return
        if self.mu is not None:
            raise ValueError("mu applies to poisson, not truncated_negative_binomial")
        if self.eta is None or self.gamma is None:
            missing = "eta" if self.eta is None else "gamma"
            raise ValueError(f"{missing} is required for truncated_negative_binomial")
        eta, gamma = _number("eta", self.eta), _number("gamma", self.gamma)
        if not (eta >= 0.0 and math.isfinite(eta)):
            raise ValueError(f"eta must be finite and >= 0, got {self.eta!r}")
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {self.gamma!r}")
        object.__setattr__(self, "eta", eta)
        object.__setattr__(self, "gamma", gamma)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], prefix: str = "") -> CandidateCount:
        """From ``{distribution, eta, gamma | mean}`` or ``{distribution: poisson, mean}``; error
        messages name the key as ``prefix + key`` (e.g. ``prefix="tune.candidates."``)."""
        if not isinstance(mapping, Mapping):
            raise ValueError(f"{prefix.rstrip('.') or 'candidate count'} must be a mapping, got {mapping!r}")
        allowed = {"distribution", "eta", "gamma", "mean"}
        unknown = sorted(set(mapping) - allowed)
        if unknown:
            raise ValueError(f"{prefix}{unknown[0]} is not a key here; the keys are {', '.join(sorted(allowed))}")
        dist = mapping.get("distribution")
        try:
            if dist == "poisson":
                if "eta" in mapping or "gamma" in mapping:
                    bad = "eta" if "eta" in mapping else "gamma"
                    raise ValueError(f"{bad} applies to truncated_negative_binomial, not poisson")
                if "mean" not in mapping:
                    raise ValueError("mean (the mean number of candidates) is required for poisson")
                mu = _number("mean", mapping["mean"])
                if not (mu >= 1.0 and math.isfinite(mu)):
                    raise ValueError(f"mean must be finite and >= 1, got {mapping['mean']!r}")
                return cls("poisson", mu=mu)
            if dist == "truncated_negative_binomial":
                if "gamma" in mapping and "mean" in mapping:
                    raise ValueError("gamma and mean are two ways to set one parameter: give one of them")
                if "gamma" not in mapping and "mean" not in mapping:
                    raise ValueError("gamma (or mean) is required for truncated_negative_binomial")
                if "eta" not in mapping:
                    raise ValueError("eta is required for truncated_negative_binomial (0: logarithmic, 1: geometric)")
                eta = mapping["eta"]
                if "mean" in mapping:
                    mean = _number("mean", mapping["mean"])
                    if not (mean > 1.0 and math.isfinite(mean)):
                        raise ValueError(f"mean must be finite and > 1, got {mapping['mean']!r}")
                    cls("truncated_negative_binomial", eta=eta, gamma=0.5)   # validates eta first
                    return cls("truncated_negative_binomial", eta=eta, gamma=_tnb_gamma_for_mean(float(eta), mean))
                return cls("truncated_negative_binomial", eta=eta, gamma=mapping["gamma"])
            return cls(dist)   # raises: unknown distribution
        except ValueError as exc:
            raise ValueError(f"{prefix}{exc}") from None

    @property
    def mean(self) -> float:
        """E[K]."""
        if self.distribution == "poisson":
            return float(self.mu)
        return _tnb_mean(float(self.eta), float(self.gamma))

    def describe(self) -> str:
        """The distribution in words, e.g. ``the geometric distribution (η = 1, γ = 0.1)``."""
        if self.distribution == "poisson":
            return f"a Poisson distribution (μ = {self.mu:g})"
        name = {0.0: "the logarithmic distribution", 1.0: "the geometric distribution"}.get(
            float(self.eta), "a truncated negative binomial distribution")
        return f"{name} (η = {self.eta:g}, γ = {self.gamma:.6g})"

    @property
    def shape(self) -> float:
        """``dp_accounting``'s ``RepeatAndSelectDpEvent.shape``: η, or ∞ for Poisson."""
        return math.inf if self.distribution == "poisson" else float(self.eta)

    def sample(self, rng: np.random.Generator) -> int:
        """One draw of K from ``rng`` (the logarithmic law is ``rng.logseries(1 − γ)``; η > 0 is a
        negative binomial of shape η and success probability γ, redrawn while 0)."""
        if self.distribution == "poisson":
            return int(rng.poisson(self.mu))
        eta, gamma = float(self.eta), float(self.gamma)
        if eta == 0.0:
            return int(rng.logseries(1.0 - gamma))
        if eta == 1.0:
            return int(rng.geometric(gamma))
        while True:
            k = int(rng.negative_binomial(eta, gamma))
            if k > 0:
                return k


# -- The bound ------------------------------------------------------------------------------------

def _lower_by_monotonicity(rdp: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """ε'(λ) ← min over λ' ≥ λ of ε'(λ'): Rényi divergence does not decrease with the order."""
    out = rdp.copy()
    for i, lam in enumerate(orders):
        out[i] = np.min(rdp[orders >= lam])
    return out


def tuned_rdp(curve: Sequence[float], orders: Sequence[float], count: CandidateCount) -> np.ndarray:
    """RDP at ``orders`` of releasing the best of K runs, K ~ ``count``, each run (λ, ``curve``)-RDP.

    Truncated negative binomial: Theorem 2 of Papernot & Steinke (arXiv:2110.03620v2), minimised
    over λ̂ in ``orders``. Poisson: their Theorem 6 with ε̂ = log(1 + 1/(λ − 1)) and δ̂ from ``curve``
    by ``dp_accounting``'s ``compute_delta``. Then lowered by monotonicity in the order (see the
    module docstring).
    """
    if not isinstance(count, CandidateCount):
        raise ValueError(f"count must be a CandidateCount, got {type(count).__name__}")
    lam = _orders_array(orders)
    eps = np.asarray(curve, dtype=np.float64)
    if eps.shape != lam.shape:
        raise ValueError(f"the curve has {eps.size} values but there are {lam.size} orders")
    if np.any(np.isnan(eps)) or np.any(eps < 0.0):
        raise ValueError("RDP values must be >= 0 (inf allowed)")
    mean = count.mean
    if count.distribution == "poisson":
        out = np.empty_like(eps)
        for i, order in enumerate(lam):
            eps_hat = math.log1p(1.0 / (order - 1.0))
            delta_hat, _ = rdp_privacy_accountant.compute_delta(lam, eps, eps_hat)
            out[i] = eps[i] + mean * delta_hat + math.log(mean) / (order - 1.0)
    else:
        eta, gamma = float(count.eta), float(count.gamma)
        with np.errstate(invalid="ignore"):
            hat_terms = (1.0 - 1.0 / lam) * eps + math.log(1.0 / gamma) / lam
        c = (1.0 + eta) * float(np.min(hat_terms))
        out = eps + c + math.log(mean) / (lam - 1.0)
    return _lower_by_monotonicity(out, lam)


def tuned_epsilon(curves: Sequence[np.ndarray] | np.ndarray, orders: Sequence[float], delta: float,
                  count: CandidateCount) -> float:
    """ε at ``delta`` of the released best candidate.

    ``curves``: one RDP curve at ``orders`` per configuration the search can draw (a list, or an
    array of shape (configurations, orders); a single 1-D curve is one configuration). Their
    pointwise maximum bounds a candidate with randomly drawn hyperparameters; :func:`tuned_rdp`
    applies the Papernot–Steinke bound; ``dp_accounting``'s ``compute_epsilon`` converts to (ε, δ).
    """
    lam = _orders_array(orders)
    stacked = np.asarray(curves, dtype=np.float64)
    if stacked.ndim == 1:
        stacked = stacked[None, :]
    if stacked.ndim != 2 or stacked.shape[0] == 0 or stacked.shape[1] != lam.size:
        raise ValueError(f"curves must be one or more curves of {lam.size} values (one per order)")
    d = _number("delta", delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    rdp = tuned_rdp(stacked.max(axis=0), lam, count)
    eps, _ = rdp_privacy_accountant.compute_epsilon(lam, rdp, d)
    return float(eps)
