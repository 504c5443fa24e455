"""Privacy accounting: what happened (``StepEvent``) apart from what it cost (an accountant).

All privacy maths is delegated to ``dp_accounting`` (Google): this module only describes events,
chooses the accountant and its numerical settings, and searches for a noise multiplier.

Privacy model (docs/privacy.md). Record-level DP under the add/remove-one neighbouring relation, accounted
per client. One DP-SGD step is the Poisson-subsampled Gaussian mechanism: each example of the client is
in the batch independently with probability ``q``, per-example gradients are clipped to norm ``C``
(the caller's job) and Gaussian noise of standard deviation ``sigma * C`` is added to their sum. A
release that touches the whole local data set (e.g. a noised validation F1 per round, sensitivity
normalised to 1) is ``StepEvent(1.0, sigma, 1)``: a plain Gaussian mechanism. For the ``batch``
clipping mode the caller must pass ``sigma / 2`` (replacement sensitivity 2C).

Accountants (``ACCOUNTANTS``) implement the :class:`Accountant` protocol (compose an event, ε at δ, δ at ε,
a state for checkpoints) and are found by registration (:func:`register_accountant`). Both built-ins use
dp-accounting's public API only, and a contract test checks each against dp-accounting's own accountant:

* ``"pld"`` (default): :class:`PLDAccountant`, privacy loss distributions
  (``dp_accounting.pld.privacy_loss_distribution``) with the connect-the-dots, *pessimistic*
  discretisation, so the reported epsilon is an upper bound for every discretisation interval; a
  coarser interval only makes it looser. It composes what ``dp_accounting.pld.PLDAccountant`` composes.
* ``"rdp"``: :class:`RDPAccountant`, the curves of ``dp_accounting.rdp.RdpAccountant`` at its default
  orders, added up.

Choice of the PLD discretisation interval (measured on 2 CPU cores, dp-accounting 0.6.0).
dp_accounting's default ``value_discretization_interval`` is 1e-4. For the run this project cares
about (q = 0.0128, sigma = 1.0, 7000 steps, delta = 1e-5) the default takes about 0.6 s per epsilon,
too slow to evaluate per client per round; with 1e-3 it takes about 0.07 s and gives 6.7404 instead
of 6.7383 (+0.03 %); RDP takes about 0.04 s and gives 7.3139. A fixed 1e-3 is not good enough
everywhere: when the per-step privacy loss is itself of order 1e-3 (small q with large sigma, e.g.
q = 0.001, sigma = 2, epsilon about 0.05-0.1) it overestimates epsilon by up to 28 %. The spread of
the per-step privacy loss of the subsampled Gaussian scales like q / sigma (and grows faster, like
q / sigma**3, for sigma < 1 where the tail dominates), so ``pld_discretization_interval`` takes the
coarsest of (1e-3, 5e-4, 2.5e-4, 1e-4) that is at most ``0.25 * min(q / sigma * max(1, sigma**-2))``
over the events, never finer than the default 1e-4. Measured against the default settings on
q in {0.001, 0.01, 0.05, 0.2} x sigma in {0.6, 1, 2} x steps in {10, 1000, 5000}, and on
q in {0.0003, 0.001, 0.002, 0.003, 0.0128, 0.03} x sigma in [0.4, 5] x steps up to 10000, the
largest difference was +0.46 % (the unit tests check 1 %); cases that need a finer interval are
mostly cheap, because a small per-step loss means a narrow distribution (exception: q <= 3e-4 with
sigma near 0.75 falls back to the default interval and takes 1-1.5 s, as the default does). A few
fixed levels keep epsilon a piecewise-smooth, decreasing function of sigma for calibration; the
calibration does not rely on it for its guarantee (it only returns a sigma whose epsilon it has
computed and found within the target).

Performance notes (CPU seconds, 2 cores, dp-accounting 0.6.0). A ledger that keeps a constant
``(q, sigma)`` is a single self-composed event. ``PrivacyLedger`` composes incrementally: it keeps an
accountant and composes only what was recorded since the last evaluation, each event's PLD taken from a
cache (a client composes the same round every round). One round of 70 steps at q = 0.0128, σ = 1, plus a
side-channel Gaussian costs a median 11 ms with PLD (31 ms with RDP); with a σ that changes every round
(DP-ACDN's shape, ×0.97 a round), where every round adds an event, 136 ms (RDP 97 ms); measured over 30
rounds on the 2-core VM with ``python experiments/bench/accounting_round.py``.
``epsilon_many`` evaluates each distinct event list once. Calibration interpolates log epsilon
against log sigma (``_smallest_feasible``): q = 0.0128, 7000 steps, epsilon 8 takes 4 evaluations of
``compute_epsilon``, 0.24-0.27 s of CPU, with PLD and 4, 0.13-0.18 s, with RDP (the command is in
docs/performance.md, "Accounting"); a 100-entry sigma schedule (one event per round, 70 steps at
q = 0.0128 each, epsilon 8) takes 6 evaluations, 39.1 s, with PLD and 7, 26.4 s, with RDP, once per run. dp_accounting's RDP is slower for large q with small
sigma, e.g. q >= 0.05 with sigma < 1: there the series of a fractional order near 1 may not converge,
and dp_accounting leaves that order out (+inf in the curve) and logs a warning, which
:class:`RDPAccountant` keeps off the console (a run's RDP curve meets dozens of them).
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Hashable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from raysim.config import NOISE_MULTIPLIER_RANGE, ConfigError
from raysim.lazy import LazyModule

dp_accounting = LazyModule("dp_accounting")
privacy_loss_distribution = LazyModule("dp_accounting.pld.privacy_loss_distribution")
rdp_privacy_accountant = LazyModule("dp_accounting.rdp.rdp_privacy_accountant")

__all__ = [
    "ACCOUNTANTS",
    "Accountant",
    "PLDAccountant",
    "RDPAccountant",
    "register_accountant",
    "new_accountant",
    "accountant_from_state",
    "calibrate",
    "gaussian_equivalent",
    "StepEvent",
    "PrivacyLedger",
    "compute_epsilon",
    "compute_epsilon_steps",
    "calibrate_noise_multiplier",
    "smallest_noise",
    "epsilon_many",
    "pld_discretization_interval",
    "AccountingError",
]

#: Names of the registered accountants (:func:`register_accountant`): ``pld`` and ``rdp`` built in.
ACCOUNTANTS: tuple[str, ...] = ()

#: dp_accounting's own default for ``PLDAccountant(value_discretization_interval=...)``.
DEFAULT_PLD_DISCRETIZATION = 1e-4
# Coarsest first; the last level is dp_accounting's default (see the module docstring).
_PLD_DISCRETIZATION_LEVELS = (1e-3, 5e-4, 2.5e-4, DEFAULT_PLD_DISCRETIZATION)
_PLD_LOSS_SCALE_FRACTION = 0.25

# Bracket for the noise-multiplier search, and the σ the accountants evaluate.
_SIGMA_MIN, _SIGMA_MAX = NOISE_MULTIPLIER_RANGE

#: Most points of one step's privacy-loss distribution the PLD accountant builds (its estimate,
#: :func:`_pld_points`). One evaluation at σ = 0.02 (3.5e6 points) took 4-49 s on the 2-core VM
#: (docs/privacy.md), so this keeps one within seconds; it is reached below σ ≈ 0.043 (ε of several
#: hundred and more), where the RDP accountant answers at once.
PLD_MAX_POINTS = 1_000_000


class AccountingError(ConfigError):
    """A privacy request the accountant cannot answer: a target no noise multiplier in
    [``_SIGMA_MIN``, ``_SIGMA_MAX``] meets, a noise multiplier outside that range, or a mechanism whose
    privacy-loss distribution is too large to compute. An input error: one line, exit 2."""


@dataclass(frozen=True)
class StepEvent:
    """``count`` self-composed steps of the Poisson-subsampled Gaussian mechanism.

    ``sample_rate`` is the Poisson inclusion probability q of each example (1.0: every example, a
    plain Gaussian mechanism); ``noise_multiplier`` is sigma, the noise standard deviation divided by
    the l2 sensitivity (0 means no noise: no privacy; otherwise within ``NOISE_MULTIPLIER_RANGE``, else
    :class:`AccountingError`, which also covers several releases merged into one). Immutable, like
    ``dp_accounting.DpEvent``.
    """

    sample_rate: float
    noise_multiplier: float
    count: int

    def __post_init__(self) -> None:
        q = _as_float("sample_rate", self.sample_rate)
        sigma = _as_float("noise_multiplier", self.noise_multiplier)
        if not 0.0 < q <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if not (sigma >= 0.0 and math.isfinite(sigma)):
            raise ValueError(f"noise_multiplier must be finite and >= 0, got {self.noise_multiplier!r}")
        if sigma != 0.0 and not _SIGMA_MIN <= sigma <= _SIGMA_MAX:
            raise AccountingError(f"noise multiplier {sigma:g} is outside [{_SIGMA_MIN:g}, {_SIGMA_MAX:g}], "
                                  "where the accountants' arithmetic holds (0 means no noise)")
        if isinstance(self.count, bool) or not isinstance(self.count, numbers.Integral) or self.count < 0:
            raise ValueError(f"count must be an integer >= 0, got {self.count!r}")
        object.__setattr__(self, "sample_rate", q)
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "count", int(self.count))

    @property
    def key(self) -> tuple[float, float]:
        """``(sample_rate, noise_multiplier)``: events with equal keys merge by adding counts."""
        return (self.sample_rate, self.noise_multiplier)

    def to_dp_event(self) -> dp_accounting.DpEvent:
        """The equivalent ``dp_accounting`` event (``NoOpDpEvent`` for zero steps)."""
        if self.count == 0:
            return dp_accounting.NoOpDpEvent()
        gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sample_rate == 1.0:
            return dp_accounting.SelfComposedDpEvent(gaussian, self.count)
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(self.sample_rate, gaussian), self.count
        )


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _check_delta(delta: float) -> float:
    d = _as_float("delta", delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return d


def _check_accountant(accountant: str) -> str:
    if accountant not in _REGISTRY:
        raise ValueError(f"unknown accountant {accountant!r}; choose one of {', '.join(ACCOUNTANTS)}")
    return accountant


def gaussian_equivalent(releases: Sequence[tuple[float, int]]) -> float:
    """σ of the one Gaussian mechanism equivalent to ``count`` releases of each σ_j (sensitivity 1).

    Gaussian mechanisms compose exactly into one Gaussian (μ-GDP, Dong, Roth & Su: μ² = Σ 1/σ_j²), so
    any number of them is one Gaussian with σ = (Σ_j count_j / σ_j²)^(-1/2). A σ_j of 0 gives 0.
    """
    if any(count and sigma == 0.0 for sigma, count in releases):
        return 0.0
    total = sum(count / sigma**2 for sigma, count in releases if count)
    if total <= 0:
        raise ValueError("need at least one release")
    return float(total ** -0.5)


def _merge(events: Sequence[StepEvent]) -> tuple[StepEvent, ...]:
    """Canonical form: zero-count events dropped, equal ``(q, sigma)`` merged and sorted, and every
    plain Gaussian event (q = 1) merged into one exactly equivalent Gaussian, placed last.

    Composition is commutative, so the canonical form has the same epsilon; it makes a run's planned
    events (σ calibration) and its recorded events (the ledger) the same list.
    """
    counts: dict[tuple[float, float], int] = {}
    for event in events:
        if not isinstance(event, StepEvent):
            raise ValueError(f"expected a StepEvent, got {type(event).__name__}")
        if event.count:
            counts[event.key] = counts.get(event.key, 0) + event.count
    return _canonical(counts)


def _canonical(counts: dict[tuple[float, float], int]) -> tuple[StepEvent, ...]:
    sampled = [StepEvent(q, sigma, n) for (q, sigma), n in sorted(counts.items()) if q < 1.0]
    plain = [(sigma, n) for (q, sigma), n in counts.items() if q == 1.0]
    if plain:
        sampled.append(StepEvent(1.0, gaussian_equivalent(plain), 1))
    return tuple(sampled)


def pld_discretization_interval(events: Sequence[StepEvent]) -> float:
    """PLD ``value_discretization_interval`` used for ``events`` (see the module docstring)."""
    scales = [
        e.sample_rate / e.noise_multiplier * max(1.0, e.noise_multiplier**-2)
        for e in events
        if e.count and e.noise_multiplier > 0
    ]
    if not scales:
        return _PLD_DISCRETIZATION_LEVELS[0]
    limit = _PLD_LOSS_SCALE_FRACTION * min(scales)
    for level in _PLD_DISCRETIZATION_LEVELS:
        if level <= limit:
            return level
    return DEFAULT_PLD_DISCRETIZATION


# -- Accountants -----------------------------------------------------------------------------------

@runtime_checkable
class Accountant(Protocol):
    """What raysim asks of an accountant: compose events, ε at δ, δ at ε, and a state for checkpoints.

    An implementation is registered by name (:func:`register_accountant`) and built by
    ``cls(cls.settings_for(events))``: ``settings_for`` chooses the numerical settings (a hashable value;
    the PLD's discretisation interval) for composing ``events``, and a ledger that needs other settings
    starts over. ``state()`` is a plain dict that ``cls.from_state`` rebuilds (what a checkpoint stores);
    ``copy()`` is an independent accountant with the same composition.
    """

    name: ClassVar[str]
    settings: Hashable

    @classmethod
    def settings_for(cls, events: Sequence[StepEvent]) -> Hashable: ...

    def compose(self, event: StepEvent) -> None: ...

    def epsilon(self, delta: float) -> float: ...

    def delta(self, epsilon: float) -> float: ...

    def copy(self) -> "Accountant": ...

    def state(self) -> dict[str, Any]: ...

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "Accountant": ...


_REGISTRY: dict[str, type] = {}


def register_accountant(cls: type) -> type:
    """Register an :class:`Accountant` class under ``cls.name`` (refuses duplicates); returns it."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"an accountant class needs a name, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"accountant {name!r} is already registered")
    missing = [m for m in ("settings_for", "compose", "epsilon", "delta", "copy", "state", "from_state")
               if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"accountant {name!r} lacks {', '.join(missing)}")
    _REGISTRY[name] = cls
    global ACCOUNTANTS
    ACCOUNTANTS = tuple(_REGISTRY)
    return cls


