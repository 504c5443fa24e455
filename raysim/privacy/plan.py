"""The privacy plan of a run: clipping mode, per-client σ, and what each round costs.

Privacy model (docs/privacy.md): record-level DP per client (add/remove one example of one client),
honest-but-curious server, each client accounted separately. Per round, client i makes
τ_i = E·⌈n_i/B⌉ Poisson-subsampled Gaussian releases with q_i = B/n_i, plus whatever side
channels the method adds (e.g. a noised validation F1). With ``privacy.epsilon`` given, σ_i is
calibrated for the whole planned run (every round client i takes part in, every release) so it ends
at ε without exceeding it. Under partial participation (``clients_per_round``) the participation
schedule is public and drawn up front, so each client is planned for exactly its own rounds
(:class:`ParticipationPlan`), lazily, the first time it trains.

Every function here takes the run's config with its method's presets already resolved
(done once, when the run is planned: ``raysim.run_plan.plan_run``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from raysim.algorithms.base import MethodSpec
from raysim.algorithms.uploads import check_uncovered, gaussian_uploads, not_covered_text, uncovered_keys
from raysim.config import UPDATE_CLIPPING, Config, ConfigError
from raysim.privacy.accounting import gaussian_equivalent, StepEvent, calibrate_noise_multiplier, compute_epsilon
from raysim.privacy.clipping import accounting_noise_multiplier


def resolve_clipping(spec: MethodSpec, cfg: Config) -> str:
    """``privacy.clipping = auto``: DP methods use per_sample; non-private methods use per_sample
    only when a privacy budget or σ is given, else none. Under ``privacy.unit=client``: ``update`` (the
    whole update clipped), for a method that supports that unit."""
    p = cfg.privacy
    dp_requested = p.epsilon is not None or p.noise_multiplier is not None
    if p.unit == "client":
        reason = spec.client_level(cfg)
        if reason is not None:
            raise ConfigError(f"method {spec.name!r} does not run under privacy.unit=client: {reason}")
        if not dp_requested:
            raise ConfigError("privacy.unit=client needs privacy.epsilon (target ε) or privacy.noise_multiplier (σ)")
        spec.validate(cfg, UPDATE_CLIPPING)
        from raysim.privacy.population import check_mechanism
        check_mechanism(cfg, spec.server.sigma_schedule(cfg),
                        any(u.release.kind == "joint" for u in spec.uploads(cfg)))
        check_uncovered(spec.uploads(cfg), UPDATE_CLIPPING, p.unit, p.allow_uncovered)   # fail closed
        return UPDATE_CLIPPING
    mode = p.clipping
    if mode == "auto":
        mode = "per_sample" if (spec.private or dp_requested) else "none"
    if mode == "none":
        if spec.private:
            raise ConfigError(f"method {spec.name!r} is differentially private; privacy.clipping=none is not allowed "
                              f"(use method fedavg for a non-private reference)")
        if dp_requested:
            raise ConfigError("privacy.clipping=none but privacy.epsilon/noise_multiplier is set; drop one of them")
        return mode
    if not dp_requested:
        raise ConfigError(f"method {spec.name!r} with privacy.clipping={mode} needs privacy.epsilon (target ε) "
                          f"or privacy.noise_multiplier (σ)")
    check_correlated_steps(spec, cfg, mode)
    spec.validate(cfg, mode)
    check_uncovered(spec.uploads(cfg), mode, p.unit, p.allow_uncovered)   # fail closed (docs/privacy.md)
    return mode


def check_correlated_steps(spec: MethodSpec, cfg: Config, mode: str) -> None:
    """Correlated noise on DP-SGD steps (``privacy.unit=example``, a correlated ``privacy.mechanism``) is
    accounted for one release a step of per-example clipped gradients at one σ for the whole run."""
    from raysim.config import client_mechanism
    mech = client_mechanism(cfg.privacy.mechanism)
    if not mech.correlated:
        return
    why = None
    if mode != "per_sample":
        why = f"it needs privacy.clipping=per_sample (each example's gradient clipped), got {mode}"
    elif spec.client.releases_for(cfg) != 1:
        why = f"method {spec.name!r} makes {spec.client.releases_for(cfg)} DP releases a step, and the strategy has one"
    elif not np.all(np.asarray(spec.server.sigma_schedule(cfg)) == 1.0):
        why = f"method {spec.name!r} changes σ by round, and the strategy's noise has one scale"
    if why is not None:
        raise ConfigError(f"privacy.mechanism={mech.name} on DP-SGD steps: {why}")


def accounting_factor(mode: str, releases_per_step: int) -> float:
    """σ_accounted / σ_noise: batch clipping halves it (sensitivity 2C); k Gaussian releases on
    the same Poisson batch compose to one with σ/√k."""
    return accounting_noise_multiplier(mode, 1.0) / math.sqrt(releases_per_step)


@dataclass(frozen=True)
class SideChannel:
    """A per-round Gaussian release outside DP-SGD (its own fixed σ, sensitivity 1 after scaling)."""

    name: str
    noise_multiplier: float
    per_round: int = 1


def side_channels(spec: MethodSpec, cfg: Config) -> list[SideChannel]:
    """The Gaussian releases the method declares for its clients (``MethodSpec.uploads``)."""
    return [SideChannel(u.name, u.release.noise_multiplier, u.release.per_round)
            for u in gaussian_uploads(spec.uploads(cfg))]


def not_covered(spec: MethodSpec, cfg: Config, clipping: str) -> str:
    """Human-readable list of values computed from private data that ε does not cover."""
    return not_covered_text(spec.uploads(cfg), clipping, cfg.privacy.unit)


def epsilon_exceptions(spec: MethodSpec, cfg: Config, clipping: str) -> str:
    """The runs table's ``epsilon_exceptions``: the opt-in keys of the uploads ε does not cover under the run's
    unit, comma-separated ("" when ε covers every upload)."""
    return ", ".join(uncovered_keys(spec.uploads(cfg), clipping, cfg.privacy.unit))


def channels_event(channels: Sequence[SideChannel], rounds: int) -> StepEvent | None:
    """All side-channel releases of ``rounds`` rounds as one exactly equivalent Gaussian event."""
    if not channels:
        return None
    sigma = gaussian_equivalent([(c.noise_multiplier, c.per_round * rounds) for c in channels])
    return StepEvent(1.0, sigma, 1)


def round_events(q: float, steps: int, sigma: float, factor: float, channels: Sequence[SideChannel]) -> list[StepEvent]:
    """One client's releases of one round: its DP-SGD steps and its side channels (merged)."""
    events = [StepEvent(q, sigma * factor, steps)]
    side = channels_event(channels, 1)
    return events + ([side] if side is not None else [])


