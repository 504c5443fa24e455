"""What a federated method is: a server strategy and client hooks around one training loop.

A method never copies the local training loop (``raysim.training.local_train``) or the round
loop (``raysim.simulation``). It changes behaviour through small hooks:

* client side (:class:`ClientHooks`): how the private gradient of a step is obtained (SAM),
  a data-independent gradient term added *after* privatisation (proximal terms, SCAFFOLD's
  correction: post-processing, so free in privacy), and what is uploaded besides Δw;
* server side (:class:`Server`): the clip norm and noise scale of each round, what is
  broadcast, and how uploads are aggregated into the next global model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, Sequence

import numpy as np
import torch

from raysim.algorithms import flat
from raysim.algorithms.uploads import Upload
from raysim.config import Config, client_mechanism, client_mechanisms
from raysim.messages import ClientResult, ClientTask, RoundPayload
from raysim.noise import GaussianNoise


class ClientStates(Protocol):
    """The server's per-client states (``raysim.state_store.ClientStateStore``): read per participant."""

    def get(self, client_id: int, default: Any = None) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class MethodContext:
    """Facts about a run that the server side needs, fixed before round 1."""

    cfg: Config
    clipping: str                      # resolved clipping mode: per_sample | batch | none
    num_params: int
    layer_slices: tuple[tuple[int, int], ...]   # [start, end) of each parametrised layer in the flat vector
    num_samples: np.ndarray            # n_i, local training-set sizes
    num_steps: np.ndarray              # τ_i, local steps per round
    noise_multipliers: np.ndarray      # σ_i (base, before any per-round schedule); 0 without DP. A read-only
                                       # view of the privacy book's plan, which under partial participation
                                       # the book fills as clients are first planned (NaN until then);
                                       # always set for a round's participants
    #: macro-F1 of flat weights on the public server hold-out (``data.server_holdout``), or None without one
    holdout_f1: Callable[[torch.Tensor], float] | None = None
    #: ``privacy.unit=client``: the population's noise plan, a ``raysim.privacy.population.ClientLevelPlan``
    #: (the server noises the cohort's clipped sum); None under ``privacy.unit=example``
    client_level: Any = None

    def __post_init__(self) -> None:
        view = np.asarray(self.noise_multipliers, dtype=np.float64).view()
        view.flags.writeable = False          # the plan is the book's to fill, never a method's
        object.__setattr__(self, "noise_multipliers", view)


@dataclass
class Aggregate:
    """Result of one server aggregation."""

    global_weights: torch.Tensor
    client_logs: list[dict[str, float]] = field(default_factory=list)   # aligned with the sorted results
    round_logs: dict[str, float] = field(default_factory=dict)