def accountant_class(name: str) -> type:
    """The registered accountant class called ``name``."""
    return _REGISTRY[_check_accountant(name)]


def new_accountant(name: str, events: Sequence[StepEvent] = ()) -> Accountant:
    """An empty accountant ``name`` with the settings for composing ``events``."""
    cls = accountant_class(name)
    return cls(cls.settings_for(events))


def accountant_from_state(state: Mapping[str, Any]) -> Accountant:
    """Rebuild an accountant from its ``state()``."""
    return accountant_class(state["name"]).from_state(state)


@functools.lru_cache(maxsize=64)
def _event_pld(sample_rate: float, noise_multiplier: float, count: int, discretization: float
               ) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of one :class:`StepEvent`, built exactly as dp-accounting's ``PLDAccountant`` builds it for
    ``to_dp_event()``, from the public constructors of ``dp_accounting.pld.privacy_loss_distribution``.
    Cached: a client's ledger composes the same round of events every round, and building a subsampled
    Gaussian's PLD costs far more than composing it."""
    points = _pld_points(noise_multiplier, discretization)
    if points > PLD_MAX_POINTS:
        raise AccountingError(
            f"the PLD accountant cannot build noise multiplier {noise_multiplier:g}: one step's privacy-loss "
            f"distribution would have about {points:.2g} points (at most {PLD_MAX_POINTS:.0e}); a σ this small "
            f"gives an ε of hundreds or more: use the rdp accountant")
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if sample_rate == 1.0:
        return privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=noise_multiplier / math.sqrt(count),
            value_discretization_interval=discretization, neighboring_relation=relation)
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier, value_discretization_interval=discretization,
        sampling_prob=sample_rate, neighboring_relation=relation).self_compose(count)


