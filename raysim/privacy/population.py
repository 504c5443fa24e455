"""Client-level DP (``privacy.unit=client``): the noise plan and the one ledger of the population.

Adjacent federations differ by one whole client, with all its data. A round's release is the cohort's
sum of clipped updates plus Gaussian noise, added once by the server (a trusted aggregator: central DP):
``(Σ_{i∈S_t} clip_C(Δ_i) + N(0, σ²C²I)) / k``, with the fixed denominator k, the expected cohort size
(docs/privacy.md, "Client-level DP"). Every client's ε is the population's, so there is one ledger.

What each cohort implies for the accountant (dp-accounting does the maths):

* ``participation=poisson`` (each client with probability q = k/N per round): T rounds of the
  Poisson-subsampled Gaussian of multiplier σ under add/remove of one client (sensitivity C), PLD or RDP.
* every client every round (``clients_per_round`` unset): the same with q = 1, a Gaussian per round.
* ``participation=uniform`` (exactly k without replacement): dp-accounting's
  ``SampledWithoutReplacementDpEvent``, which is defined under replace-one adjacency. Replacing one
  client moves the clipped sum by up to 2C, so the accounted multiplier is σ/2. Its RDP accountant is
  the only one that composes it (``privacy.accountant=rdp``).
* ``privacy.mechanism=tree`` (DP-FTRL, ``participation=shuffle``): each pass over the shuffled population
  is one tree whose every node gets N(0, σ²C²) and each client enters one leaf of it; a pass is
  dp-accounting's ``SingleEpochTreeAggregationDpEvent`` (replace one client by a zero update, sensitivity
  C), and passes compose (``SelfComposedDpEvent``). No amplification by sampling is claimed. RDP only.
* ``privacy.mechanism=bandmf`` (cyclic Poisson cohorts, :mod:`raysim.participation`): the noise of round t
  is ``σC (C_b⁻¹ z)_t``, C_b the banded strategy with G bands (unit-norm columns) optimised for T rounds
  (:mod:`raysim.privacy.mechanisms.bandmf`). A client's rounds are multiples of G apart, so each round it
  can join is a Poisson-subsampled Gaussian of multiplier σ on its own column, ⌈T/G⌉ of them composed
  (amplified BandMF, Choquette-Choo et al. 2023), under add/remove of one client. PLD or RDP.
* ``privacy.mechanism=blt``: the noise of round t is ``σ·sens·C (C_blt⁻¹ z)_t``, C_blt the BLT optimised for
  T rounds, participations G apart and at most ⌈T/G⌉ of them (:mod:`raysim.privacy.mechanisms.blt`), sens
  its sensitivity under that participation. The whole run is one Gaussian mechanism of multiplier σ on
  ``C_blt x``; no amplification by the Poisson draw within a group is claimed. After r rounds the release is
  the first r rows, whose sensitivity sens_r is smaller: ε(r) is the Gaussian's at σ·sens/sens_r.

Noise sized for a deployment (``privacy.noise_cohort_size`` k', ``privacy.population_size`` N'): σ' is
calibrated for the deployment's cohort (q' = k'/N'), and the simulated average carries the deployment
average's noise σ'C/k'. The ε reported is then the deployment's, not the simulated federation's.

Adaptive clipping (``dp-fedavg-adaptive``, Andrew et al. 2021): the server also adds N(0, σ_b²) to
Σ_i (b_i − 1/2) (sensitivity 1/2 under add/remove), σ_b = k/20 unless the method gives it (its joint
upload's ``Release.noise_multiplier``), and the update noise σ_Δ is chosen so that the joint release is
one Gaussian of multiplier σ: (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2) = σ.

Each mechanism is an object of :mod:`raysim.privacy.mechanisms.registry` (the built-in ones in
:mod:`raysim.privacy.mechanisms.builtin`): the plan asks it for its cohorts, strategy, ε and noise stream.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from raysim.config import Config, ConfigError
from raysim.noise import GaussianNoise
from raysim.participation import cyclic_groups, cyclic_rate, is_cyclic, rounds_per_pass
from raysim.privacy.mechanisms.base import ClientMechanism
from raysim.privacy.mechanisms.registry import get_mechanism, mechanisms
from raysim.privacy.accounting import PrivacyLedger, StepEvent, smallest_noise

__all__ = ["ClientLevelPlan", "client_level_plan", "check_mechanism", "joint_update_sigma", "privacy_scope",
           "epsilon_scope", "EPSILON_SCOPES", "ADAPTIVE_COUNT_DIVISOR"]

#: σ_b = k / ADAPTIVE_COUNT_DIVISOR by default (Andrew et al. 2021's choice, k the expected cohort size).
ADAPTIVE_COUNT_DIVISOR = 20.0


def joint_update_sigma(sigma: float, count_noise_multiplier: float) -> float:
    """σ_Δ with (σ_Δ⁻² + σ_c⁻²)^(−1/2) = σ, σ_c the count's noise multiplier (2σ_b for sensitivity 1/2)."""
    if not sigma < count_noise_multiplier:
        raise ConfigError(f"the adaptive clipping count's noise (multiplier 2σ_b = {count_noise_multiplier:.4g}) "
                          f"is below the joint σ = {sigma:.4g} the target ε needs, so it alone would spend more "
                          f"than ε: raise σ_b (quantile.noise_multiplier; default k/20) or clients_per_round "
                          f"(or privacy.noise_cohort_size)")
    return float((sigma ** -2 - count_noise_multiplier ** -2) ** -0.5)


