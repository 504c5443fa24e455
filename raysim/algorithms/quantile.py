"""DP-FedAvg with adaptive quantile clipping (Andrew et al., NeurIPS 2021), record-level variant.

Clients run local DP-SGD (as FedSA) with the current clip norm C^(t), starting from
``privacy.clip_norm``. After each round every client contributes b_i ∈ [0, 1], the server releases
b̄ = (Σ_i b_i + N(0, σ_b²))/N with σ_b = ``quantile.noise_multiplier`` (noise drawn from the stream
``(seed, "quantile-noise", round)``), and sets C^(t+1) = C^(t)·exp(−η_c·(b̄ − γ)) (``quantile.eta_c``
= 0.2, ``quantile.target_quantile`` γ = 0.5): C moves towards the γ-quantile of the tracked norms.

Which norms b_i tracks is ``quantile.norm_source`` (R):

* ``per_example`` (default): b_i = the fraction of client i's examples in this round whose gradient
  norm was ≤ C^(t) (1 − ``frac_clipped``). Andrew et al. track the quantile of the *unclipped* update
  norm; in record-level DP-SGD the unclipped quantity is the per-example gradient, so this is their
  estimator applied to it. b_i is computed from private data: with σ_b > 0 its release is a Gaussian
  mechanism of sensitivity 1 (b_i ∈ [0, 1]) composed into each client's ledger (the plan's
  ``clipped_count`` side channel); with σ_b = 0 it is reported as not covered by ε.
* ``update``: b_i = 1[s_i ≤ C^(t)] with s_i = ‖Δw_i‖/(η_l·τ_i), the update norm in per-step units as in
  ADPC. Post-processing of DP outputs (free), but degenerate in this setting: the clean part of s_i is
  a mean of clipped gradients and so ≤ C, and the rest is DP noise, so b_i says more about the noise
  than about the gradients (C shrinks every round when the noise energy exceeds C², else grows).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from raysim.algorithms.base import Aggregate, MethodContext, MethodSpec, Server
from raysim.algorithms.registry import register
from raysim.algorithms.server_math import noised_fraction_below, quantile_clip_update, update_norm_per_step
from raysim.rng import np_generator
from raysim.types import ClientResult


def noised_mean(values: np.ndarray, noise_std: float, rng: np.random.Generator) -> float:
    """(Σ_i v_i + N(0, noise_std²)) / n for v_i ∈ [0, 1] (sensitivity 1 of the sum); one normal is always drawn."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or np.any((arr < 0.0) | (arr > 1.0)):
        raise ValueError(f"values must be a non-empty 1-D array in [0, 1], got {arr}")
    if noise_std < 0.0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std}")
    return float((arr.sum() + noise_std * float(rng.standard_normal())) / arr.size)


class QuantileClipServer(Server):
    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        self.current_clip = float(self.cfg.privacy.clip_norm)

    def clip_norm(self, server_round: int) -> float:
        return self.current_clip

    def unclipped_fraction(self, server_round: int, results: Sequence[ClientResult]) -> float:
        """b̄, the noised mean of the clients' b_i (see the module docstring)."""
        q = self.cfg.quantile
        rng = np_generator(self.cfg.seed, "quantile-noise", server_round)
        if q.norm_source == "update":
            s = np.array([update_norm_per_step(float(r.delta.norm()), self.cfg.lr, r.num_steps) for r in results])
            return noised_fraction_below(s, self.current_clip, q.noise_multiplier, rng)
        return noised_mean(np.array([1.0 - r.frac_clipped for r in results]), q.noise_multiplier, rng)

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        agg = super().aggregate(server_round, global_weights, results)
        q = self.cfg.quantile
        b_bar = self.unclipped_fraction(server_round, results)
        self.current_clip = quantile_clip_update(self.current_clip, b_bar, eta_c=q.eta_c, target_quantile=q.target_quantile)
        agg.round_logs.update(clipped_fraction_noisy=b_bar, next_clip_norm=self.current_clip)
        return agg


DP_FEDAVG_ADAPTIVE = register(MethodSpec(
    name="dp-fedavg-adaptive",
    summary="DP-FedAvg, adaptive clip C ← C·exp(−η_c(b̄ − γ)) towards a noised quantile (quantile.*)",
    source="Andrew et al., Differentially Private Learning with Adaptive Clipping, NeurIPS 2021",
    server=QuantileClipServer, private=True))
