"""The built-in client-level mechanisms: gaussian, tree, blt, bandmf (docs/privacy.md, "Client-level DP").

Each is a :class:`~raysim.privacy.mechanisms.base.ClientMechanism`; the registry registers them in this
order. Their mathematics lives in :mod:`~raysim.privacy.mechanisms.blt` and
:mod:`~raysim.privacy.mechanisms.bandmf` (the strategies optimised for a run, streamed noise) and in
:mod:`raysim.privacy.population` (the tree's noise), imported when a method is called: importing this
module imports no torch.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from raysim.lazy import LazyModule
from raysim.privacy.mechanisms.base import ClientMechanism, ExampleSteps, Plan

if TYPE_CHECKING:
    from raysim.config import Config

dp_accounting = LazyModule("dp_accounting")
rdp_privacy_accountant = LazyModule("dp_accounting.rdp.rdp_privacy_accountant")

__all__ = ["Gaussian", "Tree", "BLTMechanism", "BandMFMechanism", "BUILTIN"]


def _rdp_epsilon(event: Any, relation: Any, delta: float) -> float:
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    acc.compose(event)
    return max(float(acc.get_epsilon(delta)), 0.0)


def _multipliers(plan: Plan, sigma: float, rounds: int) -> list[float]:
    return [sigma * m for m in plan.schedule[:rounds]]


class Gaussian(ClientMechanism):
    """Independent Gaussian noise on each round's cohort sum (DP-FedAvg): Poisson, full or fixed-size
    cohorts, a σ that may change by round."""

    name = "gaussian"
    participation = ("uniform", "poisson")
    participation_advice = ("shuffle has no amplification to account under privacy.mechanism=gaussian; "
                            "use poisson or uniform, or privacy.mechanism=tree")
    deployment = True
    varying_sigma = True
    canary_audit = True
    example_unit = True

    def epsilon(self, plan: Plan, sigma: float, rounds: int) -> float:
        return independent_epsilon(plan.sampling, plan.population, plan.cohort, _multipliers(plan, sigma, rounds),
                                   plan.delta, plan.accountant)

    def stepwise(self, sampling: str) -> bool:
        return sampling in ("poisson", "full")

    def round_event(self, plan: Plan, sigma: float, server_round: int) -> Any:
        from raysim.privacy.accounting import StepEvent
        return StepEvent(plan.sample_rate, sigma * plan.schedule[server_round - 1], 1)


def independent_epsilon(sampling: str, population: int, cohort: int, multipliers: Sequence[float], delta: float,
                        accountant: str) -> float:
    """ε at δ of independent Gaussian rounds with the accounted multipliers ``multipliers`` (one per round)."""
    from raysim.privacy.accounting import StepEvent, compute_epsilon
    if not len(multipliers):
        return 0.0
    if any(m == 0.0 for m in multipliers):
        return math.inf
    if sampling == "uniform":
        # Replace-one moves the clipped sum by up to 2C: the accounted multiplier is σ/2. RDP composes by
        # addition, so r rounds at one multiplier are r times one round's curve: what dp-accounting's
        # RdpAccountant computes for the self-composed event, without computing that round's curve again
        # every round (about 0.4 s at N = 1,000, k = 50).
        values, counts = np.unique(np.asarray(multipliers, dtype=np.float64), return_counts=True)
        curve = sum(int(c) * _fixed_size_round_curve(population, cohort, float(v) / 2.0) for v, c in zip(values, counts))
        orders = list(rdp_privacy_accountant.RdpAccountant().orders)
        return max(float(rdp_privacy_accountant.compute_epsilon(orders, curve, delta)[0]), 0.0)
    q = 1.0 if sampling == "full" else cohort / population
    return compute_epsilon([StepEvent(q, float(m), 1) for m in multipliers], delta, accountant)


@functools.lru_cache(maxsize=256)
def _fixed_size_round_curve(population: int, cohort: int, multiplier: float) -> np.ndarray:
    """The RDP curve (dp-accounting's default orders, replace-one) of one round: a cohort of ``cohort`` drawn
    without replacement from ``population``, the Gaussian of ``multiplier`` on its sum."""
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(population, cohort,
                                                               dp_accounting.GaussianDpEvent(multiplier)))
    curve = np.asarray(acc.rdp, dtype=np.float64)
    curve.setflags(write=False)
    return curve


class Tree(ClientMechanism):
    """Tree aggregation (DP-FTRL): each pass over the shuffled population is one tree, its prefix sums
    released; passes compose. RDP only, one σ for every round."""

    name = "tree"
    participation = ("shuffle",)
    participation_advice = ("privacy.mechanism=tree (DP-FTRL) takes each client at most once per pass over "
                            "a shuffled population: set participation=shuffle")
    prefix_sums = True
    rdp_only = True
    accounted_as = "tree aggregation"
    canary_audit = True

    def sampling(self, cfg: Config) -> str:
        return "shuffle"

    def epsilon(self, plan: Plan, sigma: float, rounds: int) -> float:
        multipliers = _multipliers(plan, sigma, rounds)
        if not len(multipliers):
            return 0.0
        if any(m == 0.0 for m in multipliers):
            return math.inf
        if len(set(multipliers)) != 1:
            raise ValueError("tree aggregation is accounted with one noise multiplier for every round")
        full, rest = divmod(len(multipliers), plan.per_pass)
        tree = dp_accounting.SingleEpochTreeAggregationDpEvent(float(multipliers[0]), plan.per_pass)
        events: list[Any] = [dp_accounting.SelfComposedDpEvent(tree, full)] if full else []
        if rest:
            events.append(dp_accounting.SingleEpochTreeAggregationDpEvent(float(multipliers[0]), rest))
        return _rdp_epsilon(dp_accounting.ComposedDpEvent(events), dp_accounting.NeighboringRelation.REPLACE_SPECIAL,
                            plan.delta)


class _Correlated(ClientMechanism):
    """A matrix factorisation's correlated noise on cyclic Poisson cohorts, one σ for every round."""

    cyclic = True
    correlated = True
    participation = ("poisson",)

    @property
    def participation_advice(self) -> str:   # type: ignore[override]
        return (f"privacy.mechanism={self.name} draws each round's cohort from one of its cyclic groups with "
                f"Poisson sampling; set participation=poisson (fixed-size or shuffled cohorts have no accounting "
                f"with correlated noise here)")

    def epsilon(self, plan: Plan, sigma: float, rounds: int) -> float:
        if rounds <= 0:
            return 0.0
        if sigma == 0.0:
            return math.inf
        return self.correlated_epsilon(plan, sigma, rounds)

    def correlated_epsilon(self, plan: Plan, sigma: float, rounds: int) -> float:
        raise NotImplementedError


class BLTMechanism(_Correlated):
    """Buffered Linear Toeplitz: the whole run is one Gaussian mechanism on ``C_blt x``; after r rounds the
    first r rows, of a smaller sensitivity."""

    name = "blt"

    def strategy(self, cfg: Config, groups: int) -> tuple[Any, float]:
        from raysim.privacy.mechanisms.blt import blt_for, strategy_sensitivity
        strategy = blt_for(cfg.rounds, groups)
        return strategy, strategy_sensitivity(strategy, cfg.rounds, groups)

    def correlated_epsilon(self, plan: Plan, sigma: float, rounds: int) -> float:
        from raysim.privacy.accounting import StepEvent, compute_epsilon
        from raysim.privacy.mechanisms.blt import strategy_sensitivity
        strategy, groups = plan.strategy, plan.groups
        full = strategy_sensitivity(strategy, strategy.rounds, groups)
        return compute_epsilon([StepEvent(1.0, sigma * full / strategy_sensitivity(strategy, rounds, groups), 1)],
                               plan.delta, plan.accountant)

    def new_stream(self, plan: Plan, size: int) -> Any:
        from raysim.privacy.mechanisms.blt import BLTNoise
        return BLTNoise(plan.strategy.blt, size)


class BandMFMechanism(_Correlated):
    """Banded matrix factorisation: each round a client can join is a Poisson-subsampled Gaussian on its own
    column, ⌈T/G⌉ of them composed (amplified BandMF). Under ``privacy.unit=example`` the same over each
    client's DP-SGD steps: its examples in b cyclic groups, each step a Poisson draw from one group."""

    name = "bandmf"
    example_unit = True
    damped_workload = True

    def example_steps(self, cfg: Config, num_samples: int, steps: int) -> ExampleSteps:
        """b = the largest divisor of τ at most ``privacy.min_separation`` and ⌈n/B⌉ (a group holds at least
        a batch), so every round takes each group τ/b times; rate min(1, b·B/n), an expected batch of B."""
        cap = max(1, min(int(cfg.privacy.min_separation or 1), math.ceil(num_samples / cfg.batch_size), steps))
        bands = max(d for d in range(1, cap + 1) if steps % d == 0)
        return ExampleSteps(bands, min(1.0, bands * cfg.batch_size / num_samples), steps // bands)

    def client_strategy(self, cfg: Config, total_steps: int, bands: int) -> tuple[float, ...] | None:
        from raysim.privacy.mechanisms.bandmf import bandmf_for
        return bandmf_for(total_steps, min(bands, total_steps), cfg.privacy.workload_decay)

    def client_stream(self, strategy: tuple[float, ...], size: int) -> Any:
        from raysim.privacy.mechanisms.bandmf import BandMFNoise
        return BandMFNoise(np.asarray(strategy), size)

    def strategy(self, cfg: Config, groups: int) -> tuple[Any, float]:
        from raysim.privacy.mechanisms.bandmf import bandmf_for
        return bandmf_for(cfg.rounds, min(groups, cfg.rounds), cfg.privacy.workload_decay), 1.0

    def correlated_epsilon(self, plan: Plan, sigma: float, rounds: int) -> float:
        from raysim.privacy.accounting import StepEvent, compute_epsilon
        from raysim.privacy.mechanisms.bandmf import amplified_steps
        return compute_epsilon([StepEvent(plan.rate, sigma, amplified_steps(rounds, plan.groups))], plan.delta,
                               plan.accountant)

    def new_stream(self, plan: Plan, size: int) -> Any:
        from raysim.privacy.mechanisms.bandmf import BandMFNoise
        return BandMFNoise(np.asarray(plan.strategy), size)


#: The built-in mechanisms, in the order the config lists them.
BUILTIN: tuple[ClientMechanism, ...] = (Gaussian(), Tree(), BLTMechanism(), BandMFMechanism())
