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
from raysim.config import Config
from raysim.messages import ClientResult, ClientTask, RoundPayload


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


class Server:
    """Server strategy base: fixed clip norm, FedAvg weights n_i / Σ n_j, w ← w + Σ p_i Δ_i.

    Partial participation: ``tasks`` gets the round's participants and ``aggregate`` their results only
    (sorted by client id, never empty: the simulation skips the server in a round without participants).
    Per-client state is kept for absent clients and updated only from the clients that report."""

    def __init__(self, ctx: MethodContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg

    # --- privacy plan (used before round 1 to calibrate σ, and every round) ---------------
    @classmethod
    def sigma_schedule(cls, cfg: Config) -> np.ndarray:
        """Relative noise multiplier of each round t = 1..T (DP-ACDN decays it); ones by default."""
        return np.ones(cfg.rounds)

    # --- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the strategy learned so far (ADPC's C, CRA's EMAs, momenta, controls, …): its
        attributes except the fixed context. A subclass whose state is not plain attributes overrides."""
        return {k: v for k, v in vars(self).items() if k not in ("ctx", "cfg")}

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
        n = np.array([r.num_samples for r in results], dtype=np.float64)
        return n / n.sum()

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        weights = self.sample_weights(results)
        step = weighted_sum([r.delta for r in results], weights)
        logs = [{"aggregation_weight": float(w)} for w in weights]
        return Aggregate(global_weights + step, logs, {})


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
