"""DP-ACDN (reconstructed (R), docs/methods.md): decaying noise schedule + server-side EMA denoising.

The paper names this baseline "adaptive noise / communication denoising" without a usable
description; the rules below are the project's reconstruction.

* Noise schedule (R): σ_t = σ_0·γ^(t−1) for rounds t = 1..T (``acdn.gamma`` = 0.99). With
  ``privacy.epsilon`` the privacy plan calibrates σ_0 through the accountant on the whole decaying
  schedule, so the run ends at the target ε (never above it); later rounds are less noisy.
* Denoising (R): the server keeps m = μ·m + (1 − μ)·Δ̄ with m = 0 before round 1, Δ̄ = Σ_i (n_i/Σn) Δ_i
  the FedAvg aggregate of the round's participants, and applies w ← w + m (``acdn.momentum`` μ = 0.9). Zero initialisation makes
  every aggregate's total weight in the trajectory tend to 1 (a low-pass filter of FedAvg's steps),
  at the price of a slow start: round 1 moves the model by (1 − μ)·Δ̄.

Under ``privacy.unit=client`` the schedule scales the server's noise on the cohort sum instead, and
the EMA runs over the noised means.

Privacy: clients run DP-SGD with the round's σ_t (accounted round by round in the same ledger);
the EMA only post-processes DP outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from raysim.algorithms.base import Aggregate, MethodContext, MethodSpec, Server, client_level_gaussian
from raysim.algorithms.registry import register
from raysim.algorithms.server_math import decaying_sigma_schedule
from raysim.config import Config, fail
from raysim.messages import ClientResult


class ACDNServer(Server):
    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        self.schedule = self.sigma_schedule(self.cfg)
        self.momentum: torch.Tensor | None = None   # float64 EMA of the aggregates

    @classmethod
    def sigma_schedule(cls, cfg: Config) -> np.ndarray:
        return decaying_sigma_schedule(cfg.rounds, cfg.acdn.gamma)

    def noise_multiplier(self, client_id: int, server_round: int) -> float:
        return float(self.ctx.noise_multipliers[client_id] * self.schedule[server_round - 1])

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        mu = float(self.cfg.acdn.momentum)
        mean, logs = self.mean_update(server_round, results)
        if self.momentum is None:
            self.momentum = torch.zeros_like(mean)
        self.momentum = mu * self.momentum + (1.0 - mu) * mean
        new_weights = (global_weights.to(torch.float64) + self.momentum).to(global_weights.dtype)
        return Aggregate(new_weights, logs, {"noise_multiplier_scale": float(self.schedule[server_round - 1])})


@dataclass(frozen=True)
class ACDNParams:
    """``acdn.*``."""

    gamma: float = 0.99                # (R) σ_t = σ_0 γ^t
    momentum: float = 0.9              # (R) server EMA of aggregated updates

    def check(self, cfg: Config) -> None:
        if not 0 < self.gamma <= 1:
            fail("acdn.gamma", f"must be in (0, 1], got {self.gamma}")
        if not 0 <= self.momentum < 1:
            fail("acdn.momentum", f"must be in [0, 1), got {self.momentum}")


DP_ACDN = register(MethodSpec(
    name="dp-acdn", summary="DP-ACDN (R): σ_t = σ_0·acdn.gamma^(t−1) calibrated to ε, server EMA of aggregates",
    source="paper's DP-ACDN baseline ('adaptive noise / communication denoising'); reconstructed (docs/methods.md)",
    server=ACDNServer, private=True, params={"acdn": ACDNParams}, client_level=client_level_gaussian,
    client_level_note="the decaying σ_t on the server's noise (σ_0 calibrated to ε), EMA of the noised means",
    round_columns=(("noise_multiplier_scale", "float64"),)))
