"""A run's privacy bookkeeping on the server: the σ plan, the per-client ledgers and ε, and their
checkpoint state: per client under ``privacy.unit=example`` (:class:`PrivacyBook`), one for the
population under ``privacy.unit=client`` (:class:`PopulationBook`).

Full participation plans every client's σ_i for all T rounds before round 1. Under partial
participation (``clients_per_round``) the schedule is public and drawn up front, so each client is
planned for exactly its own rounds, lazily, the first time it trains (:class:`ParticipationPlan`).
A client's ledger is created when it first trains and records, each round it trains in, its DP-SGD
steps and the method's Gaussian uploads (``raysim.privacy.plan.round_events``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from raysim.algorithms.base import MethodSpec
from raysim.config import Config
from raysim.messages import ClientTask
from raysim.participation import is_full, rounds_by_client
from raysim.privacy.accounting import PrivacyLedger, epsilon_many
from raysim.privacy.plan import ParticipationPlan, accounting_factor, plan_noise, round_events, side_channels
from raysim.privacy.population import ClientLevelPlan


def max_planned(sigmas: np.ndarray) -> float:
    """The largest σ_i that is planned (not NaN), or NaN when none is."""
    planned = sigmas[~np.isnan(sigmas)]
    return float(planned.max()) if planned.size else math.nan


class PrivacyBook:
    """σ_i, ledgers and ε_i of one run's clients (``cfg`` with its presets resolved)."""

    def __init__(self, spec: MethodSpec, cfg: Config, clipping: str, q: np.ndarray, steps: np.ndarray,
                 schedule: Sequence[np.ndarray]) -> None:
        self.cfg, self.clipping, self.q, self.steps = cfg, clipping, q, steps
        self.full_participation = is_full(schedule, cfg.num_clients)
        if self.full_participation:
            self.plan: ParticipationPlan | None = None
            self.sigmas = plan_noise(spec, cfg, clipping, q, steps)
        else:
            self.plan = ParticipationPlan(spec, cfg, clipping, q, steps, rounds_by_client(schedule, cfg.num_clients))
            self.sigmas = np.full(cfg.num_clients, np.nan)   # shared with the server's context, filled in place
        self.factor = accounting_factor(clipping, spec.client.releases_for(cfg)) if clipping != "none" else 0.0
        self.channels = side_channels(spec, cfg)
        # Ledgers of the clients that trained so far (created on first participation). Under partial
        # participation they keep no incremental accountant state (~200 kB each with PLD), so the driver
        # and its checkpoints hold a few hundred bytes per client that trained, nothing for the others.
        self.ledgers: dict[int, PrivacyLedger] = {}
        # ε per client, updated only for the clients whose ledger changed in a round.
        self.epsilons = np.full(cfg.num_clients, 0.0 if clipping != "none" else math.inf)
        self.max_sigma = max_planned(self.sigmas)
        self._warmed: set[tuple[float, float]] = set()    # (q, σ) pairs whose RDP curves are being computed
        self._warming: list[Any] = []                      # their futures (warm_rdp_curve)

    def plan_clients(self, client_ids: Sequence[int]) -> None:
        """Give every client of ``client_ids`` its σ (partial participation: calibrated on first use, for
        its whole planned participation, so this is the same σ whenever it is computed)."""
        if self.plan is None:
            return
        for cid in client_ids:
            if math.isnan(self.sigmas[cid]):
                self.sigmas[cid] = self.plan.sigma(int(cid))
                self.max_sigma = self.sigmas[cid] if math.isnan(self.max_sigma) else max(self.max_sigma, self.sigmas[cid])

    def ledger(self, client_id: int) -> PrivacyLedger:
        """Client ``client_id``'s ledger (an empty one, not kept, for a client that never trained)."""
        found = self.ledgers.get(int(client_id))
        return found if found is not None else self._new_ledger()

    def _new_ledger(self) -> PrivacyLedger:
        p = self.cfg.privacy
        return PrivacyLedger(p.delta, p.accountant, incremental=self.full_participation)

    def record_round(self, tasks: Sequence[ClientTask], participants: Sequence[int]) -> None:
        """Account one round: each task's DP-SGD steps at its σ and the method's Gaussian uploads."""
        if self.clipping == "none" or not tasks:
            return
        for task in tasks:
            cid = task.client_id
            ledger = self.ledgers.get(cid)
            if ledger is None:
                ledger = self.ledgers[cid] = self._new_ledger()
            for ev in round_events(float(self.q[cid]), int(self.steps[cid]), task.noise_multiplier, self.factor,
                                   self.channels):
                ledger.record(ev)
        # Only the participants' ledgers changed; everyone else keeps the ε of an earlier round.
        self.epsilons[list(participants)] = epsilon_many([self.ledgers[cid] for cid in participants])

    def warm_rdp_curve(self, participants: Sequence[int]) -> None:
        """Start computing, in a background thread, the one-step RDP curves of the (q, σ) pairs the
        participants' ledgers hold that no earlier call started: :meth:`rdp_curve` then sums cached
        curves. For drivers with time to spare while clients train elsewhere."""
        if self.clipping == "none":
            return
        from raysim.privacy.tuning import curve_pairs, warm_unit_curves
        new = sorted(curve_pairs(self.ledgers[cid].events for cid in participants) - self._warmed)
        if new:
            self._warmed.update(new)
            self._warming.append(warm_unit_curves(new))

    def rdp_curve(self) -> np.ndarray | None:
        """The pointwise maximum over clients of each client's RDP curve at
        :data:`raysim.privacy.tuning.ORDERS` (from its ledger's events)."""
        import concurrent.futures
        from raysim.privacy.tuning import max_rdp_curve
        concurrent.futures.wait(self._warming)   # not twice: a curve being warmed is cached when it is done
        self._warming.clear()
        return max_rdp_curve(ledger.events for ledger in self.ledgers.values())

    def setup_sigmas(self) -> list[float]:
        return [float(s) for s in self.sigmas]

    def state(self) -> dict[str, Any]:
        return {"ledgers": self.ledgers, "epsilons": self.epsilons.copy(), "noise_multipliers": self.sigmas.copy(),
                "sigma_memo": dict(self.plan.memo) if self.plan is not None else {}}

    def restore(self, state: dict[str, Any]) -> None:
        self.ledgers = dict(state["ledgers"])
        self.epsilons = np.array(state["epsilons"], dtype=np.float64)
        self.sigmas[:] = state["noise_multipliers"]    # in place: the server's context holds this array
        if self.plan is not None:
            self.plan.memo.update(state["sigma_memo"])
        self.max_sigma = max_planned(self.sigmas)