def _pld_points(noise_multiplier: float, discretization: float) -> float:
    """About how many points one Gaussian step's privacy-loss distribution has: the loss is affine in
    the noise, so it spans (1 + 2tσ)/σ² over the ±tσ that dp_accounting keeps (t ≈ 10, its tail
    truncation), in steps of ``discretization``. Subsampling narrows the span, never widens it."""
    return (1.0 + 20.0 * noise_multiplier) / noise_multiplier ** 2 / discretization


class PLDAccountant:
    """Privacy loss distributions (``dp_accounting.pld``), pessimistic connect-the-dots discretisation.

    Composes what ``dp_accounting.pld.PLDAccountant`` composes for ``StepEvent.to_dp_event()``, in the same
    order and with the same interval (the contract test checks equal ε and δ), through the public PLD
    API; each event's PLD comes from a cache (``cache=False`` builds it afresh, for the cache's test).
    """

    name: ClassVar[str] = "pld"

    def __init__(self, settings: float = _PLD_DISCRETIZATION_LEVELS[0], *, cache: bool = True) -> None:
        self.settings = float(settings)
        self._cache = cache
        self._loss = privacy_loss_distribution.identity(value_discretization_interval=self.settings)
        self._non_private = False

    @classmethod
    def settings_for(cls, events: Sequence[StepEvent]) -> float:
        return pld_discretization_interval(events)

    def compose(self, event: StepEvent) -> None:
        if not event.count:
            return
        if event.noise_multiplier == 0.0:
            self._non_private = True
            return
        build = _event_pld if self._cache else _event_pld.__wrapped__
        try:
            self._loss = self._loss.compose(build(event.sample_rate, event.noise_multiplier, event.count, self.settings))
        except MemoryError as exc:
            raise AccountingError(
                f"the PLD accountant ran out of memory composing {event.count} steps at sample rate "
                f"{event.sample_rate:g} and noise multiplier {event.noise_multiplier:g} ({exc}): use the rdp "
                f"accountant") from None

    def epsilon(self, delta: float) -> float:
        return math.inf if self._non_private else float(self._loss.get_epsilon_for_delta(delta))

    def delta(self, epsilon: float) -> float:
        return 1.0 if self._non_private else float(self._loss.get_delta_for_epsilon(epsilon))

    def copy(self) -> "PLDAccountant":
        out = PLDAccountant(self.settings, cache=self._cache)
        out._loss, out._non_private = self._loss, self._non_private   # composing makes a new PLD: sharing is safe
        return out

    def state(self) -> dict[str, Any]:
        return {"name": self.name, "settings": self.settings, "non_private": self._non_private, "pld": self._loss}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "PLDAccountant":
        out = cls(state["settings"])
        out._loss, out._non_private = state["pld"], bool(state["non_private"])
        return out