def weighted_sum(deltas: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Σ_i w_i Δ_i (float64 accumulation, :func:`raysim.algorithms.flat.sum64`) in Δ's dtype."""
    return flat.sum64(deltas, weights).to(deltas[0].dtype)


def sum_weight(cfg: Config, result: ClientResult) -> float:
    """A client's weight in the update sums that workers return (``runtime.sum_on_actors``): its n_i
    (FedAvg's weights, divided by Σ n_j at the server), or 1 under ``privacy.unit=client``."""
    return 1.0 if cfg.privacy.unit == "client" else float(result.num_samples)


def fold_updates(cfg: Config, results: Sequence[ClientResult]) -> tuple[list[ClientResult], torch.Tensor]:
    """A worker's share of a round, summed (``runtime.sum_on_actors``): the results with their Δ replaced
    by its norm (``delta_norm``, which also tells the server whether Δ was finite), and the float64 sum
    Σ_i w_i Δ_i (:func:`sum_weight`) over the share in client-id order, for :meth:`Server.aggregate_sum`."""
    results = sorted(results, key=lambda r: r.client_id)
    total = flat.sum64([r.delta for r in results], [sum_weight(cfg, r) for r in results])
    return [r.without_delta() for r in results], total


def _snr(signal: torch.Tensor, noise: torch.Tensor) -> float:
    """‖signal‖ / ‖noise‖ in float64 (inf for noise of norm 0)."""
    norm = float(torch.linalg.vector_norm(noise.double()))
    return float(torch.linalg.vector_norm(signal.double())) / norm if norm > 0 else float("inf")


def _shares(num_samples: Sequence[int]) -> np.ndarray:
    """FedAvg's weights n_i / Σ_j n_j."""
    n = np.array(num_samples, dtype=np.float64)
    return n / n.sum()


class Server:
    """Server strategy base: fixed clip norm, FedAvg weights n_i / Σ n_j, w ← w + Σ p_i Δ_i.

    Partial participation: ``tasks`` gets the round's participants and ``aggregate`` their results only
    (sorted by client id, never empty: the simulation skips the server in a round without participants).
    Per-client state is kept for absent clients and updated only from the clients that report."""

    def __init__(self, ctx: MethodContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        if ctx.client_level is not None and ctx.client_level.releases_prefix_sums:
            self.tree_anchor: torch.Tensor | None = None   # DP-FTRL: the weights the current pass started from
            self.tree_sum: torch.Tensor | None = None      # and the pass's exact sum of clipped updates so far
        if ctx.client_level is not None and ctx.client_level.correlated:
            #: blt, bandmf: the state of the noise (C⁻¹ z)_t, one step per round (checkpointed with the server)
            self.noise_stream = ctx.client_level.new_stream(ctx.num_params)

    # --- privacy plan (used before round 1 to calibrate σ, and every round) ---------------
    @classmethod
    def sigma_schedule(cls, cfg: Config) -> np.ndarray:
        """Relative noise multiplier of each round t = 1..T (DP-ACDN decays it); ones by default."""
        return np.ones(cfg.rounds)

    # --- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the strategy learned so far (ADPC's C, CRA's EMAs, momenta, controls, …): its
        attributes except the fixed context. A subclass whose state is not plain attributes overrides."""
        return {k: v for k, v in vars(self).items() if k not in ("ctx", "cfg", "release_snr")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)

    # --- per round ---------------------------------------------------------------------
    def clip_norm(self, server_round: int) -> float | tuple[float, ...]:
        return float(self.cfg.privacy.clip_norm)

    def noise_multiplier(self, client_id: int, server_round: int) -> float:
        return float(self.ctx.noise_multipliers[client_id] * self.sigma_schedule(self.cfg)[server_round - 1])

    def lr_scale(self, server_round: int) -> float:
        """Factor of ``cfg.lr`` for the round's local steps (FedDimDP's ``adpc.step=normalized``); 1 by default.
        Computed from the server's state only (public values), so it is post-processing and costs no privacy."""
        return 1.0

    def payload(self, server_round: int, global_weights: torch.Tensor) -> RoundPayload:
        return RoundPayload(server_round, global_weights, global_weights, {})

    def tasks(self, server_round: int, client_states: ClientStates,
              participants: Sequence[int]) -> list[ClientTask]:
        """One task per participant of the round (sorted client ids; all clients under full participation)."""
        clip, lr_scale = self.clip_norm(server_round), self.lr_scale(server_round)
        return [ClientTask(int(cid), server_round, clip, self.noise_multiplier(int(cid), server_round),
                           client_states.get(int(cid)), lr_scale)
                for cid in participants]

    def sample_weights(self, results: Sequence[ClientResult]) -> np.ndarray:
        return _shares([r.num_samples for r in results])

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        if self.ctx.client_level is not None:
            return self._client_level(server_round, global_weights, results)
        total = flat.sum64([r.delta for r in results], self.sample_weights(results))
        return self.aggregate_folded(server_round, global_weights, results, total)

    def fold_weights(self, num_samples: Sequence[int]) -> list[float]:
        """The w_i of the sum Σ_i w_i Δ_i that :meth:`aggregate` takes, for a cohort whose clients (in
        client-id order) train on ``num_samples`` examples: n_i / Σ_j n_j, or 1 under ``privacy.unit=client``.
        An executor may fold the updates into that sum as they arrive (:meth:`aggregate_folded`)."""
        if self.ctx.client_level is not None:
            return [1.0] * len(num_samples)
        return [float(w) for w in _shares(num_samples)]

    def aggregate_folded(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult],
                         total: torch.Tensor) -> Aggregate:
        """:meth:`aggregate` from ``total``, the float64 Σ_i w_i Δ_i (:meth:`fold_weights`) that the executor
        folded in client-id order as the updates arrived (``results`` carry no Δ): the same adds in the same
        order as :meth:`aggregate`'s, so the same bits."""
        if self.ctx.client_level is not None:
            return self._client_level(server_round, global_weights, results, total)
        logs = [{"aggregation_weight": float(w)} for w in self.sample_weights(results)]
        return Aggregate(global_weights + total.to(global_weights.dtype), logs, {})

    def aggregate_sum(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult],
                      total: torch.Tensor) -> Aggregate:
        """:meth:`aggregate` from the float64 sum Σ_i w_i Δ_i that the workers returned instead of each Δ_i
        (``runtime.sum_on_actors``, :func:`fold_updates`; ``results`` carry no Δ). The same rule, rounded
        differently: the step is (Σ_i n_i Δ_i) / Σ_j n_j instead of Σ_i (n_i / Σ_j n_j) Δ_i."""
        if self.ctx.client_level is not None:
            return self._client_level(server_round, global_weights, results, total)
        weights = self.sample_weights(results)
        n = float(sum(r.num_samples for r in results))
        logs = [{"aggregation_weight": float(w)} for w in weights]
        return Aggregate(global_weights + (total / n).to(global_weights.dtype), logs, {})

    # --- privacy.unit=client ------------------------------------------------------------
    def _client_level(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult],
                      total: torch.Tensor | None = None) -> Aggregate:
        """The client-level release (DP-FTRL's tree, else the Gaussian mean), from ``total`` = Σ_i clip_C(Δ_i)
        when the workers summed the updates, else from the results' updates."""
        if self.ctx.client_level.releases_prefix_sums:
            return Aggregate(self.tree_release(server_round, global_weights, results, total), self.uniform_logs(results))
        return Aggregate(global_weights + self.private_mean(server_round, results, total), self.uniform_logs(results), {})

    def private_mean(self, server_round: int, results: Sequence[ClientResult],
                     total: torch.Tensor | None = None) -> torch.Tensor:
        """The round's client-level release: (Σ_i clip_C(Δ_i) + N(0, σ_Δ²C²I)) / k, the updates clipped by
        their clients, the noise drawn here from ``(seed, "server-dp-noise", round)`` and sized by the plan
        (``MethodContext.client_level``; k the expected cohort size, also for a cohort that came out empty).
        Under blt and bandmf that draw is z_t, and the noise is σ·sens·C·(C⁻¹ z)_t (correlated across rounds).
        ``total``: Σ_i clip_C(Δ_i) as the workers summed it (:meth:`aggregate_sum`)."""
        plan = self.ctx.client_level
        if plan is None:
            raise RuntimeError("private_mean is the client-level aggregate; this run is privacy.unit=example")
        clip = self.clip_norm(server_round)
        if total is None:
            total = self.client_sum(results)
        if plan.correlated:   # blt, bandmf: the round's row of C⁻¹ z, z_t drawn from the round's stream
            z = GaussianNoise(self.cfg.train_seed, "server-dp-noise", server_round).vector(self.ctx.num_params, 1.0)
            noise = self.noise_stream.step(z) * plan.correlated_noise_std(float(clip))
        else:
            std = plan.update_noise_std(server_round, float(clip))
            noise = GaussianNoise(self.cfg.train_seed, "server-dp-noise", server_round).vector(self.ctx.num_params, std)
        mean = total / plan.denominator
        self.release_snr = _snr(mean, noise)
        return (mean + noise.double()).to(torch.float32)

    def mean_update(self, server_round: int, results: Sequence[ClientResult],
                    weights: Sequence[float] | None = None) -> tuple[torch.Tensor, list[dict[str, float]]]:
        """The round's mean update in float64, for a server rule that steps from it (a momentum, an EMA), and
        each participant's ``aggregation_weight`` log. Under ``privacy.unit=client`` it is the client-level
        release (:meth:`private_mean`: the clipped updates' sum, noised, over k; each weight 1/k) and
        ``weights`` is not used; else Σ_i w_i Δ_i with ``weights``, by default the sample shares n_i / Σ_j n_j."""
        if self.ctx.client_level is not None:
            return self.private_mean(server_round, results).double(), self.uniform_logs(results)
        w = self.sample_weights(results) if weights is None else [float(x) for x in weights]
        return flat.sum64([r.delta for r in results], w), [{"aggregation_weight": float(x)} for x in w]

    def client_sum(self, results: Sequence[ClientResult]) -> torch.Tensor:
        """Σ_i Δ_i in float64 (zeros for an empty cohort)."""
        return (flat.sum64([r.delta for r in results], [1.0] * len(results)) if results
                else torch.zeros(self.ctx.num_params, dtype=torch.float64))

    def tree_release(self, server_round: int, global_weights: torch.Tensor,
                     results: Sequence[ClientResult], total: torch.Tensor | None = None) -> torch.Tensor:
        """DP-FTRL (``privacy.mechanism=tree``): w_t = w_pass + (Σ_{s ≤ t in the pass} Σ_i clip_C(Δ_i,s) + Z_t)/k,
        with Z_t the tree-aggregation noise of the pass's prefix t (``ClientLevelPlan.prefix_noise``);
        the tree restarts, and w_pass is reset to the current weights, at the start of every pass. ``total``:
        the round's Σ_i clip_C(Δ_i) as the workers summed it (:meth:`aggregate_sum`)."""
        plan = self.ctx.client_level
        pass_index, slot = divmod(server_round - 1, plan.per_pass)
        if slot == 0 or self.tree_anchor is None:
            self.tree_anchor = global_weights.double().clone()
            self.tree_sum = torch.zeros(self.ctx.num_params, dtype=torch.float64)
        if results:
            self.tree_sum = self.tree_sum + (self.client_sum(results) if total is None else total)
        std = plan.update_sigma * float(self.clip_norm(server_round))
        noise = plan.prefix_noise(self.cfg.train_seed, pass_index, slot + 1, std, self.ctx.num_params)
        self.release_snr = _snr(self.tree_sum, noise)
        return (self.tree_anchor + (self.tree_sum + noise) / plan.denominator).to(torch.float32)

    def take_release_snr(self) -> float | None:
        """The last client-level release's signal-to-noise ratio, ‖un-noised aggregate‖ / ‖noise added to it‖,
        once (None if no release was made since). A diagnostic for the rounds table, computed from the
        un-noised sum: the simulation logs it and no server rule reads it."""
        return vars(self).pop("release_snr", None)

    def uniform_logs(self, results: Sequence[ClientResult]) -> list[dict[str, float]]:
        """Client-level aggregation weights: 1/k for every participant (weights by n_i would make the
        sensitivity depend on private sizes)."""
        plan = self.ctx.client_level
        k = plan.denominator if plan is not None else len(results)
        return [{"aggregation_weight": 1.0 / k} for _ in results]