class PopulationBook:
    """``privacy.unit=client``: one ledger for the population (:mod:`raysim.privacy.population`).

    Clients add no noise of their own (their σ_i is 0); the server noises each round's cohort sum, and
    every round is a release, a round whose cohort came out empty included. Every client's ε is the
    population's. The interface is :class:`PrivacyBook`'s, so the round loop does not tell them apart.
    """

    def __init__(self, plan: ClientLevelPlan, num_clients: int, schedule: Sequence[np.ndarray]) -> None:
        self.client_level = plan
        self.full_participation = is_full(schedule, num_clients)
        self.plan: ParticipationPlan | None = None
        self.sigmas = np.zeros(num_clients)
        self.ledgers: dict[int, PrivacyLedger] = {}
        self.epsilons = np.zeros(num_clients)
        self.max_sigma = plan.sigma
        self.rounds = 0
        self.ledger_of_population = plan.new_ledger()

    def plan_clients(self, client_ids: Sequence[int]) -> None:
        return None

    def ledger(self, client_id: int) -> PrivacyLedger:
        raise ValueError("privacy.unit=client keeps one ledger for the population, none per client")

    def record_round(self, tasks: Sequence[ClientTask], participants: Sequence[int]) -> None:
        """Account one round of the population (with or without participants)."""
        self.rounds += 1
        plan = self.client_level
        if self.ledger_of_population is not None:
            self.ledger_of_population.record(plan.round_event(self.rounds))
            epsilon = self.ledger_of_population.epsilon()
        else:
            epsilon = plan.epsilon(self.rounds)
        self.epsilons[:] = epsilon

    def warm_rdp_curve(self, participants: Sequence[int]) -> None:
        """Nothing to start: the population's curve is one composition of its events, at the end."""

    def rdp_curve(self) -> np.ndarray | None:
        """The population's RDP curve at :data:`raysim.privacy.tuning.ORDERS` (Poisson or full cohorts;
        None for the cohorts only the RDP accountant's own events describe)."""
        if self.ledger_of_population is None:
            return None
        from raysim.privacy.tuning import rdp_curve
        return rdp_curve(self.client_level.step_events(self.rounds))

    def setup_sigmas(self) -> list[float]:
        return [self.client_level.sigma]

    def state(self) -> dict[str, Any]:
        return {"population_rounds": self.rounds, "population_ledger": self.ledger_of_population,
                "epsilons": self.epsilons.copy()}

    def restore(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["population_rounds"])
        self.ledger_of_population = state["population_ledger"]
        self.epsilons = np.array(state["epsilons"], dtype=np.float64)