def calibrate_sigma(cfg: Config, q: float, steps: int, schedule: np.ndarray, factor: float,
                    channels: Sequence[SideChannel], hint: float | None = None) -> float:
    """Smallest σ such that the planned run of this client ends at ε ≤ target (through the accountant).

    The side channels of all rounds are one Gaussian event (exact, :func:`channels_event`), and rounds
    with the same relative σ are one self-composed event, so each evaluation composes at most a few events.
    """
    p = cfg.privacy
    if p.epsilon is None:
        raise ValueError("calibration needs privacy.epsilon")
    side = channels_event(channels, len(schedule))
    fixed = [side] if side is not None else []
    if fixed and compute_epsilon(fixed, p.delta, p.accountant) >= p.epsilon:
        raise ConfigError(f"the side channels alone ({', '.join(c.name for c in channels)}) spend more than "
                          f"privacy.epsilon={p.epsilon}; raise their noise multipliers")
    scales, counts = np.unique(np.asarray(schedule, dtype=np.float64), return_counts=True)
    return _calibrate(float(p.epsilon), float(p.delta), p.accountant, tuple((float(q), steps * int(c)) for c in counts),
                      tuple(float(s * factor) for s in scales), tuple(fixed), hint)


@functools.lru_cache(maxsize=512)
def _calibrate(epsilon: float, delta: float, accountant: str, shape: tuple[tuple[float, int], ...],
               multipliers: tuple[float, ...], fixed: tuple[StepEvent, ...], hint: float | None) -> float:
    # A pure function of its (hashable) arguments, the hint included, so remembering it changes no
    # result; runs that share a privacy plan (the methods of a sweep on one partition) calibrate once.
    return calibrate_noise_multiplier(epsilon, delta, list(shape), accountant, sigma_schedule=list(multipliers),
                                      extra_events=fixed, hint=hint)