@dataclass(frozen=True)
class ClientLevelPlan:
    """The noise and accounting of a client-level run (see the module docstring)."""

    mechanism: str                 # privacy.mechanism: a registered mechanism's name (:attr:`spec`)
    sampling: str                  # poisson | uniform | full | shuffle | cyclic (the mechanism's sampling(cfg))
    adjacency: str                 # what adjacent federations differ in, as the runs table names it
    population: int                # N (or the deployment's N')
    cohort: int                    # k (or k'): the expected cohort size the noise is sized for
    denominator: int               # the simulated k: the clipped sum is divided by it
    rounds: int
    per_pass: int                  # tree: rounds of one pass (one tree); 0 otherwise
    schedule: tuple[float, ...]    # relative σ of each round (a method's schedule, e.g. DP-ACDN's decay)
    sigma: float                   # the accounted noise multiplier (joint, with adaptive clipping)
    update_sigma: float            # the noise multiplier on the sum of clipped updates
    count_std: float               # adaptive clipping: σ_b, the std of the noise on Σ (b_i − 1/2); 0 otherwise
    deployment: bool               # noise sized for privacy.noise_cohort_size / population_size
    accountant: str
    delta: float
    groups: int = 0                # blt, bandmf: G, the cyclic groups (the minimum separation); 0 otherwise
    rate: float = 1.0              # blt, bandmf: the Poisson rate within a group
    strategy: Any = None           # bandmf: the band coefficients (unit norm); blt: the BLT; None otherwise
    sensitivity: float = 1.0       # blt: the strategy's sensitivity over T rounds; 1 otherwise

    @property
    def spec(self) -> ClientMechanism:
        """The registered mechanism object of :attr:`mechanism`."""
        return get_mechanism(self.mechanism)

    @property
    def releases_prefix_sums(self) -> bool:
        """Whether a round's release is its pass's prefix sum (tree), not the round's noised mean."""
        return self.spec.prefix_sums

    @property
    def correlated(self) -> bool:
        """Whether the round noise is correlated across rounds by a matrix factorisation (blt, bandmf)."""
        return self.spec.correlated

    @property
    def sample_rate(self) -> float:
        if self.spec.cyclic:
            return self.rate
        return 1.0 if self.sampling == "full" else self.cohort / self.population

    def new_stream(self, size: int) -> Any:
        """The correlated noise's streaming state for ``size`` coordinates (blt, bandmf)."""
        return self.spec.new_stream(self, size)

    def correlated_noise_std(self, clip_norm: float) -> float:
        """The factor of ``(C⁻¹ z)_t`` in the averaged update: σ·sens·C/k."""
        return self.update_sigma * self.sensitivity * float(clip_norm) / self.cohort

    def update_noise_std(self, server_round: int, clip_norm: float) -> float:
        """Std per coordinate of the noise on round ``server_round``'s averaged update (σ_Δ·C/k)."""
        return self.update_sigma * self.schedule[server_round - 1] * float(clip_norm) / self.cohort

    def count_noise_std(self) -> float:
        """Std of the noise on the averaged count b̄ (σ_b/k)."""
        return self.count_std / self.cohort

    def epsilon(self, rounds: int) -> float:
        """ε at δ after the first ``rounds`` rounds."""
        return self.spec.epsilon(self, self.sigma, rounds)

    def round_event(self, server_round: int) -> StepEvent:
        """Round ``server_round``'s release as a :class:`StepEvent` (Poisson or full cohorts)."""
        return self.spec.round_event(self, self.sigma, server_round)

    def step_events(self, rounds: int) -> list[StepEvent]:
        """The Poisson (or full) rounds as :class:`StepEvent` (add/remove): the private tuning's RDP input."""
        if not self.spec.stepwise(self.sampling):
            raise ValueError("only Poisson-sampled or full cohorts are StepEvents")
        return [self.spec.round_event(self, self.sigma, t) for t in range(1, min(rounds, len(self.schedule)) + 1)]

    @staticmethod
    def prefix_noise(seed: int, pass_index: int, prefix: int, std: float, size: int) -> torch.Tensor:
        """The tree noise of a pass's prefix sum (:func:`prefix_noise`)."""
        return prefix_noise(seed, pass_index, prefix, std, size)

    def new_ledger(self) -> PrivacyLedger | None:
        """An incremental ledger for the Poisson (or full) rounds; None for the RDP-only cohorts."""
        if self.spec.stepwise(self.sampling):
            return PrivacyLedger(self.delta, self.accountant)
        return None


