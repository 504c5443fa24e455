"""The privacy plan of a run: clipping mode, per-client σ, and what each round costs.

Privacy model (SPEC §2): record-level DP per client (add/remove one example of one client),
honest-but-curious server, each client accounted separately. Per round, client i makes
τ_i = E·⌈n_i/B⌉ Poisson-subsampled Gaussian releases with q_i = B/n_i, plus whatever side
channels the method adds (e.g. a noised validation F1). With ``privacy.epsilon`` given, σ_i is
calibrated for the whole planned run (all T rounds, every release) so it ends at ε without
exceeding it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from raysim.algorithms.base import MethodSpec
from raysim.config import Config, ConfigError
from raysim.privacy.accounting import StepEvent, calibrate_noise_multiplier, compute_epsilon
from raysim.privacy.clipping import accounting_noise_multiplier


def resolve_clipping(spec: MethodSpec, cfg: Config) -> str:
    """``privacy.clipping = auto``: DP methods use per_sample; non-private methods use per_sample
    only when a privacy budget or σ is given, else none."""
    p = cfg.privacy
    dp_requested = p.epsilon is not None or p.noise_multiplier is not None
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
    return mode


def accounting_factor(mode: str, releases_per_step: int) -> float:
    """σ_accounted / σ_noise: batch clipping halves it (sensitivity 2C); k Gaussian releases on
    the same Poisson batch compose to one with σ/√k."""
    return accounting_noise_multiplier(mode, 1.0) / math.sqrt(releases_per_step)


@dataclass(frozen=True)
class SideChannel:
    """A per-round release outside DP-SGD (its own fixed σ, sensitivity 1 after scaling)."""

    name: str
    noise_multiplier: float
    per_round: int = 1


def _quantile_bits_private(spec: MethodSpec, cfg: Config) -> bool:
    # Adaptive quantile clipping reads private data (per-example clip counts) unless its bits come
    # from the uploaded Δw_i (quantile.norm_source = update), which is post-processing.
    return spec.name == "dp-fedavg-adaptive" and cfg.quantile.norm_source == "per_example"


def side_channels(spec: MethodSpec, cfg: Config) -> list[SideChannel]:
    out = []
    if spec.server.uses_val_f1 and cfg.cra.private_val_f1:
        out.append(SideChannel("val_f1", cfg.cra.val_f1_noise_multiplier))
    if _quantile_bits_private(spec, cfg) and cfg.quantile.noise_multiplier > 0:
        out.append(SideChannel("clipped_count", cfg.quantile.noise_multiplier))
    return out


def not_covered(spec: MethodSpec, cfg: Config, clipping: str) -> str:
    """Human-readable list of uploaded values computed from private data that ε does not cover."""
    items = []
    if clipping == "none":
        return "everything (no DP)"
    if spec.server.uses_val_f1 and not cfg.cra.private_val_f1:
        items.append("val_f1 (q_i, CRA's local validation macro-F1, uploaded without noise)")
    if _quantile_bits_private(spec, cfg) and cfg.quantile.noise_multiplier == 0:
        items.append("clipped-count bits b_i of the adaptive quantile (quantile.noise_multiplier = 0)")
    return "; ".join(items)


def round_events(q: float, steps: int, sigma: float, factor: float, channels: Sequence[SideChannel]) -> list[StepEvent]:
    events = [StepEvent(q, sigma * factor, steps)]
    events += [StepEvent(1.0, c.noise_multiplier, c.per_round) for c in channels]
    return events


def calibrate_sigma(cfg: Config, q: float, steps: int, schedule: np.ndarray, factor: float,
                    channels: Sequence[SideChannel]) -> float:
    """Smallest σ such that the planned run of this client ends at ε ≤ target (through the accountant)."""
    p = cfg.privacy
    assert p.epsilon is not None
    if not channels:
        if np.all(schedule == schedule[0]):   # one self-composed event is much faster to account
            return calibrate_noise_multiplier(p.epsilon, p.delta, [(q, steps * len(schedule))], p.accountant,
                                              sigma_schedule=[float(schedule[0] * factor)])
        return calibrate_noise_multiplier(p.epsilon, p.delta, [(q, steps)] * len(schedule), p.accountant,
                                          sigma_schedule=list(schedule * factor))
    fixed = [StepEvent(1.0, c.noise_multiplier, c.per_round * len(schedule)) for c in channels]
    if compute_epsilon(fixed, p.delta, p.accountant) >= p.epsilon:
        raise ConfigError(f"the side channels alone ({', '.join(c.name for c in channels)}) spend more than "
                          f"privacy.epsilon={p.epsilon}; raise their noise multipliers")

    # Rounds with the same relative σ are one self-composed event: far cheaper to account.
    scales, counts = np.unique(np.asarray(schedule, dtype=np.float64), return_counts=True)

    def eps(sigma: float) -> float:
        events = [StepEvent(q, sigma * float(s) * factor, steps * int(c)) for s, c in zip(scales, counts)]
        return compute_epsilon(events + fixed, p.delta, p.accountant)

    lo, hi = 1e-3, 1.0
    while eps(hi) > p.epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ConfigError(f"cannot reach privacy.epsilon={p.epsilon}")
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if eps(mid) > p.epsilon:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-4:
            break
    return hi


def plan_noise(spec: MethodSpec, cfg: Config, clipping: str, q: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """σ_i per client: given, calibrated (clients with equal (q, τ) share one calibration), or 0."""
    if clipping == "none":
        return np.zeros(len(q))
    if cfg.privacy.noise_multiplier is not None:
        return np.full(len(q), float(cfg.privacy.noise_multiplier))
    schedule = spec.server.sigma_schedule(cfg)
    factor = accounting_factor(clipping, spec.client.releases_for(cfg))
    channels = side_channels(spec, cfg)
    cache: dict[tuple[float, int], float] = {}
    out = np.empty(len(q))
    for i, (qi, si) in enumerate(zip(q, steps)):
        key = (float(qi), int(si))
        if key not in cache:
            cache[key] = calibrate_sigma(cfg, key[0], key[1], schedule, factor, channels)
        out[i] = cache[key]
    return out
