"""``raysim audit``: an empirical lower bound on ε from one training run, with white-box gradient
canaries (Steinke, Nasr & Jagielski 2023).

One client of the configured run (client 0: its data, its planned σ, its rounds and steps) trains
with the configured DP-SGD mechanism (``privacy.clipping``) at the fixed C = ``privacy.clip_norm``,
its model carried from round to round. M canaries — gradients of norm ``canary_norm``·C (10 C) in
random sparse directions, disjoint from each other — are each included with probability 1/2, and an
included canary joins each Poisson batch with the same probability q as a real example. Its gradient
enters *before* clipping: with ``per_sample`` clipping it goes through the engine's per-example path
with the batch (per-layer norms, clip factors, clipped sum; ``GradSampleEngine.clipped_sum``'s
``extra``, as :class:`~raysim.privacy.grad_sample.SparseExamples`: each canary costs its few
coordinates, not a dense row), so a clipping bug that lets an example through lets the canaries
through at 10× the signal; with ``batch`` clipping it joins the batch mean before the mean is
clipped. A training that diverges (non-finite parameters) is refused with :class:`AuditError`: it
leaves nothing to score. Afterwards each canary is scored by its inner product with the client's
total update (−Δw moves along included canaries); the top and bottom ``guess_fraction`` of the
scores are guessed in and out, and the correct count becomes a 95 %-confidence lower bound ε_lb
(:mod:`raysim.privacy.audit_bound`). ε_lb is reported beside the ε accounted for exactly what the
audit observes (that client's DP-SGD steps) and beside the audit's ceiling: the ε_lb of all guesses
right, the largest value M canaries and r guesses can show.

What it shows and what it does not: docs/privacy.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector

from raysim.algorithms.base import ClientHooks
from raysim.algorithms.registry import get_method, resolve_preset
from raysim.config import Config, ConfigError
from raysim.data import to_float_tensor
from raysim.experiment import prepare
from raysim.messages import ClientTask, RoundPayload
from raysim.models import init_parameters, model_for
from raysim.privacy.accounting import StepEvent, compute_epsilon
from raysim.privacy.audit_bound import epsilon_lower_bound
from raysim.privacy.grad_sample import SparseExamples, make_engine
from raysim.privacy.plan import accounting_factor, plan_noise, resolve_clipping
from raysim.rng import np_generator, torch_generator
from raysim.run_data import make_partition
from raysim.training import local_train, sample_rate, steps_per_epoch

__all__ = ["AuditError", "AuditResult", "audit_ceiling", "run_audit"]


class AuditError(ConfigError):
    """The audit cannot give a bound for this configuration (one line, exit code 2)."""


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower_bound: float     # 95 % confidence
    epsilon_ceiling: float         # the largest ε_lb this audit can reach: every guess right
    epsilon_accounted: float       # the audited client's DP-SGD steps, as accounted
    delta: float
    clipping: str
    noise_multiplier: float
    canaries: int
    guesses: int
    correct: int
    steps: int
    canary_norm: float             # pre-clipping norm of each canary, in units of C

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def audit_ceiling(canaries: int, guesses: int, delta: float) -> float:
    """The largest ε_lb an audit with ``canaries`` canaries and ``guesses`` guesses can report (all right):
    no claim above it can be refuted by that audit."""
    return epsilon_lower_bound(canaries, guesses, guesses, delta)


def run_audit(cfg: Config, canaries: int = 10000, guess_fraction: float = 0.1, client_id: int = 0,
              canary_norm: float = 10.0) -> AuditResult:
    """Audit the DP-SGD mechanism of ``cfg`` (see the module docstring)."""
    if canaries < 10:
        raise ConfigError(f"--canaries must be >= 10, got {canaries}")
    if not 0 < guess_fraction <= 0.5:
        raise ConfigError(f"--guess-fraction must be in (0, 0.5], got {guess_fraction}")
    cfg = resolve_preset(cfg)
    spec = get_method(cfg.method)
    clipping = resolve_clipping(spec, cfg)
    if clipping == "none":
        raise ConfigError("nothing to audit: privacy.clipping=none makes no DP claim")
    train, _ = prepare(cfg)
    client = make_partition(cfg, train.y)[client_id]
    x = to_float_tensor(train.x[client.train_indices], train.info)
    y = torch.from_numpy(train.y[client.train_indices].astype(np.int64))
    n = len(y)
    q, steps = sample_rate(n, cfg.batch_size), steps_per_epoch(n, cfg.batch_size) * cfg.local_epochs
    sigma = float(plan_noise(spec, cfg, clipping, np.array([q]), np.array([steps]))[0])
    accounted = compute_epsilon([StepEvent(q, sigma * accounting_factor(clipping, 1), steps * cfg.rounds)],
                                cfg.privacy.delta, cfg.privacy.accountant)

    model = model_for(cfg, train.info, spec.model_options(cfg))
    init_parameters(model, torch_generator(cfg.seed, "model-init"))
    params = list(model.parameters())
    start = parameters_to_vector(params).detach().clone()
    d, clip = start.numel(), float(cfg.privacy.clip_norm)
    support = max(1, min(64, d // canaries))
    if support * canaries > d:
        raise ConfigError(f"the model has {d} parameters, too few for {canaries} disjoint canaries; "
                          f"lower --canaries")
    coords = torch.from_numpy(np_generator(cfg.seed, "audit-canaries").permutation(d)[: support * canaries].copy())
    coords = coords.view(canaries, support)
    signs = torch.from_numpy(np_generator(cfg.seed, "audit-signs").choice([-1.0, 1.0], (canaries, support)))
    values = (signs * canary_norm * clip / math.sqrt(support)).to(start.dtype)   # pre-clip norm canary_norm·C
    included = np_generator(cfg.seed, "audit-membership").random(canaries) < 0.5
    members = np.flatnonzero(included)
    sizes = torch.tensor([p.numel() for p in params])
    owner = torch.bucketize(coords, torch.cumsum(sizes, 0), right=True)   # the parameter of each coordinate
    inside = coords - (torch.cumsum(sizes, 0) - sizes)[owner]            # its position in that parameter
    engine = make_engine(cfg.privacy.engine)

    for server_round in range(1, cfg.rounds + 1):
        sampler = np_generator(cfg.seed, "audit-canary-batches", server_round, client_id)
        chosen = [torch.from_numpy(members[sampler.random(len(members)) < q]) for _ in range(steps)]

        def canary_batch(step: int, chosen=chosen) -> SparseExamples:
            picked = chosen[step]                                     # the canaries in this step's batch
            return SparseExamples(owner[picked], inside[picked], values[picked])

        now = parameters_to_vector(params).detach().clone()
        task = ClientTask(client_id, server_round, clip, sigma)
        hooks = ClientHooks(cfg, RoundPayload(server_round, now, now), task)
        local_train(model, x, y, hooks, clipping=clipping, engine=engine, per_layer=False, seed=cfg.seed,
                    client_id=client_id, canaries=canary_batch)
        if not all(bool(torch.isfinite(p).all()) for p in params):
            raise AuditError(f"the audited training diverged in round {server_round} (non-finite parameters), "
                             f"so no canary can be scored; audit at a smaller lr")

    moved = start - parameters_to_vector(params).detach()            # −Δw over the whole run
    scores = (moved[coords] * values).sum(dim=1).numpy()
    k = max(1, int(guess_fraction * canaries))
    order = np.argsort(scores, kind="stable")
    correct = int(included[order[-k:]].sum() + (~included[order[:k]]).sum())
    bound = epsilon_lower_bound(canaries, 2 * k, correct, cfg.privacy.delta)
    return AuditResult(bound, audit_ceiling(canaries, 2 * k, cfg.privacy.delta), float(accounted),
                       cfg.privacy.delta, clipping, sigma, canaries, 2 * k, correct, steps * cfg.rounds, canary_norm)