def plan_noise(spec: MethodSpec, cfg: Config, clipping: str, q: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """σ_i per client: given, calibrated (clients with equal (q, τ) share one calibration), or 0."""
    if clipping == "none":
        return np.zeros(len(q))
    if cfg.privacy.noise_multiplier is not None:
        return np.full(len(q), float(cfg.privacy.noise_multiplier))
    schedule = spec.server.sigma_schedule(cfg)
    factor = accounting_factor(clipping, spec.client.releases_for(cfg))
    channels = side_channels(spec, cfg)
    # Clients in order of their sample rate, each search started from its neighbour's answer.
    keys = sorted({(float(qi), int(si)) for qi, si in zip(q, steps)})
    found: dict[tuple[float, int], float] = {}
    previous = None
    for key in keys:
        found[key] = previous = calibrate_sigma(cfg, key[0], key[1], schedule, factor, channels, hint=previous)
    return np.array([found[(float(qi), int(si))] for qi, si in zip(q, steps)])


class ParticipationPlan:
    """σ_i per client under partial participation, each client planned for exactly its own rounds.

    ``rounds_of[i]`` lists the (1-based) rounds client i trains in, from the public participation
    schedule. With ``privacy.epsilon`` set, σ_i is calibrated (:func:`calibrate_sigma`) on the method's
    σ schedule restricted to those rounds, the first time :meth:`sigma` is asked for it, and memoised by
    its key (q_i, τ_i, the multiset of its rounds' schedule values), so set-up cost does not grow with the
    population and clients that never train are never calibrated. The calibration is started without a
    hint, so σ_i is a pure function of its key: the same whatever order clients are planned in, before or
    after a resume.
    """

    def __init__(self, spec: MethodSpec, cfg: Config, clipping: str, q: np.ndarray, steps: np.ndarray,
                 rounds_of: Sequence[np.ndarray]) -> None:
        self.cfg = cfg
        self.clipping = clipping
        self.q = np.asarray(q, dtype=np.float64)
        self.steps = np.asarray(steps, dtype=np.int64)
        self.rounds_of = rounds_of
        self.schedule = np.asarray(spec.server.sigma_schedule(cfg), dtype=np.float64)
        self.factor = accounting_factor(clipping, spec.client.releases_for(cfg)) if clipping != "none" else 0.0
        self.channels = side_channels(spec, cfg) if clipping != "none" else []
        self.memo: dict[tuple, float] = {}
        most = max((len(r) for r in rounds_of), default=0)
        side = channels_event(self.channels, most) if self.channels and most else None
        p = cfg.privacy
        if side is not None and p.epsilon is not None and compute_epsilon([side], p.delta, p.accountant) >= p.epsilon:
            # Checked up front (one evaluation), not when the busiest client first trains.
            raise ConfigError(f"the side channels alone ({', '.join(c.name for c in self.channels)}) spend more "
                              f"than privacy.epsilon={p.epsilon} over a client's {most} rounds; raise their noise "
                              f"multipliers")

    def key(self, client_id: int) -> tuple:
        """(q_i, τ_i, ((schedule value, rounds with it), ...)): clients with equal keys share σ."""
        scales, counts = np.unique(self.schedule[self.rounds_of[client_id] - 1], return_counts=True)
        return (float(self.q[client_id]), int(self.steps[client_id]),
                tuple((float(s), int(c)) for s, c in zip(scales, counts)))

    def sigma(self, client_id: int) -> float:
        """σ_i (before the per-round schedule); raises for a client with no rounds under calibration."""
        if self.clipping == "none":
            return 0.0
        if self.cfg.privacy.noise_multiplier is not None:
            return float(self.cfg.privacy.noise_multiplier)
        rounds = self.rounds_of[client_id]
        if len(rounds) == 0:
            raise ValueError(f"client {client_id} takes part in no round: it has no noise multiplier to plan")
        key = self.key(client_id)
        if key not in self.memo:
            self.memo[key] = calibrate_sigma(self.cfg, key[0], key[1], self.schedule[rounds - 1], self.factor,
                                             self.channels)
        return self.memo[key]
