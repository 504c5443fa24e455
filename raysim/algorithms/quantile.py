"""DP-FedAvg with adaptive quantile clipping (Andrew et al., NeurIPS 2021).

Under ``privacy.unit=client`` this is the method as published: local SGD without DP; client i
clips its update to C^(t) and reports b_i = 1[‖Δ_i‖ ≤ C^(t)] (the norm before clipping); the server
adds N(0, σ_b²) to Σ_i (b_i − 1/2) (sensitivity 1/2), σ_b = ``quantile.noise_multiplier`` or, unset,
k/20 (the paper's recommendation, k the expected cohort the noise is sized for), and sets
b̄ = (Σ_i (b_i − 1/2) + noise)/k + 1/2, which is (Σ_i b_i + noise)/k when exactly k clients report;
C^(t+1) = C^(t)·exp(−η_c(b̄ − γ)). The update noise σ_Δ satisfies (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2) = σ, so the
round's joint release is accounted as one Gaussian of multiplier σ (``raysim.privacy.population``): a
larger σ_b leaves more of the budget to the update. ``quantile.norm_source`` is the record-level
variant's key (``update`` is refused under this unit).

Under ``privacy.unit=example`` (a record-level variant):

Clients run local DP-SGD (as FedSA) with the current clip norm C^(t), starting from
``privacy.clip_norm``. After each round every client contributes b_i ∈ [0, 1], the server averages
them into b̄ and sets C^(t+1) = C^(t)·exp(−η_c·(b̄ − γ)) (``quantile.eta_c`` = 0.2,
``quantile.target_quantile`` γ = 0.5): C moves towards the γ-quantile of the tracked norms.

Which norms b_i tracks is ``quantile.norm_source`` (R):

* ``per_example`` (default): client i releases c_i = the number of its examples whose gradient norm at
  the round's starting model is ≤ C^(t), from the pre-round norm pass over all n_i examples
  (:func:`raysim.training.example_norm_pass`), which is independent of the round's DP-SGD sampling
  and noise. Andrew et al. track the quantile of the *unclipped* update norm; in record-level DP-SGD
  the unclipped quantity is the per-example gradient, so this is their estimator applied to it.
  c_i is computed from private data, so the *client* adds N(0, σ_b²) (σ_b =
  ``quantile.noise_multiplier``, default 25 for this source: docs/methods.md) from its own stream
  ``(seed, "quantile-noise", round, client)`` before upload: a Gaussian mechanism of sensitivity 1
  (adding or removing one example changes the count by at most 1), composed into its ledger and into
  σ calibration (docs/privacy.md). The server forms b̄ = Σ_i c̃_i / Σ_i n_i (the sizes n_i are public),
  so the noise of b̄ is σ_b·√N / Σ n_i. σ_b = 0 uploads the count un-noised: not covered by ε, and
  refused unless ``privacy.allow_uncovered`` lists ``quantile.unclipped_count``. (Andrew et al. noise
  the sum on a trusted server; raysim's server is honest but curious, so each client noises its own
  count.)
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
    noise_multiplier: float | None = None  # σ_b; unset: 25 for per_example (the client's count release,
                                       # sensitivity 1; 0 is not private and needs privacy.allow_uncovered:
                                       # [quantile.unclipped_count]), 0 for update (the server's, post-processing);
                                       # privacy.unit=client: the server's noise on Σ(b_i − 1/2), unset k/20
    norm_source: str = "per_example"   # (R) per_example (fraction of unclipped examples) | update (‖Δw‖ per step)

    def check(self, cfg: Config) -> None:
        for key in ("eta_c", "noise_multiplier"):
            if getattr(self, key) is not None and not getattr(self, key) >= 0:
                fail(f"quantile.{key}", f"must be >= 0, got {getattr(self, key)}")
        if cfg.privacy.unit == "client" and self.noise_multiplier == 0:
            fail("quantile.noise_multiplier", "must be > 0 under privacy.unit=client: σ_b is the noise on the "
                 "count released with the update, which the joint σ accounts (unset: k/20)")
        if cfg.privacy.unit == "client" and self.norm_source != "per_example":
            fail("quantile.norm_source", "is the record-level variant's key; under privacy.unit=client b_i is "
                 "always 1[‖Δ_i‖ <= C^(t)] from the update's norm before clipping (leave it unset)")
        if not 0 <= self.target_quantile <= 1:
            fail("quantile.target_quantile", f"must be in [0, 1], got {self.target_quantile}")
        check_choice("quantile.norm_source", self.norm_source, ("per_example", "update"))


#: σ_b of the per-example count release when ``quantile.noise_multiplier`` is unset (docs/methods.md)
COUNT_NOISE_MULTIPLIER = 25.0


def sigma_b(cfg: Config) -> float:
    """``quantile.noise_multiplier``, or its default for the norm source."""
    q = cfg.quantile
    if q.noise_multiplier is not None:
        return float(q.noise_multiplier)
    return COUNT_NOISE_MULTIPLIER if q.norm_source == "per_example" else 0.0


def _unclipped_count(ctx: UploadContext) -> float:
    """c_i = the number of the client's examples whose gradient norm at the round's starting model is
    ≤ C^(t) (the pre-round norm pass), plus N(0, σ_b²) from the client's own stream when σ_b > 0."""
    sigma = sigma_b(ctx.cfg)
    norms = ctx.example_norms
    count = float(np.sum(norms <= ctx.task.clip_norm)) if norms is not None else 0.0
    return float(count + sigma * ctx.rng("quantile-noise").standard_normal()) if sigma > 0 else count