@functools.lru_cache(maxsize=1)
def _default_rdp_orders() -> tuple[float, ...]:
    return tuple(float(o) for o in rdp_privacy_accountant.RdpAccountant().orders)


class _ExcludedOrderFilter(logging.Filter):
    """Drops dp_accounting's warning that an RDP order's series did not converge: the order is +inf in
    the curve, so the conversion to (ε, δ) already leaves it out."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("_compute_log_a_frac failed to converge")


@functools.lru_cache(maxsize=1)
def _quiet_excluded_orders() -> None:
    # On absl's logger once dp_accounting has imported absl (creating that logger earlier would
    # give absl a plain Logger instead of its own class).
    logging.getLogger("absl").addFilter(_ExcludedOrderFilter())


class RDPAccountant:
    """Rényi DP at dp-accounting's default orders: each event's curve from ``dp_accounting.rdp.RdpAccountant``
    (its public ``rdp``), summed (RDP composes by addition), and converted by the module's public
    ``compute_epsilon`` / ``compute_delta``."""

    name: ClassVar[str] = "rdp"

    def __init__(self, settings: tuple[float, ...] | None = None) -> None:
        self.settings = tuple(float(o) for o in (settings if settings is not None else _default_rdp_orders()))
        self._curve = np.zeros(len(self.settings))

    @classmethod
    def settings_for(cls, events: Sequence[StepEvent]) -> tuple[float, ...]:
        return _default_rdp_orders()

    def compose(self, event: StepEvent) -> None:
        if not event.count:
            return
        acc = rdp_privacy_accountant.RdpAccountant(list(self.settings))
        _quiet_excluded_orders()
        acc.compose(event.to_dp_event())
        self._curve = self._curve + acc.rdp

    @property
    def curve(self) -> np.ndarray:
        """The composed RDP value at each order."""
        return self._curve.copy()

    def epsilon(self, delta: float) -> float:
        return float(rdp_privacy_accountant.compute_epsilon(list(self.settings), self._curve, delta)[0])

    def delta(self, epsilon: float) -> float:
        return float(rdp_privacy_accountant.compute_delta(list(self.settings), self._curve, epsilon)[0])

    def copy(self) -> "RDPAccountant":
        out = RDPAccountant(self.settings)
        out._curve = self._curve.copy()
        return out

    def state(self) -> dict[str, Any]:
        return {"name": self.name, "settings": list(self.settings), "rdp": self._curve.tolist()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RDPAccountant":
        out = cls(tuple(state["settings"]))
        out._curve = np.asarray(state["rdp"], dtype=np.float64)
        return out


register_accountant(PLDAccountant)
register_accountant(RDPAccountant)


def _compose(acc: Accountant, events: Sequence[StepEvent]) -> None:
    for e in events:
        if e.count:
            acc.compose(e)


def _epsilon_of(acc: Accountant, delta: float) -> float:
    eps = float(acc.epsilon(delta))
    # Numerical noise can give a tiny negative value for a near-identity mechanism.
    return max(eps, 0.0)


def compute_epsilon(events: Sequence[StepEvent], delta: float, accountant: str = "pld") -> float:
    """Epsilon at ``delta`` of the composition of all ``events`` (add/remove-one neighbours).

    Returns ``0.0`` for no steps and ``math.inf`` if any event with steps has no noise.
    """
    delta = _check_delta(delta)
    _check_accountant(accountant)
    merged = _merge(events)
    if not merged:
        return 0.0
    if any(e.noise_multiplier == 0.0 for e in merged):
        return math.inf
    acc = new_accountant(accountant, merged)
    _compose(acc, merged)
    return _epsilon_of(acc, delta)


def compute_epsilon_steps(
    sample_rate: float, noise_multiplier: float, steps: int, delta: float, accountant: str = "pld"
) -> float:
    """Epsilon of ``steps`` DP-SGD steps with Poisson rate ``sample_rate`` and noise ``noise_multiplier``."""
    return compute_epsilon([StepEvent(sample_rate, noise_multiplier, steps)], delta, accountant)


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    events_shape: Sequence[tuple[float, int]],
    accountant: str = "pld",
    *,
    tolerance: float = 1e-4,
    sigma_schedule: Sequence[float] | None = None,
    extra_events: Sequence[StepEvent] = (),
    hint: float | None = None,
) -> float:
    """Smallest noise multiplier sigma whose epsilon at ``delta`` is at most ``target_epsilon``.

    ``events_shape`` lists the planned run as ``(sample_rate, count)`` entries; entry j is run with
    noise multiplier ``sigma * sigma_schedule[j]`` (all ``sigma`` when no schedule is given, e.g. a
    decaying schedule ``gamma**t`` for DP-ACDN). The search (``_smallest_feasible``) evaluates ``compute_epsilon``
    itself with the same accountant, so ``compute_epsilon(events, delta, accountant) <=
    target_epsilon`` holds exactly for the returned sigma, and sigma / (1 + tolerance) exceeds it.
    ``tolerance`` is relative. ``extra_events`` (releases whose noise does not scale with sigma, e.g.
    a method's noised side channels) are composed into every evaluation.
    """
    target = _as_float("target_epsilon", target_epsilon)
    if not (target > 0.0 and math.isfinite(target)):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    delta = _check_delta(delta)
    _check_accountant(accountant)
    tol = _as_float("tolerance", tolerance)
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
    shape = list(events_shape)
    if not shape:
        raise ValueError("events_shape must list at least one (sample_rate, count) entry")
    if sigma_schedule is None:
        multipliers = [1.0] * len(shape)
    else:
        multipliers = [_as_float("sigma_schedule entry", m) for m in sigma_schedule]
        if len(multipliers) != len(shape):
            raise ValueError(
                f"sigma_schedule has {len(multipliers)} entries but events_shape has {len(shape)}"
            )
        if not all(m > 0.0 and math.isfinite(m) for m in multipliers):
            raise ValueError("sigma_schedule entries must be finite and > 0")
    for entry in shape:
        try:
            q, count = entry
        except (TypeError, ValueError):
            raise ValueError(f"events_shape entries must be (sample_rate, count), got {entry!r}") from None
        StepEvent(q, 1.0, count)  # validates q and count with a clear message
    if not any(count for _, count in shape):
        raise ValueError("events_shape has no steps: any sigma (even 0) gives epsilon 0")

    fixed = list(extra_events)

    def events_for(sigma: float) -> list[StepEvent]:
        return [StepEvent(q, sigma * m, n) for (q, n), m in zip(shape, multipliers)] + fixed

    return calibrate(events_for, target, delta, accountant, tolerance=tol, hint=hint)


def calibrate(events_for: Callable[[float], Sequence[StepEvent]], target_epsilon: float, delta: float,
              accountant: str = "pld", *, tolerance: float = 1e-4, hint: float | None = None) -> float:
    """Smallest sigma whose run ``events_for(sigma)`` has epsilon ≤ ``target_epsilon`` at ``delta``
    (after dp_accounting's ``mechanism_calibration``: one pure function from the parameter to the events).
    epsilon must decrease in sigma; the returned sigma's epsilon was computed and found within target.
    ``hint``, a sigma expected to be close (e.g. another client's), only speeds the search up."""
    return _smallest_feasible(lambda sigma: compute_epsilon(events_for(sigma), delta, accountant), target_epsilon,
                              tolerance, hint)


def smallest_noise(epsilon: Callable[[float], float], target_epsilon: float, *, tolerance: float = 1e-4,
                   hint: float | None = None) -> float:
    """Smallest sigma with ``epsilon(sigma) <= target_epsilon`` (``epsilon`` decreasing in sigma), for
    mechanisms whose epsilon is not a list of :class:`StepEvent` (client-level cohorts, tree aggregation).
    The returned sigma's epsilon was computed and found within target."""
    target = _as_float("target_epsilon", target_epsilon)
    if not (target > 0.0 and math.isfinite(target)):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    return _smallest_feasible(epsilon, target, tolerance, hint)


def _smallest_feasible(epsilon: Callable[[float], float], target: float, tol: float,
                       hint: float | None = None) -> float:
    """Smallest sigma with epsilon(sigma) <= target, to relative precision ``tol``.

    epsilon decreases in sigma and is close to a power law in it over a small range, so the search
    works on x = log(sigma) and g(x) = log(epsilon / target), starting from ``hint`` (or 1).
    Interpolation through the last evaluations (inverse quadratic, as in Brent's method, or secant)
    predicts the crossing, and each evaluation is aimed a fraction of ``tol`` beside the prediction,
    on the side that shrinks the bracket most, so that two evaluations can close it: 4-7
    evaluations on the accountants' curves. Flat pieces (a coarse discretisation) are handled by
    growing steps before the crossing is bracketed and by bisection after, whenever two steps did not
    halve the bracket. Every evaluation is remembered: the answer is a sigma whose epsilon was
    computed and found <= target, and a sigma whose epsilon was computed above target lies within
    ``tol`` below it.
    """
    points: list[tuple[float, float]] = []     # (x, g(x)) in evaluation order; g is ±inf for epsilon 0 / inf
    lo, hi = -math.inf, math.inf               # largest infeasible x, smallest feasible x
    step = math.log1p(tol)
    x_min, x_max, widest = math.log(_SIGMA_MIN), math.log(_SIGMA_MAX), math.log(4.0)

    def evaluate(x: float) -> None:
        nonlocal lo, hi
        try:
            value = epsilon(math.exp(x))
        except AccountingError as exc:
            raise AccountingError(f"searching the noise multiplier for epsilon {target:g}, at σ = {math.exp(x):.3g}: "
                                  f"{exc}") from None
        g = math.log(value / target) if 0.0 < value < math.inf else (-math.inf if value <= 0.0 else math.inf)
        points.append((x, g))
        if g <= 0.0:
            hi = min(hi, x)
        else:
            lo = max(lo, x)

    def predict() -> float | None:
        """Where g crosses zero, interpolated through the last three finite points (inverse quadratic,
        as in Brent's method) or, failing that, the last two (secant), while g decreases through them."""
        finite = [(x, g) for x, g in points if math.isfinite(g)][-3:]
        xs, gs = [x for x, _ in finite], [g for _, g in finite]
        if len(set(gs)) < len(gs) or len(set(xs)) < len(xs) or len(finite) < 2:
            return None
        if any((g1 - g0) / (x1 - x0) >= 0.0 for (x0, g0), (x1, g1) in zip(finite, finite[1:])):
            finite, xs, gs = finite[-2:], xs[-2:], gs[-2:]
            if (gs[1] - gs[0]) / (xs[1] - xs[0]) >= 0.0:
                return None
        return sum(x * math.prod(gj / (gj - gi) for j, gj in enumerate(gs) if j != i) for i, (x, gi) in enumerate(finite))

    evaluate(0.0 if hint is None else math.log(float(hint)))
    # Bracket the crossing, from the nearest point so far: the first step assumes epsilon ~ sigma**-2,
    # later ones interpolate, aiming just past the crossing; from the fourth step on, each at least
    # doubles the last (flat pieces), and none is more than a factor 4.
    last = 0.0
    while not (math.isfinite(lo) and math.isfinite(hi)):
        up = math.isinf(hi)    # nothing feasible yet
        base = lo if up else hi
        guess = predict()
        dx = None if guess is None else guess + (0.1 * step if up else -0.1 * step) - base
        if dx is None or (dx > 0.0) != up:
            g = next(g for x, g in points if x == base)
            dx = g / 2.0 if math.isfinite(g) else math.copysign(widest, g)
        floor = 2.0 * abs(last) if len(points) >= 4 else 0.5 * step
        last = dx = math.copysign(min(max(abs(dx), floor), widest), dx)
        x = base + dx
        if x > x_max:
            raise AccountingError(f"no noise multiplier up to {_SIGMA_MAX:g} reaches epsilon {target:g}")
        if x < x_min:
            raise AccountingError(f"epsilon {target:g} is reached with noise multiplier below {_SIGMA_MIN:g}: "
                                  "the target is too loose for this run")
        evaluate(x)
    # Close it: aim just beside the predicted crossing, or bisect when the last two steps did not halve it.
    widths = [hi - lo]
    while hi - lo > step:
        guess = predict()
        stalled = len(widths) >= 3 and widths[-1] > 0.5 * widths[-3]
        if guess is None or stalled or not lo < guess < hi:
            x = 0.5 * (lo + hi)
        else:
            x = guess + (0.1 * step if hi - guess > guess - lo else -0.1 * step)
            x = min(max(x, lo + 0.05 * step), hi - 0.05 * step)
        evaluate(x)
        widths.append(hi - lo)
    return math.exp(hi)


class PrivacyLedger:
    """Per-client ledger composing every DP release of one client.

    Records DP-SGD steps and any side channel (e.g. a noised validation F1 released once per
    round is ``StepEvent(1.0, sigma_f1, 1)``). Events with equal ``(q, sigma)`` are merged by adding
    their counts (composition is commutative), which keeps evaluation fast. ``epsilon()`` is cached
    until the next ``record`` and composes incrementally: only what was recorded since the last
    evaluation is added to the kept accountant state (unless a finer PLD discretisation is
    required, in which case it starts over).

    ``incremental=False`` keeps no accountant state: each evaluation composes the canonical events
    from scratch (:func:`compute_epsilon`, the list a calibration composes). Such a ledger is a few
    hundred bytes instead of the ~200 kB of a subsampled-Gaussian PLD, which is what a population of
    clients that each train in a few rounds needs (the driver keeps, and checkpoints, one per client).
    """

    def __init__(self, delta: float, accountant: str = "pld", incremental: bool = True) -> None:
        self._delta = _check_delta(delta)
        self._accountant_name = _check_accountant(accountant)
        self._incremental = bool(incremental)
        self._counts: dict[tuple[float, float], int] = {}
        self._cached: float | None = 0.0
        # Incremental state: an accountant that has composed ``_composed`` counts per key.
        self._acc: Accountant | None = None
        self._composed: dict[tuple[float, float], int] = {}

    @property
    def delta(self) -> float:
        return self._delta

    @property
    def accountant(self) -> str:
        return self._accountant_name

    @property
    def events(self) -> tuple[StepEvent, ...]:
        """The recorded events in canonical form (see :func:`compute_epsilon`): the same list a
        calibration that planned them composes, so the ledger's epsilon equals the planned one."""
        return _canonical(self._counts)

    def record(self, event: StepEvent) -> None:
        """Add ``event`` to the ledger (merged with an earlier event of the same ``(q, sigma)``)."""
        if not isinstance(event, StepEvent):
            raise ValueError(f"expected a StepEvent, got {type(event).__name__}")
        if event.count == 0:
            return
        self._counts[event.key] = self._counts.get(event.key, 0) + event.count
        self._cached = None

    def epsilon(self) -> float:
        """Epsilon at this ledger's delta of everything recorded so far."""
        if self._cached is None:
            self._cached = self._evaluate()
        return self._cached

    def _signature(self) -> tuple:
        return (self._accountant_name, self._delta, self._incremental, tuple(self._counts.items()))

    def _evaluate(self) -> float:
        events = self.events
        if not self._incremental:
            return compute_epsilon(events, self._delta, self._accountant_name)
        if any(e.noise_multiplier == 0.0 for e in events):
            return math.inf
        cls = accountant_class(self._accountant_name)
        settings = cls.settings_for(events)
        if self._acc is None or settings != self._acc.settings:
            self._acc = cls(settings)
            self._composed = {}
        # Subsampled steps compose incrementally; the plain Gaussian releases change their merged σ
        # every round, so they are composed onto a copy at each evaluation.
        sampled = {key: n for key, n in self._counts.items() if key[0] < 1.0}
        pending = [StepEvent(q, sigma, n - self._composed.get((q, sigma), 0)) for (q, sigma), n in sorted(sampled.items())]
        _compose(self._acc, [e for e in pending if e.count])
        self._composed = dict(sampled)
        plain = [e for e in events if e.sample_rate == 1.0]
        if not plain:
            return _epsilon_of(self._acc, self._delta)
        acc = self._acc.copy()
        _compose(acc, plain)
        return _epsilon_of(acc, self._delta)

    def _adopt(self, other: PrivacyLedger) -> None:
        """Take ``other``'s evaluated state; both ledgers hold the same events."""
        self._acc = other._acc.copy() if other._acc is not None else None
        self._composed = dict(other._composed)
        self._cached = other._cached

    def __reduce__(self) -> tuple:
        # A checkpoint stores the accountant's own state (``Accountant.state``), not the object.
        state = {k: v for k, v in self.__dict__.items() if k != "_acc"}
        state["_acc"] = self._acc.state() if self._acc is not None else None
        return (_restore_ledger, (state,))

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(delta={self._delta!r}, accountant={self._accountant_name!r}, "
            f"events={self.events!r})"
        )


def _restore_ledger(state: dict[str, Any]) -> PrivacyLedger:
    ledger = PrivacyLedger.__new__(PrivacyLedger)
    ledger.__dict__.update(state)
    ledger._acc = accountant_from_state(state["_acc"]) if state["_acc"] is not None else None
    return ledger


def epsilon_many(ledgers: Sequence[PrivacyLedger]) -> list[float]:
    """``[ledger.epsilon() for ledger in ledgers]``, evaluating each distinct ledger content once.

    Clients with equal sample rates (and so equal ledgers) cost one evaluation between them.
    """
    first_of: dict[tuple, PrivacyLedger] = {}
    out: list[float] = []
    for ledger in ledgers:
        if not isinstance(ledger, PrivacyLedger):
            raise ValueError(f"expected a PrivacyLedger, got {type(ledger).__name__}")
        representative = first_of.setdefault(ledger._signature(), ledger)
        eps = representative.epsilon()
        if representative is not ledger and ledger._cached is None:
            ledger._adopt(representative)
        out.append(eps)
    return out