class ClientHooks:
    """Client-side hooks base: plain local (DP-)SGD from the broadcast start weights."""

    #: DP releases per local step (SAM's "both" mode makes two on the same batch).
    releases_per_step: ClassVar[int] = 1

    def __init__(self, cfg: Config, payload: RoundPayload, task: ClientTask) -> None:
        self.cfg = cfg
        self.payload = payload
        self.task = task

    @classmethod
    def releases_for(cls, cfg: Config) -> int:
        """DP releases per local step for the run ``cfg`` (the privacy plan reads this, not the attribute),
        so a method whose count depends on a config option (DP-FedSAM's ``sam.mode``) is accounted right.
        An override must agree with ``releases_per_step`` of the hooks it constructs for ``cfg``: the
        training loop makes exactly that many releases per step."""
        return cls.releases_per_step

    def private_gradient(self, params: list[torch.nn.Parameter], compute: Callable[[], Any]) -> Any:
        """Obtain one step's privatised gradient; ``compute()`` makes one DP release on the step's batch."""
        return compute()

    def extra_gradient(self, params: list[torch.nn.Parameter]) -> list[torch.Tensor] | None:
        """Gradient of a data-independent loss term, added after privatisation (post-processing)."""
        return None

    def finalize(self, params: list[torch.nn.Parameter], num_steps: int) -> dict[str, Any] | None:
        """New persistent client state (returned to the server); None keeps none."""
        return self.task.client_state