def tree_nodes(prefix: int) -> list[tuple[int, int]]:
    """The (level, index) of the binary-tree nodes whose sums make up the prefix of the first ``prefix``
    leaves: one node per set bit of ``prefix`` (a node at level l covers 2^l leaves)."""
    nodes, start = [], 0
    for level in reversed(range(max(prefix, 1).bit_length())):
        if prefix & (1 << level):
            nodes.append((level, start >> level))
            start += 1 << level
    return nodes


def prefix_noise(seed: int, pass_index: int, prefix: int, std: float, size: int) -> torch.Tensor:
    """Tree-aggregation noise of a pass's prefix sum (float64): the sum of the noises of its
    :func:`tree_nodes`, each node's N(0, std²I) drawn from its own stream ``(seed, "tree-noise", pass,
    level, index)``, so every prefix that contains a node reuses that node's noise."""
    total = torch.zeros(size, dtype=torch.float64)
    for level, index in tree_nodes(prefix):
        total += GaussianNoise(seed, "tree-noise", pass_index + 1, level, index).vector(size, std).double()
    return total


def _sampling(cfg: Config) -> str:
    """How the accounted cohorts are drawn (the mechanism's :meth:`~ClientMechanism.sampling`)."""
    return get_mechanism(cfg.privacy.mechanism).sampling(cfg)


def keeps_rdp_curve(cfg: Config) -> bool:
    """Whether a client-unit run's rounds are Poisson-subsampled (or full) Gaussian releases, the only ones
    whose RDP curve it keeps (``runs.rdp_epsilons``, what a private tune composes): the mechanism's
    :meth:`~raysim.privacy.mechanisms.base.ClientMechanism.stepwise`."""
    mech = get_mechanism(cfg.privacy.mechanism)
    return mech.stepwise(mech.sampling(cfg))


ADJACENCY = {
    "poisson": "add/remove one client",
    "full": "add/remove one client",
    "uniform": "replace one client (fixed-size cohorts)",
    "shuffle": "replace one client by a zero update",
    "cyclic": "add/remove one client (its cyclic group fixed)",
}


#: Whose ε a run's tables and outputs show (``epsilon_scope``, beside every ε): ``per-client`` (the example
#: unit: each client's own ε; a run's or a round's is the largest), ``population`` (the client unit: the
#: simulated federation's one ε), ``deployment`` (the client unit with the noise sized for
#: ``privacy.noise_cohort_size`` of ``privacy.population_size``: that deployment's ε, not the simulated clients').
EPSILON_SCOPES = ("per-client", "population", "deployment")


def epsilon_scope(cfg: Config) -> str:
    """The ``epsilon_scope`` of ``cfg`` (one of :data:`EPSILON_SCOPES`)."""
    if cfg.privacy.unit != "client":
        return "per-client"
    return "deployment" if cfg.privacy.noise_cohort_size is not None else "population"


def participation_label(cfg: Config) -> str:
    """How each round's clients are drawn, as the runs table names it."""
    if cfg.clients_per_round is None and not is_cyclic(cfg):
        return "full (every client every round)"
    if is_cyclic(cfg):
        groups = cyclic_groups(cfg)
        return (f"cyclic poisson: {groups} groups, round t draws group (t - 1) mod {groups} at rate "
                f"{cyclic_rate(cfg):.4g} (min separation {groups})")
    if cfg.participation == "shuffle":
        return f"shuffled passes of {rounds_per_pass(cfg)} rounds, {cfg.clients_per_round} clients a round"
    if cfg.participation == "poisson":
        return f"poisson at rate {cfg.clients_per_round / cfg.num_clients:.4g}"
    return f"uniform: {cfg.clients_per_round} of {cfg.num_clients} without replacement"


