"""What a noise mechanism (``privacy.mechanism``) declares, for either privacy unit.

Under ``privacy.unit=client`` it is the noise on the cohort's sum of clipped updates; under
``privacy.unit=example`` (where it says :attr:`ClientMechanism.example_unit`) the noise on each client's
DP-SGD steps. A mechanism is one :class:`ClientMechanism` object, registered by name
(:func:`raysim.privacy.mechanisms.registry.register_mechanism`). The config asks it which cohorts and
accountant it accepts; :mod:`raysim.privacy.population` asks it how to plan and account a run; the server
asks it whether its release is a pass's prefix sums or carries correlated noise; the canary-client audit
asks whether it can audit it. Nothing outside the object compares mechanism names.

This module imports nothing of torch: the config validates against these objects. A mechanism's
methods import their mathematics when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysim.config import Config

#: A ``raysim.privacy.population.ClientLevelPlan`` (not imported: the plan imports the mechanisms).
Plan = Any

__all__ = ["ClientMechanism", "ExampleSteps"]


class ExampleSteps:
    """How one client's DP-SGD steps sample and are accounted under ``privacy.unit=example``: its τ steps a
    round draw from ``bands`` cyclic groups of its examples (step s from group s mod bands; one group of all
    examples is plain Poisson sampling), each example of that group with probability ``rate``; a round is
    ``events`` accounted Poisson-subsampled Gaussian releases at that rate (one per step of an example's
    group)."""

    def __init__(self, bands: int, rate: float, events: int) -> None:
        self.bands, self.rate, self.events = int(bands), float(rate), int(events)


class ClientMechanism:
    """One client-level mechanism. The class attributes declare what the run needs of it; the defaults
    are those of independent Gaussian rounds. Override the methods whose default does not fit."""

    #: ``privacy.mechanism``'s value.
    name: str = ""
    #: ``participation`` modes it accepts (with cyclic groups: within a group, when ``clients_per_round``
    #: is set).
    participation: tuple[str, ...] = ("uniform", "poisson")
    #: The one-line refusal of any other ``participation``.
    participation_advice: str = ""
    #: Its cohorts come from cyclic groups (``privacy.min_separation``): client i's rounds are G apart.
    cyclic: bool = False
    #: Its noise is correlated across rounds: the server draws it from :meth:`new_stream`.
    correlated: bool = False
    #: A round's release is its pass's prefix sum (over ⌈N/k⌉ rounds), not the round's noised mean.
    prefix_sums: bool = False
    #: Accounted by dp-accounting's RDP accountant only; ``accounted_as`` names it in the refusal of PLD.
    rdp_only: bool = False
    accounted_as: str = ""
    #: Accepts noise sized for a deployment (``privacy.noise_cohort_size``, ``privacy.population_size``).
    deployment: bool = False
    #: Accounts a noise multiplier that changes by round (a method's σ schedule).
    varying_sigma: bool = False
    #: The canary-client audit (``raysim audit`` under ``privacy.unit=client``) can audit it.
    canary_audit: bool = False
    #: Also the noise of each client's DP-SGD steps under ``privacy.unit=example``.
    example_unit: bool = False
    #: Its strategy can be optimised for a damped workload (``privacy.workload_decay``).
    damped_workload: bool = False

    def sampling(self, cfg: Config) -> str:
        """How the accounted cohorts are drawn: poisson | uniform | full | shuffle | cyclic (a deployment
        samples k' of N' every round: never full)."""
        if self.cyclic:
            return "cyclic"
        if cfg.clients_per_round is None:
            return "poisson" if cfg.privacy.noise_cohort_size is not None else "full"
        return cfg.participation

    def strategy(self, cfg: Config, groups: int) -> tuple[Any, float]:
        """The run's strategy (a correlated mechanism's factorisation; None) and its sensitivity (1)."""
        return None, 1.0

    def epsilon(self, plan: Plan, sigma: float, rounds: int) -> float:
        """ε at ``plan.delta`` after the first ``rounds`` rounds of ``plan`` at the noise multiplier ``sigma``
        (the calibration calls it with candidate σ's, the book with the plan's own)."""
        raise NotImplementedError

    def stepwise(self, sampling: str) -> bool:
        """Whether its rounds, on cohorts drawn as ``sampling`` (:meth:`sampling`), are add/remove
        ``StepEvent`` s (:meth:`round_event`; Poisson or full cohorts of independent Gaussians): then the population's ε is an incremental ledger of them, which
        :meth:`epsilon` must agree with, and the private tuning has their RDP curve."""
        return False

    def round_event(self, plan: Plan, sigma: float, server_round: int) -> Any:
        """Round ``server_round``'s release at the noise multiplier ``sigma`` as a ``StepEvent``
        (:meth:`stepwise` mechanisms)."""
        raise ValueError("only Poisson-sampled or full cohorts are StepEvents")

    def new_stream(self, plan: Plan, size: int) -> Any:
        """The correlated noise's streaming state for ``size`` coordinates (a ``StreamingNoise``)."""
        raise ValueError(f"privacy.mechanism={self.name} has no correlated noise stream")

    # --- privacy.unit=example: the noise of a client's DP-SGD steps ------------------------------------
    def example_steps(self, cfg: Config, num_samples: int, steps: int) -> ExampleSteps:
        """How a client of ``num_samples`` training examples and ``steps`` DP-SGD steps a round samples and
        is accounted. Independent noise: Poisson batches at q = min(1, B/n), one event a step."""
        return ExampleSteps(1, min(1.0, cfg.batch_size / num_samples), steps)

    def client_strategy(self, cfg: Config, total_steps: int, bands: int) -> tuple[float, ...] | None:
        """The strategy of a client's correlated step noise over its ``total_steps`` steps of the run (what
        its tasks carry), or None for independent noise."""
        return None

    def client_stream(self, strategy: tuple[float, ...], size: int) -> Any:
        """The streaming state of a client's correlated step noise for ``size`` coordinates."""
        raise ValueError(f"privacy.mechanism={self.name} has no correlated step noise")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