def _update_within_clip(ctx: UploadContext) -> float:
    """b_i = 1[‖Δ_i‖ ≤ C^(t)] with the norm before clipping (client unit: the server noises the count)."""
    return float(ctx.update_norm is not None and ctx.update_norm <= float(ctx.task.clip_norm))


def quantile_uploads(cfg: Config) -> tuple[Upload, ...]:
    if cfg.privacy.unit == "client":
        given = cfg.quantile.noise_multiplier       # σ_b; unset (0 here): the plan's k/20
        return (Upload("update_within_clip", "b_i = 1[‖Δ_i‖ <= C^(t)], the update norm before clipping",
                       _update_within_clip, Release("joint", float(given or 0.0))),)
    if cfg.quantile.norm_source != "per_example":
        return ()
    sigma = sigma_b(cfg)
    release = Release("gaussian", sigma) if sigma > 0 else Release("not_covered")
    return (Upload("unclipped_count", "c_i, the client's examples with gradient norm <= C at the round's start",
                   _unclipped_count, release, needs_example_norms=True, opt_in="quantile.unclipped_count"),)


class QuantileClipServer(Server):
    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        self.current_clip = float(self.cfg.privacy.clip_norm)

    def clip_norm(self, server_round: int) -> float:
        return self.current_clip

    def unclipped_fraction(self, server_round: int, results: Sequence[ClientResult]) -> float:
        """b̄, the noised fraction of unclipped examples (see the module docstring)."""
        q = self.cfg.quantile
        plan = self.ctx.client_level
        if plan is not None:
            rng = np_generator(self.cfg.train_seed, "quantile-noise", server_round)
            centred = sum(float(r.uploads["update_within_clip"]) - 0.5 for r in results)
            return centred / plan.denominator + plan.count_noise_std() * float(rng.standard_normal()) + 0.5
        if q.norm_source == "update":
            rng = np_generator(self.cfg.train_seed, "quantile-noise", server_round)
            s = np.array([update_norm_per_step(r.update_norm(), self.cfg.lr, r.num_steps) for r in results])
            return noised_fraction_below(s, self.current_clip, sigma_b(self.cfg), rng)
        total = sum(r.num_samples for r in results)
        return float(sum(r.uploads["unclipped_count"] for r in results) / total) if total else 0.0

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
    client_level_note="as published: the noised count of unclipped updates (σ_b = quantile.noise_multiplier, "
                      "default k/20), one joint Gaussian",
    params={"quantile": QuantileParams},
    round_columns=(("next_clip_norm", "float64"), ("clipped_fraction_noisy", "float64"))))
