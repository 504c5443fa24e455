"""``raysim audit`` under ``privacy.unit=client``: canary clients (Andrew et al., ICLR 2024, "One-shot
empirical privacy estimation for federated learning").

The configured run trains as it would (every real client, the server's noise), with
M canary clients added to the population. Each canary's update is a fixed random direction u_j of norm
``canary_norm``·C (10 C), far above the clip norm. A canary is inserted (a member) with probability 1/2;
a member joins each round's cohort independently with the run's sampling rate q = k/N, and its update
goes through the same client-side clipping (:func:`raysim.privacy.clipping.clip_update`) into the same
noised sum as the real clients' updates. After the last round, each canary is scored by the cosine of
the final model change w_T − w_0 with u_j.

Two readings of the scores, printed beside the ε accounted for the run:

* the one-shot estimate of Andrew et al.: the members' and the non-members' cosines are taken as
  Gaussians with the pooled standard deviation, and the ε at δ of telling them apart is that of μ-GDP
  with μ = (mean_in − mean_out)/std (an estimate, not a bound);
* the membership-guess lower bound of Steinke, Nasr & Jagielski 2023 (:mod:`raysim.privacy.audit_bound`):
  the top and bottom ``guess_fraction`` of the scores guessed in and out, a 95 %-confidence lower bound
  ε_lb, with its ceiling (the ε_lb of every guess right).

A clipping bug lets the canaries' 10 C through, and noise below what is accounted shrinks the spread of
the non-members' scores: both raise ε_lb above the claim. Canary clients are clients, so adding or
removing one is the client unit's adjacency; their updates are data-independent, so the bound holds for
whatever the real clients hold.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy import optimize, stats

from raysim.algorithms.registry import get_method, resolve_preset
from raysim.algorithms.uploads import UploadContext
from raysim.config import Config, ConfigError
from raysim.experiment import prepare
from raysim.messages import ClientResult, ClientTask
from raysim.privacy import clipping
from raysim.privacy.audit_bound import epsilon_lower_bound
from raysim.rng import np_generator, torch_generator
from raysim.simulation import Executor, Simulation

__all__ = ["ClientAuditResult", "run_client_audit", "gdp_epsilon"]


class ClientAuditError(ConfigError):
    """The canary-client audit cannot run for this configuration (one line, exit code 2)."""


@dataclass(frozen=True)
class ClientAuditResult:
    epsilon_lower_bound: float     # Steinke et al., 95 % confidence
    epsilon_ceiling: float         # the largest ε_lb this audit can reach
    epsilon_estimate: float        # Andrew et al.'s one-shot estimate (Gaussian fit)
    epsilon_accounted: float       # the run's population ε, as accounted
    delta: float
    noise_multiplier: float
    canaries: int
    members: int
    guesses: int
    correct: int
    rounds: int
    insertions: int                # canary updates inserted over the run
    canary_norm: float             # each canary's update norm before clipping, in units of C
    unit: str = "client"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gdp_epsilon(mu: float, delta: float) -> float:
    """ε at δ of μ-Gaussian DP (Dong, Roth & Su): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    if mu <= 0:
        return 0.0

    def gap(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)) - delta

    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        hi *= 2.0
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-9))


def _direction(seed: int, j: int, size: int) -> torch.Tensor:
    """Canary j's unit direction (float32), drawn from its own stream, so it is regenerated, not stored."""
    gen = torch_generator(seed, "audit-canary-client", 0, j)
    u = torch.empty(size, dtype=torch.float32).normal_(0.0, 1.0, generator=gen)
    return u / u.norm()


