"""DP-FedSAM (Shi et al., CVPR 2023): local sharpness-aware minimisation (docs/methods.md).

Each local step takes the gradient at the perturbed point ŵ = w + ρ·g/‖g‖ and steps from w
(``sam.rho`` = 0.05 (R) for this CNN). ``sam.mode`` chooses where g comes from; unset, it is
``both`` under ``privacy.unit=client`` and ``previous`` under ``privacy.unit=example``:

* under ``privacy.unit=client`` (the authors' own setting): local SAM without DP, g the gradient at w
  on the step's batch (``both``), and the whole update clipped and noised once by the server, as for
  every client-level method. ``previous`` is a cheaper variant there (one gradient per step).

Under ``privacy.unit=example`` (a record-level reading of the method, R):

* ``previous`` (default): g is the previous step's privatised gradient (no perturbation on a
  round's first step). One DP release per step; g is a DP output, so the perturbation is
  post-processing.
* ``both``: g is a privatised gradient at w on the step's batch, then the privatised gradient at ŵ
  on the same batch is the step. Two releases per step, both accounted (the privacy plan composes
  them as one release with σ/√2 through ``ClientHooks.releases_for``).

FedAvg aggregation; same clipping, accountant and calibrated σ as every DP method.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from raysim.algorithms.base import ClientHooks, MethodSpec, Server
from raysim.algorithms.registry import register
from raysim.config import Config, check_choice, fail
from raysim.messages import ClientTask, RoundPayload


def ascent_step(params: list[torch.nn.Parameter], direction: list[torch.Tensor], rho: float) -> list[torch.Tensor] | None:
    """Move ``params`` in place by ρ·g/‖g‖ (global l2 norm); returns the saved weights, or None if g = 0."""
    norm = torch.sqrt(sum((g.detach().double() ** 2).sum() for g in direction))
    if not float(norm) > 0.0 or rho == 0.0:
        return None
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        for p, g in zip(params, direction):
            p.add_(g.to(p.dtype), alpha=rho / float(norm))
    return saved


def restore(params: list[torch.nn.Parameter], saved: list[torch.Tensor] | None) -> None:
    if saved is not None:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


class SAMHooks(ClientHooks):
    """``sam.mode = previous``; constructing it with ``sam.mode = both`` gives a :class:`SAMBothHooks`."""

    def __new__(cls, cfg: Config, payload: RoundPayload, task: ClientTask) -> "SAMHooks":
        if cls is SAMHooks and cfg.sam.mode == "both":
            cls = SAMBothHooks
        return super().__new__(cls)

    def __init__(self, cfg: Config, payload: RoundPayload, task: ClientTask) -> None:
        super().__init__(cfg, payload, task)
        self.previous: list[torch.Tensor] | None = None

    @classmethod
    def releases_for(cls, cfg: Config) -> int:
        return SAMBothHooks.releases_per_step if cfg.sam.mode == "both" else SAMHooks.releases_per_step

    def private_gradient(self, params: list[torch.nn.Parameter], compute: Callable[[], Any]) -> Any:
        saved = None if self.previous is None else ascent_step(params, self.previous, self.cfg.sam.rho)
        try:
            result = compute()
        finally:
            restore(params, saved)
        self.previous = [g.detach() for g in result.grads]
        return result


class SAMBothHooks(SAMHooks):
    """``sam.mode = both``: two gradients per step on the same batch (privatised under the example unit)."""

    releases_per_step = 2

    def private_gradient(self, params: list[torch.nn.Parameter], compute: Callable[[], Any]) -> Any:
        first = compute()
        saved = ascent_step(params, first.grads, self.cfg.sam.rho)
        try:
            second = compute()
        finally:
            restore(params, saved)
        # Step with the gradient at ŵ; log the loss at w, the weights actually trained.
        return dataclasses.replace(second, loss_mean=first.loss_mean)


@dataclass(frozen=True)
class SAMParams:
    """``sam.*``."""

    rho: float = 0.05                  # (R) perturbation radius for this CNN
    mode: str | None = None            # previous (1 gradient, 1 release per step) | both (2 per step); null: both
                                       # under privacy.unit=client (the published form), previous (R) otherwise

    def check(self, cfg: Config) -> None:
        if self.mode is not None:
            check_choice("sam.mode", self.mode, ("previous", "both"))
        if not self.rho >= 0:
            fail("sam.rho", f"must be >= 0, got {self.rho}")


def _resolve_mode(cfg: Config) -> Config:
    if cfg.sam.mode is not None:
        return cfg
    mode = "both" if cfg.privacy.unit == "client" else "previous"
    return cfg.replace(sam=dataclasses.replace(cfg.sam, mode=mode))


def _client_level(cfg: Config) -> str | None:
    return None


DP_FEDSAM = register(MethodSpec(
    name="dp-fedsam", summary="DP-FedSAM: local SAM (sam.rho, sam.mode) inside DP-SGD, FedAvg aggregation",
    source="Shi et al., Make Landscape Flatter in Differentially Private Federated Learning, CVPR 2023",
    server=Server, client=SAMHooks, private=True, params={"sam": SAMParams}, resolve=_resolve_mode,
    client_level=_client_level, client_level_note="the published form: local SAM without DP, the update clipped "
                                                  "and noised by the server"))