def _no_uploads(cfg: Config) -> tuple[Upload, ...]:
    return ()


def _never(cfg: Config) -> bool:
    return False


def _accept(cfg: Config, clipping: str) -> None:
    return None


def _plain_model(cfg: Config) -> dict[str, Any]:
    return {}


def _every_section(cfg: Config, name: str) -> bool:
    return True


def _as_given(cfg: Config) -> Config:
    return cfg


def _example_only(cfg: Config) -> str | None:
    return "it is defined for record-level DP-SGD only"


def client_level_any(cfg: Config) -> str | None:
    """``MethodSpec.client_level`` of a method whose server steps by the plain mean update: it runs
    under the client unit with either mechanism (tree aggregation releases prefix sums of the same sums)."""
    return None


def client_level_gaussian(cfg: Config) -> str | None:
    """``MethodSpec.client_level`` of a method whose server rule needs each round's noised mean on its own
    (momentum, adaptive C): the client unit's Gaussian mechanism, not tree aggregation."""
    if client_mechanism(cfg.privacy.mechanism).prefix_sums:
        *others, last = [m.name for m in client_mechanisms() if not m.prefix_sums]
        return (f"its server rule takes each round's noised mean, while privacy.mechanism={cfg.privacy.mechanism} "
                f"releases prefix sums; use privacy.mechanism={', '.join(others)} or {last}")
    return None


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its server and client parts and what it needs from the run.

    Everything a method is lives in its one module and is declared here:

    * ``params``: the config sections it owns, section name → frozen dataclass (defaults, and a
      ``check(cfg)`` raising ``ConfigError`` for bad values); registering the spec registers them with the
      config parser, and the method reads them as ``cfg.<section>``;
    * ``uploads(cfg)``: everything the clients upload besides Δw (and the diagnostics they log); ledger, σ
      calibration and the not-covered list follow from it;
    * ``client_columns`` / ``round_columns``: the columns its server logs (``Aggregate.client_logs`` and
      ``round_logs``) and its uploads fill, as (name, Arrow type name); the results schema is built from them;
    * ``model_options(cfg)``: keyword options of ``raysim.models.build_backbone`` for this run's model.
      FedDimDP's LLDM block is such an option, and its code stays in ``raysim/models/lldm.py``: it is
      inserted inside each backbone (after the last stage, before pooling), where only the backbone
      builders can place it, and the per-sample engine must see its layers like any other.

    ``preset`` makes this name a preset of another method's switches (dotted config keys → values, e.g.
    FedDimDP's ablations).

    ``resolve(cfg)`` fills in keys whose default depends on the run (e.g. on ``privacy.unit``).

    ``client_level(cfg)`` says whether the run ``cfg`` can run under ``privacy.unit=client``: None when it
    can, else the reason it cannot (one line, shown to the user); ``client_level_note`` says how the method
    runs under that unit (``raysim methods``).
    """

    name: str
    summary: str
    source: str
    server: type[Server]
    client: type[ClientHooks] = ClientHooks
    private: bool = True               # a DP method: refuses privacy.clipping = none
    model_options: Callable[[Config], dict[str, Any]] = _plain_model
    per_layer_clipping: bool = False
    uploads: Callable[[Config], tuple[Upload, ...]] = _no_uploads
    validate: Callable[[Config, str], None] = _accept   # method-specific config checks (clipping resolved)
    preset: dict[str, Any] = field(default_factory=dict)
    preset_of: str | None = None       # the method whose switches ``preset`` sets
    #: the clip norm adapts during the run (ADPC, adaptive quantile clipping), so ``privacy.clip_norm`` is no
    #: fixed C to tune (``raysim tune`` searches it for the fixed-clip methods only)
    adaptive_clip: Callable[[Config], bool] = _never
    params: dict[str, type] = field(default_factory=dict)
    #: whether a run (presets resolved) uses one of ``params``' sections; the run id hashes only those
    uses_section: Callable[[Config, str], bool] = _every_section
    client_columns: tuple[tuple[str, str], ...] = ()
    round_columns: tuple[tuple[str, str], ...] = ()
    client_level: Callable[[Config], str | None] = _example_only
    client_level_note: str = ""
    #: fills in the method's keys left unset for the unit to decide (DP-FedSAM's ``sam.mode``); applied
    #: with the presets (``raysim.algorithms.registry.resolve_preset``), so the run id sees the values used
    resolve: Callable[[Config], Config] = _as_given
    #: what ``raysim audit``'s canaries cannot show for this method (one line, printed with its result)
    audit_caveat: str = ""

    @property
    def sums_updates(self) -> bool:
        """Whether workers may sum the round's updates for the server (``runtime.sum_on_actors``), and the
        executor fold them as they arrive (:meth:`Server.aggregate_folded`): its server is :class:`Server`
        itself, whose rule reads the updates only through Σ_i w_i Δ_i."""
        return self.server is Server

    def units(self) -> tuple[str, ...]:
        """The privacy units the method supports (``raysim methods``); a method that supports the client unit
        says how it runs there (``client_level_note``)."""
        return ("example", "client") if self.client_level_note else ("example",)
