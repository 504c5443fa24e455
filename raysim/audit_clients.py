"""``raysim audit`` under ``privacy.unit=client``: canary clients (Andrew et al., ICLR 2024, "One-shot
empirical privacy estimation for federated learning").

The configured run trains as it would (every real client, the server's noise), with M canary clients
added to the population. A canary is a client without data whose local training yields a fixed random
direction u_j of norm ``canary_norm``·C (10 C), far above the clip norm: it is a task of the round like
any other, trained by the same :meth:`raysim.client.ClientRunner.train` (the one branch it takes is that
its local training returns u_j instead of running SGD). Everything after local training is the real
clients' code: the update formed, clipped and uploaded by the runner, summed with the others by the
server and noised there. A canary is inserted (a member) with probability 1/2; a member joins each
round's cohort independently with the simulated clients' rate q = k/N (under ``privacy.mechanism=tree``,
once in every pass over the population, in a round of the pass drawn for it, as the shuffled passes
take every real client once), at a random position among that round's clients (so a bug that depends
on the order in which clients train reaches canaries as often as the real clients they stand among).

The auditor sees every round's release, as the accounting assumes. From the members' and the
non-members' canaries (:mod:`raysim.privacy.audit_bound`):

* two 95 %-confidence lower bounds, Steinke, Nasr & Jagielski's and Mahloujifar et al.'s f-DP bound,
  from one-sided guesses on each canary's score, the largest cosine over the rounds of the round's
  model change w_t − w_{t−1} with u_j (under the tree also of each prefix of the pass, w_t − w_pass),
  with the threshold chosen on the scores (Bonferroni over the thresholds); each with its ceiling (the
  bound of perfectly separated scores at this canary count);
* Andrew et al.'s one-shot estimate, from the cosine of the final model change w_T − w_0 with u_j: the
  members' and the non-members' cosines fitted by Gaussians of their own means and standard
  deviations, and the ε at δ of telling the two apart (an estimate, not a bound).

The bounds are judged against the ε of the clients audited: the simulated population's, under the
noise the simulated clients get. With noise sized for a deployment (``privacy.noise_cohort_size``,
``privacy.population_size``) that ε is the simulated clients' own, under σ'·k/k', far above the
deployment's ε, which is shown beside it. Canary clients are clients, so adding or removing one is the
client unit's adjacency; their updates are data-independent, so the bounds hold for whatever the real
clients hold.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from raysim.config import Config, ConfigError
from raysim.experiment import prepare
from raysim.messages import ClientTask
from raysim.privacy.accounting import AccountingError
from raysim.privacy.audit_bound import epsilon_two_gaussians, score_audit, score_audit_ceiling
from raysim.privacy.mechanisms.registry import get_mechanism
from raysim.rng import np_generator, torch_generator
from raysim.run_plan import RunPlan, plan_run
from raysim.simulation import Executor, Simulation, TrainingDiverged

__all__ = ["ClientAuditResult", "run_client_audit", "audited_epsilon"]


class ClientAuditError(ConfigError):
    """The canary-client audit cannot run for this configuration (one line, exit code 2)."""


@dataclass(frozen=True)
class ClientAuditResult:
    epsilon_lower_bound: float     # Steinke et al., 95 % confidence
    epsilon_lower_bound_fdp: float   # Mahloujifar et al. (f-DP), 95 % confidence
    epsilon_ceiling: float         # the largest Steinke bound this canary count can reach
    epsilon_ceiling_fdp: float     # the largest f-DP bound this canary count can reach
    epsilon_estimate: float        # Andrew et al.'s one-shot estimate (two Gaussians)
    epsilon_audited: float         # the ε of the clients audited: the simulated population's
    epsilon_accounted: float       # the run's ε as it reports it (the deployment's when noise is sized for one)
    audited_scope: str
    accounted_scope: str
    delta: float
    noise_multiplier: float        # σ the simulated clients' sum gets, relative to C
    canaries: int
    members: int
    thresholds: int                # thresholds the significance is divided among
    guesses: int                   # one-sided guesses at the threshold of the f-DP bound
    correct: int
    rounds: int
    insertions: int                # canary updates inserted over the run
    canary_norm: float             # each canary's update norm before clipping, in units of C
    unit: str = "client"

    @property
    def refutes(self) -> bool:
        """Whether either bound exceeds the ε of the clients audited."""
        return max(self.epsilon_lower_bound, self.epsilon_lower_bound_fdp) > self.epsilon_audited

    @property
    def can_refute(self) -> bool:
        """Whether the f-DP ceiling is above the ε of the clients audited (else no outcome refutes it)."""
        return self.epsilon_ceiling_fdp > self.epsilon_audited

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "refutes": self.refutes, "can_refute": self.can_refute}


def audited_epsilon(cfg: Config, plan: Any) -> tuple[float, str]:
    """The simulated clients' own ε after the run of a deployment-sized plan, and the accountant that gave
    it. Under a deployment's noise (σ' sized for k' of N') the simulated average carries σ'C/k' of noise, so
    the sum of the k simulated clients carries σ'·k/k' times C: their own σ, for the simulated population
    (N clients, its cohorts). The run's accountant gives it, or RDP where PLD cannot (a σ so small that
    its ε is in the hundreds or more)."""
    sampling = "full" if cfg.clients_per_round is None else cfg.participation
    sigma = plan.sigma * plan.denominator / plan.cohort
    for accountant in dict.fromkeys((plan.accountant, "rdp")):
        simulated = replace(plan, sampling=sampling, population=cfg.num_clients, cohort=plan.denominator,
                            accountant=accountant)
        try:
            return float(plan.spec.epsilon(simulated, sigma, len(plan.schedule))), accountant
        except AccountingError:
            continue
    raise ClientAuditError(f"no accountant gives the simulated clients' ε at σ = {sigma:.4g}")


def _direction(seed: int, j: int, size: int) -> torch.Tensor:
    """Canary j's unit direction (float32), drawn from its own stream, so it is regenerated, not stored."""
    gen = torch_generator(seed, "audit-canary-client", 0, j)
    u = torch.empty(size, dtype=torch.float32).normal_(0.0, 1.0, generator=gen)
    return u / u.norm()