def privacy_scope(cfg: Config) -> dict[str, str]:
    """The runs table's ``privacy_unit``, ``adjacency``, ``privacy_mechanism``, ``participation``,
    ``epsilon_scope`` (:func:`epsilon_scope`) and ``epsilon_scope_detail`` (the scope in words) of ``cfg``:
    what its ε is for."""
    p = cfg.privacy
    scope = epsilon_scope(cfg)
    if p.unit == "example":
        dp = p.epsilon is not None or p.noise_multiplier is not None
        steps = ""
        if dp and get_mechanism(p.mechanism).correlated:
            steps = (f"; each client's DP-SGD steps from b ≤ {p.min_separation} cyclic Poisson groups of its "
                     f"examples (b divides its steps a round)")
        return {"privacy_unit": "example", "adjacency": "add/remove one training example of one client",
                "privacy_mechanism": p.mechanism if dp else "none",
                "participation": participation_label(cfg) + steps,
                "epsilon_scope": scope, "epsilon_scope_detail": "each client's own ε (the run's is the largest)"}
    sampling = _sampling(cfg)
    if scope == "deployment":
        detail = (f"a deployment of {p.noise_cohort_size} clients a round out of {p.population_size} (noise sized "
                  f"for it), not the simulated federation of {cfg.num_clients}")
    else:
        detail = f"the simulated population of {cfg.num_clients} clients"
    return {"privacy_unit": "client", "adjacency": ADJACENCY[sampling], "privacy_mechanism": p.mechanism,
            "participation": participation_label(cfg), "epsilon_scope": scope, "epsilon_scope_detail": detail}


def check_mechanism(cfg: Config, schedule: Sequence[float], adaptive_count: bool) -> None:
    """Refuse (one line) a method the mechanism cannot account: a σ that changes by round under a mechanism
    accounted with one σ, or adaptive clipping's joint count beside correlated noise."""
    p = cfg.privacy
    mech = get_mechanism(p.mechanism)
    if not mech.varying_sigma and len(set(float(m) for m in schedule)) > 1:
        raise ConfigError(f"privacy.mechanism={p.mechanism} takes one noise multiplier for every round; method "
                          f"{cfg.method}'s noise schedule changes it")
    if adaptive_count and mech.correlated:
        independent = "|".join(m.name for m in mechanisms() if not m.correlated and m.varying_sigma)
        raise ConfigError(f"privacy.mechanism={p.mechanism}: adaptive clipping's count is accounted jointly with "
                          f"independent Gaussian rounds only; use privacy.mechanism={independent}")


def client_level_plan(cfg: Config, schedule: Sequence[float], adaptive_count: bool,
                      count_std: float | None = None) -> ClientLevelPlan:
    """The plan of ``cfg`` (presets resolved): σ given (``privacy.noise_multiplier``) or calibrated to
    ``privacy.epsilon`` over all T rounds, for the simulated federation or the deployment it stands for.
    ``schedule`` is the method's relative σ per round; ``adaptive_count`` adds adaptive clipping's count,
    with noise std ``count_std`` (σ_b; None: k/20 for the cohort k the noise is sized for)."""
    p = cfg.privacy
    mech = get_mechanism(p.mechanism)
    sampling = mech.sampling(cfg)
    deployment = p.noise_cohort_size is not None
    population = int(p.population_size) if deployment else cfg.num_clients
    simulated_k = cfg.clients_per_round if cfg.clients_per_round is not None else cfg.num_clients
    cohort = int(p.noise_cohort_size) if deployment else int(simulated_k)
    check_mechanism(cfg, schedule, adaptive_count)
    groups = rate = 0
    if mech.cyclic:
        groups, rate = cyclic_groups(cfg), cyclic_rate(cfg)
    strategy, sensitivity = mech.strategy(cfg, groups)
    per_pass = rounds_per_pass(cfg) if mech.prefix_sums else 0
    schedule = tuple(float(m) for m in schedule)
    if not adaptive_count:
        count_std = 0.0
    elif count_std is None:
        count_std = cohort / ADAPTIVE_COUNT_DIVISOR
    elif not count_std > 0:
        raise ValueError(f"the joint count's noise std must be > 0, got {count_std}")

    # σ to be calibrated: the mechanism's ε reads the plan's other fields
    plan = ClientLevelPlan(p.mechanism, sampling, ADJACENCY[sampling], population, cohort, int(simulated_k),
                           cfg.rounds, per_pass, schedule, math.nan, math.nan, count_std, deployment,
                           p.accountant, p.delta, groups, float(rate) if groups else 1.0, strategy, sensitivity)
    # ε over the whole schedule (the correlated mechanisms: over the T rounds of their strategy)
    horizon = cfg.rounds if mech.correlated else len(schedule)

    def eps(sigma: float) -> float:
        return mech.epsilon(plan, sigma, horizon)

    if p.noise_multiplier is not None:
        sigma = float(p.noise_multiplier)
    else:
        sigma = smallest_noise(eps, float(p.epsilon))
    update_sigma = joint_update_sigma(sigma, 2.0 * count_std) if adaptive_count and sigma > 0 else sigma
    return dataclasses.replace(plan, sigma=sigma, update_sigma=update_sigma)
