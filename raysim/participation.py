"""Which clients train in which round (cross-device cohorts): the participation schedule.

The schedule is public randomness: it is drawn on the server, before round 1, from the run seed alone
(stream ``(seed, "participation", round)``), never from data, so it is the same on every executor and
after a resume, and the privacy plan can read each client's whole participation up front.

``participation`` (R, the paper has every client in every round):

* ``uniform``: exactly k = ``clients_per_round`` distinct clients per round, drawn without replacement,
  each round independently of the others.
* ``poisson``: each client independently with probability k/N per round; the cohort size varies and a
  round may have no participant (the simulation then leaves the global model and the server state
  unchanged and logs the round with ``participants = 0``; under ``privacy.unit=client`` the server still
  releases its noise).
* ``shuffle`` (DP-FTRL, ``privacy.mechanism=tree``): passes over the population one after another, each
  in its own random order (stream ``(seed, "participation-pass", pass)``), a round taking the next k
  clients of the pass, so each client trains at most once per pass of ⌈N/k⌉ rounds.
* cyclic Poisson (``privacy.mechanism=blt|bandmf``, with ``participation=poisson``): the population is cut
  once into G groups (``privacy.min_separation``, default min(⌊N/k⌋, T); a random partition from stream
  ``(seed, "participation-groups")``), and round t draws each client of group (t − 1) mod G independently
  with probability kG/N (expected cohort k). A client's rounds are then multiples of G apart.

Privacy (``privacy.unit=example``): the accountant treats the schedule as public and composes, for each client, exactly the
rounds it takes part in; it claims no amplification by client sampling (the guarantee is per example
of one client, docs/privacy.md, and a client's own rounds are known to the adversary).
"""

from __future__ import annotations

import numpy as np

from raysim.config import Config, ConfigError, client_mechanism
from raysim.rng import np_generator

__all__ = ["participation_schedule", "rounds_by_client", "is_full", "rounds_per_pass", "cyclic_groups",
           "cyclic_rate", "is_cyclic"]


def is_cyclic(cfg: Config) -> bool:
    """Whether the cohorts come from cyclic groups (a client-unit mechanism that declares them: blt, bandmf)."""
    return cfg.privacy.unit == "client" and client_mechanism(cfg.privacy.mechanism).cyclic


def cyclic_groups(cfg: Config) -> int:
    """G, the number of cyclic groups: ``privacy.min_separation``, else min(⌊N/k⌋, T) (at least 1)."""
    if cfg.privacy.min_separation is not None:
        return int(cfg.privacy.min_separation)
    k = cfg.clients_per_round if cfg.clients_per_round is not None else cfg.num_clients
    return max(1, min(cfg.num_clients // k, cfg.rounds))


def cyclic_rate(cfg: Config) -> float:
    """The Poisson rate within a group, k·G/N (1 when every client trains every round)."""
    k = cfg.clients_per_round if cfg.clients_per_round is not None else cfg.num_clients
    return min(1.0, k * cyclic_groups(cfg) / cfg.num_clients)


def rounds_per_pass(cfg: Config) -> int:
    """Rounds of one pass over the population under ``participation=shuffle`` (⌈N/k⌉)."""
    return -(-cfg.num_clients // (cfg.clients_per_round or cfg.num_clients))


def _round_cohort(cfg: Config, server_round: int, groups: np.ndarray | None = None) -> np.ndarray:
    n, k = cfg.num_clients, cfg.clients_per_round
    if groups is not None:
        members = np.flatnonzero(groups == (server_round - 1) % cyclic_groups(cfg))
        rate = cyclic_rate(cfg)
        if rate >= 1.0:
            return members.astype(np.int64)
        rng = np_generator(cfg.seed, "participation", server_round)
        return members[rng.random(len(members)) < rate].astype(np.int64)
    if k is None:
        return np.arange(n, dtype=np.int64)
    # One stream per round: round t's cohort does not depend on T, so a shorter run is a prefix.
    rng = np_generator(cfg.seed, "participation", server_round)
    if cfg.participation == "uniform":
        return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
    if cfg.participation == "poisson":
        return np.flatnonzero(rng.random(n) < k / n).astype(np.int64)
    if cfg.participation == "shuffle":
        per_pass = rounds_per_pass(cfg)
        pass_index, slot = divmod(server_round - 1, per_pass)
        order = np_generator(cfg.seed, "participation-pass", pass_index).permutation(n)
        return np.sort(order[slot * k:(slot + 1) * k]).astype(np.int64)
    raise ConfigError(f"unknown participation {cfg.participation!r}")


def participation_schedule(cfg: Config) -> list[np.ndarray]:
    """Sorted client ids of each round t = 1..T (entry t − 1); every client in every round when
    ``clients_per_round`` is None. A pure function of the config (seed, N, k, mode, T)."""
    groups = None
    if is_cyclic(cfg):   # client i is in group (its place in a random order) mod G
        groups = np.empty(cfg.num_clients, dtype=np.int64)
        groups[np_generator(cfg.seed, "participation-groups").permutation(cfg.num_clients)] = (
            np.arange(cfg.num_clients) % cyclic_groups(cfg))
    return [_round_cohort(cfg, t, groups) for t in range(1, cfg.rounds + 1)]


def rounds_by_client(schedule: list[np.ndarray], num_clients: int) -> list[np.ndarray]:
    """For each client, the sorted rounds (1-based) in which it trains."""
    if not schedule:
        return [np.zeros(0, dtype=np.int64) for _ in range(num_clients)]
    rounds = np.concatenate([np.full(len(c), t, dtype=np.int64) for t, c in enumerate(schedule, start=1)])
    clients = np.concatenate(schedule).astype(np.int64)
    order = np.lexsort((rounds, clients))     # by client, then round
    bounds = np.searchsorted(clients[order], np.arange(num_clients + 1))
    ordered = rounds[order]
    return [ordered[bounds[i]:bounds[i + 1]] for i in range(num_clients)]


def is_full(schedule: list[np.ndarray], num_clients: int) -> bool:
    """Every client trains in every round (``clients_per_round`` None, k = N, or a draw that happens to be)."""
    return all(len(c) == num_clients for c in schedule)