def run_client_audit(plan: RunPlan | Config, executor: Executor, canaries: int = 1000,
                     canary_norm: float = 10.0) -> ClientAuditResult:
    """Audit the client-level mechanism of the run ``plan`` (a config is planned first) with canary clients
    (see the module docstring), training on ``executor``, which must train in this process (the CLI gives the serial executor)."""
    if canaries < 10:
        raise ConfigError(f"--canaries must be >= 10, got {canaries}")
    plan = plan_run(plan)
    cfg = plan.cfg
    if cfg.privacy.unit != "client":
        raise ClientAuditError("the canary-client audit is for privacy.unit=client")
    if not get_mechanism(cfg.privacy.mechanism).canary_audit:
        raise ClientAuditError(f"the canary-client audit draws its canaries as the gaussian mechanism's cohorts and "
                               f"the tree's passes; privacy.mechanism={cfg.privacy.mechanism} is not audited")
    spec = plan.spec
    kinds = {u.release.kind for u in spec.uploads(cfg)} - {"joint", "diagnostic"}
    if kinds:
        raise ClientAuditError(f"method {cfg.method!r} uploads values ({', '.join(sorted(kinds))}) that canary "
                               f"clients cannot make; the audit covers methods whose uploads are the update and "
                               f"its joint count")
    train, test = prepare(plan)
    sim = Simulation(plan, train, test, executor)
    runner = getattr(sim.executor, "runner", None)
    if runner is None:
        sim.executor.shutdown()
        raise ClientAuditError("the canary-client audit trains its canaries in this process: use the serial executor")
    plan = sim.server.ctx.client_level
    n, d = cfg.num_clients, int(sim.weights.numel())
    members = np_generator(cfg.seed, "audit-canary-membership").random(canaries) < 0.5
    member_ids = np.flatnonzero(members)
    # the simulated clients' rate (k/N, or 1 when every client trains every round), also under a deployment's noise
    q = 1.0 if cfg.clients_per_round is None else cfg.clients_per_round / n
    inserted = [0]

    def round_order(server_round: int, participants: list[int]) -> list[int]:
        if plan.releases_prefix_sums:   # tree: once a pass, in the round of the pass its own shuffle gives it
            pass_index, slot = divmod(server_round - 1, plan.per_pass)
            slots = np_generator(cfg.seed, "audit-canary-pass", pass_index).integers(0, plan.per_pass, len(member_ids))
            chosen = member_ids[slots == slot]
        else:
            chosen = member_ids[np_generator(cfg.seed, "audit-canary-cohort", server_round).random(len(member_ids)) < q]
        inserted[0] += len(chosen)
        everyone = np.array(list(participants) + [n + int(j) for j in chosen], dtype=np.int64)
        return [int(c) for c in np_generator(cfg.seed, "audit-canary-order", server_round).permutation(everyone)]

    def canary_update(task: ClientTask) -> torch.Tensor | None:
        if task.client_id < n:
            return None
        return _direction(cfg.seed, task.client_id - n, d) * (canary_norm * float(task.clip_norm))

    sim.extra_clients = round_order
    runner.fixed_updates = canary_update
    changes = []
    start = sim.weights.clone()
    try:
        before = anchor = start
        for record in sim.run():
            changes.append((sim.weights - before).double())
            if plan.releases_prefix_sums:   # tree: the pass's prefix sum so far, as released
                if (record.server_round - 1) % plan.per_pass == 0:
                    anchor = before
                if (record.server_round - 1) % plan.per_pass > 0:
                    changes.append((sim.weights - anchor).double())
            before = sim.weights.clone()
    except TrainingDiverged as err:
        raise ClientAuditError(f"the audited training diverged ({err}), so no canary can be scored; audit at a "
                               f"smaller lr or clip norm") from None
    finally:
        sim.executor.shutdown()
    moved = torch.stack(changes)                                   # every release the auditor scores
    if not bool(torch.isfinite(moved).all()):
        raise ClientAuditError("the audited training diverged (non-finite weights), so no canary can be scored")
    total = (sim.weights - start).double()                         # the final model change w_T − w_0
    norms = torch.cat([moved.norm(dim=1), total.norm().view(1)])
    norms[norms == 0] = 1.0
    releases = torch.cat([moved, total.view(1, -1)])
    cosines = np.array([((releases @ _direction(cfg.seed, j, d).double()) / norms).numpy() for j in range(canaries)])
    scores, final = cosines[:, :-1].max(axis=1), cosines[:, -1]
    delta = cfg.privacy.delta
    found = score_audit(scores[members], scores[~members], delta)
    ceiling = score_audit_ceiling(canaries, delta)
    inside, outside = final[members], final[~members]
    spread = (inside.std(ddof=1), outside.std(ddof=1))
    estimate = (epsilon_two_gaussians(float(inside.mean()), spread[0], float(outside.mean()), spread[1], delta)
                if min(spread) > 0 else math.inf)
    simulated = f"the simulated population of {n} clients"
    audited = float(sim.epsilons.max())
    if plan.deployment:
        audited, accountant = audited_epsilon(cfg, plan)
        if accountant != cfg.privacy.accountant:
            simulated += f", by the {accountant} accountant"
        accounted_scope = (f"the deployment of {cfg.privacy.noise_cohort_size} clients a round out of "
                           f"{cfg.privacy.population_size} the noise is sized for")
    else:
        accounted_scope = simulated
    return ClientAuditResult(
        found.epsilon_steinke, found.epsilon_fdp, ceiling.epsilon_steinke, ceiling.epsilon_fdp, estimate, audited,
        float(sim.epsilons.max()), simulated, accounted_scope, delta, plan.sigma * plan.denominator / plan.cohort,
        canaries, int(members.sum()), found.thresholds, found.guesses, found.correct, cfg.rounds, inserted[0],
        canary_norm)