def run_client_audit(cfg: Config, executor: Executor, canaries: int = 1000, guess_fraction: float = 0.1,
                     canary_norm: float = 10.0) -> ClientAuditResult:
    """Audit the client-level mechanism of ``cfg`` with canary clients (see the module docstring), training
    on ``executor`` (the CLI gives the serial executor: the canaries join each round in this process)."""
    if canaries < 10:
        raise ConfigError(f"--canaries must be >= 10, got {canaries}")
    if not 0 < guess_fraction <= 0.5:
        raise ConfigError(f"--guess-fraction must be in (0, 0.5], got {guess_fraction}")
    cfg = resolve_preset(cfg)
    if cfg.privacy.unit != "client":
        raise ClientAuditError("the canary-client audit is for privacy.unit=client")
    if cfg.privacy.mechanism != "gaussian":
        raise ClientAuditError("the canary-client audit samples canaries like Poisson cohorts; "
                               "privacy.mechanism=tree (a shuffled pass) is not audited")
    spec = get_method(cfg.method)
    kinds = {u.release.kind for u in spec.uploads(cfg)} - {"joint", "diagnostic"}
    if kinds:
        raise ClientAuditError(f"method {cfg.method!r} uploads values ({', '.join(sorted(kinds))}) that canary "
                               f"clients cannot make; the audit covers methods whose uploads are the update and "
                               f"its joint count")
    train, test = prepare(cfg)
    sim = Simulation(cfg, train, test, executor)
    plan = sim.server.ctx.client_level
    d = int(sim.weights.numel())
    start = sim.weights.clone()
    members = np_generator(cfg.seed, "audit-canary-membership").random(canaries) < 0.5
    member_ids = np.flatnonzero(members)
    q = plan.sample_rate if plan.sampling != "uniform" else (cfg.clients_per_round or cfg.num_clients) / cfg.num_clients
    uploads = spec.uploads(cfg)
    inserted = [0]

    def canary_results(server_round: int) -> list[ClientResult]:
        rng = np_generator(cfg.seed, "audit-canary-cohort", server_round)
        chosen = member_ids[rng.random(len(member_ids)) < q]
        clip_norm = float(sim.server.clip_norm(server_round))
        out = []
        for j in chosen:
            task = ClientTask(cfg.num_clients + int(j), server_round, clip_norm, 0.0)
            # The same client-side clipping as every real client (looked up at call time).
            delta, norm = clipping.clip_update(_direction(cfg.seed, int(j), d) * (canary_norm * clip_norm), clip_norm)
            ctx = UploadContext(cfg=cfg, task=task, model=None, delta=delta, num_samples=0, num_steps=0,
                                frac_clipped=float(norm > clip_norm), val_x=None, val_y=None,
                                num_classes=0, layer_slices=(), example_norms=None, update_norm=norm,
                                rng=lambda purpose: np_generator(cfg.seed, purpose, server_round, task.client_id))
            values = {u.name: u.compute(ctx) for u in uploads if u.release.kind == "joint"}
            out.append(ClientResult(task.client_id, server_round, 0, 0, delta, math.nan, float(norm > clip_norm),
                                    uploads=values))
        inserted[0] += len(out)
        return out

    sim.extra_results = canary_results
    try:
        for _record in sim.run():
            pass
    finally:
        sim.executor.shutdown()
    moved = (sim.weights - start).double()
    if not bool(torch.isfinite(moved).all()):
        raise ClientAuditError("the audited training diverged (non-finite weights), so no canary can be scored")
    norm = float(moved.norm())
    scores = np.array([float(moved @ _direction(cfg.seed, j, d).double()) / norm if norm > 0 else 0.0
                       for j in range(canaries)])
    k = max(1, int(guess_fraction * canaries))
    order = np.argsort(scores, kind="stable")
    correct = int(members[order[-k:]].sum() + (~members[order[:k]]).sum())
    delta = cfg.privacy.delta
    inside, outside = scores[members], scores[~members]
    pooled = math.sqrt((inside.var(ddof=1) * (len(inside) - 1) + outside.var(ddof=1) * (len(outside) - 1))
                       / (len(scores) - 2))
    estimate = gdp_epsilon(float(inside.mean() - outside.mean()) / pooled, delta) if pooled > 0 else math.inf
    return ClientAuditResult(
        epsilon_lower_bound(canaries, 2 * k, correct, delta), epsilon_lower_bound(canaries, 2 * k, 2 * k, delta),
        estimate, float(sim.epsilons.max()), delta, plan.sigma, canaries, int(members.sum()), 2 * k, correct,
        cfg.rounds, inserted[0], canary_norm)
