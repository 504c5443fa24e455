"""DP-FedAvg with adaptive quantile clipping (Andrew et al., NeurIPS 2021).

Under ``privacy.unit=client`` this is the method as published: local SGD without DP; client i
clips its update to C^(t) and reports b_i = 1[‖Δ_i‖ ≤ C^(t)] (the norm before clipping); the server
adds N(0, σ_b²) to Σ_i (b_i − 1/2) (sensitivity 1/2), σ_b = k/20, and sets
b̄ = (Σ_i (b_i − 1/2) + noise)/k + 1/2, which is (Σ_i b_i + noise)/k when exactly k clients report;
C^(t+1) = C^(t)·exp(−η_c(b̄ − γ)). The update noise σ_Δ satisfies (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2) = σ, so the
round's joint release is accounted as one Gaussian of multiplier σ (``raysim.privacy.population``).
``quantile.noise_multiplier`` and ``quantile.norm_source`` are the record-level variant's keys.

Under ``privacy.unit=example`` (a record-level variant):

Clients run local DP-SGD (as FedSA) with the current clip norm C^(t), starting from
``privacy.clip_norm``. After each round every client contributes b_i ∈ [0, 1], the server averages
them into b̄ and sets C^(t+1) = C^(t)·exp(−η_c·(b̄ − γ)) (``quantile.eta_c`` = 0.2,
``quantile.target_quantile`` γ = 0.5): C moves towards the γ-quantile of the tracked norms.

Which norms b_i tracks is ``quantile.norm_source`` (R):

* ``per_example`` (default): b_i = the fraction of client i's examples whose gradient norm at the
  round's starting model is ≤ C^(t), from the pre-round norm pass over all n_i examples
  (:func:`raysim.training.example_norm_pass`), which is independent of the round's DP-SGD sampling
  and noise. Andrew et al. track the quantile of the *unclipped* update norm; in record-level DP-SGD
  the unclipped quantity is the per-example gradient, so this is their estimator applied to it.
  b_i is computed from private data, so the *client* adds N(0, σ_b²) (σ_b =
  ``quantile.noise_multiplier``) from its own stream ``(seed, "quantile-noise", round, client)``
  before upload: a Gaussian mechanism of sensitivity 1 (b_i ∈ [0, 1]) composed into its ledger
  (docs/privacy.md). With σ_b = 0 the bit is uploaded as is and reported as not covered by ε.
  (Andrew et al. noise the sum on a trusted server; raysim's server is honest but curious, so each
  client noises its own b_i and the noise of the mean b̄ is σ_b/√N.)
* ``update``: b_i = 1[s_i ≤ C^(t)] with s_i = ‖Δw_i‖/(η_l·τ_i), the update norm in per-step units as in
  ADPC, noised by the server from ``(seed, "quantile-noise", round)``. Post-processing of DP outputs
  (free), but degenerate in this setting: the clean part of s_i is
  a mean of clipped gradients and so ≤ C, and the rest is DP noise, so b_i says more about the noise
  than about the gradients (C shrinks every round when the noise energy exceeds C², else grows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from raysim.algorithms.base import Aggregate, MethodContext, MethodSpec, Server, client_level_gaussian
from raysim.algorithms.registry import register
from raysim.algorithms.server_math import noised_fraction_below, quantile_clip_update, update_norm_per_step
from raysim.algorithms.uploads import Release, Upload, UploadContext
from raysim.config import Config, check_choice, fail
from raysim.rng import np_generator
from raysim.messages import ClientResult


@dataclass(frozen=True)
class QuantileParams:
    """``quantile.*``."""

    eta_c: float = 0.2
    target_quantile: float = 0.5
    noise_multiplier: float = 0.0      # σ_b of the clipped-count release (0: not private)
    norm_source: str = "per_example"   # (R) per_example (fraction of unclipped examples) | update (‖Δw‖ per step)

    def check(self, cfg: Config) -> None:
        for key in ("eta_c", "noise_multiplier"):
            if not getattr(self, key) >= 0:
                fail(f"quantile.{key}", f"must be >= 0, got {getattr(self, key)}")
        if not 0 <= self.target_quantile <= 1:
            fail("quantile.target_quantile", f"must be in [0, 1], got {self.target_quantile}")
        check_choice("quantile.norm_source", self.norm_source, ("per_example", "update"))


def _unclipped_fraction(ctx: UploadContext) -> float:
    """b_i = the fraction of the client's examples whose gradient norm at the round's starting model is
    ≤ C^(t) (the pre-round norm pass), plus N(0, σ_b²) from the client's own stream when σ_b > 0."""
    sigma = ctx.cfg.quantile.noise_multiplier
    norms = ctx.example_norms
    b = float(np.mean(norms <= ctx.task.clip_norm)) if norms is not None and norms.size else 0.0
    return float(b + sigma * ctx.rng("quantile-noise").standard_normal()) if sigma > 0 else float(b)


def _update_within_clip(ctx: UploadContext) -> float:
    """b_i = 1[‖Δ_i‖ ≤ C^(t)] with the norm before clipping (client unit: the server noises the count)."""
    return float(ctx.update_norm is not None and ctx.update_norm <= float(ctx.task.clip_norm))


def quantile_uploads(cfg: Config) -> tuple[Upload, ...]:
    if cfg.privacy.unit == "client":
        return (Upload("update_within_clip", "b_i = 1[‖Δ_i‖ <= C^(t)], the update norm before clipping",
                       _update_within_clip, Release("joint")),)
    if cfg.quantile.norm_source != "per_example":
        return ()
    sigma = cfg.quantile.noise_multiplier
    release = Release("gaussian", sigma) if sigma > 0 else Release("not_covered")
    return (Upload("unclipped_fraction", "b_i, fraction of the round's examples with gradient norm <= C",
                   _unclipped_fraction, release, needs_example_norms=True),)


class QuantileClipServer(Server):
    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        self.current_clip = float(self.cfg.privacy.clip_norm)

    def clip_norm(self, server_round: int) -> float:
        return self.current_clip

    def unclipped_fraction(self, server_round: int, results: Sequence[ClientResult]) -> float:
        """b̄, the noised mean of the clients' b_i (see the module docstring)."""
        q = self.cfg.quantile
        plan = self.ctx.client_level
        if plan is not None:
            rng = np_generator(self.cfg.train_seed, "quantile-noise", server_round)
            centred = sum(float(r.uploads["update_within_clip"]) - 0.5 for r in results)
            return centred / plan.denominator + plan.count_noise_std() * float(rng.standard_normal()) + 0.5
        if q.norm_source == "update":
            rng = np_generator(self.cfg.train_seed, "quantile-noise", server_round)
            s = np.array([update_norm_per_step(float(r.delta.norm()), self.cfg.lr, r.num_steps) for r in results])
            return noised_fraction_below(s, self.current_clip, q.noise_multiplier, rng)
        return float(np.mean([r.uploads["unclipped_fraction"] for r in results]))

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
    server=QuantileClipServer, private=True, uploads=quantile_uploads, adaptive_clip=lambda cfg: True,
    client_level=client_level_gaussian,
    client_level_note="as published: the noised count of unclipped updates (σ_b = k/20), one joint Gaussian",
    params={"quantile": QuantileParams},
    round_columns=(("next_clip_norm", "float64"), ("clipped_fraction_noisy", "float64"))))
