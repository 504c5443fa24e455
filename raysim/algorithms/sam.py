"""DP-FedSAM (Shi et al., CVPR 2023): local sharpness-aware minimisation under DP-SGD (docs/methods.md).

Each local step takes the privatised gradient at the perturbed point ŵ = w + ρ·g/‖g‖ and steps
from w (``sam.rho`` = 0.05 (R) for this CNN). ``sam.mode`` (R) chooses where g comes from:

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
    """``sam.mode = both``: two privatised gradients per step on the same Poisson batch."""

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
    mode: str = "previous"             # (R) previous (1 release/step) | both (2 releases/step)

    def check(self, cfg: Config) -> None:
        check_choice("sam.mode", self.mode, ("previous", "both"))
        if not self.rho >= 0:
            fail("sam.rho", f"must be >= 0, got {self.rho}")


DP_FEDSAM = register(MethodSpec(
    name="dp-fedsam", summary="DP-FedSAM: local SAM (sam.rho, sam.mode) inside DP-SGD, FedAvg aggregation",
    source="Shi et al., Make Landscape Flatter in Differentially Private Federated Learning, CVPR 2023",
    server=Server, client=SAMHooks, private=True, params={"sam": SAMParams}))
