"""AWDP-FL (reconstructed (R), docs/methods.md): adaptive per-layer clipping thresholds.

Clients run DP-SGD with per-layer clipping (``MethodSpec.per_layer_clipping``): layer k of each
example's gradient is clipped to C_k = C·w_k with Σ_k w_k² = 1, so one example's clipped gradient
has l2 norm ≤ sqrt(Σ C_k²) = C = ``privacy.clip_norm`` and the noise N(0, σ²C²I) is that of every
other DP method. Round 1 uses w_k = 1/√K. After each round the server averages over clients the
per-layer norms ‖Δw_i,k‖ of the uploaded updates, keeps their EMA e_k ← β·e_k + (1 − β)·mean_i
‖Δw_i,k‖ (initialised at the first value, ``awdp.beta`` = 0.9) and sets w_k = e_k / ‖e‖₂.

Privacy: the per-layer norms are computed from Δw_i, which are DP outputs, so the thresholds are
post-processing. Caveat of the reconstruction: when DP noise dominates Δw_i, a layer's update norm
grows like the square root of its parameter count, so large layers receive most of C.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from raysim.algorithms.base import Aggregate, MethodContext, MethodSpec, Server
from raysim.algorithms.cra_math import ema
from raysim.algorithms.registry import register
from raysim.algorithms.server_math import awdp_layer_weights
from raysim.algorithms.uploads import Release, Upload, UploadContext
from raysim.config import Config, fail
from raysim.messages import ClientResult


def _per_layer_norms(ctx: UploadContext) -> list[float]:
    return [float(ctx.delta[a:b].norm()) for a, b in ctx.layer_slices]


def awdp_uploads(cfg: Config) -> tuple[Upload, ...]:
    return (Upload("per_layer_norms", "per-layer norms of Δw_i", _per_layer_norms, Release("post_processing")),)


class AWDPServer(Server):
    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        num_layers = len(ctx.layer_slices)
        self.layer_weights = np.full(num_layers, 1.0 / math.sqrt(num_layers))
        self.norm_ema: np.ndarray | None = None

    def clip_norm(self, server_round: int) -> tuple[float, ...]:
        c = float(self.cfg.privacy.clip_norm)
        return tuple(float(c * w) for w in self.layer_weights)

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        used = json.dumps([round(c, 8) for c in self.clip_norm(server_round)])
        agg = super().aggregate(server_round, global_weights, results)
        norms = np.array([r.uploads["per_layer_norms"] for r in results], dtype=np.float64)
        if norms.ndim != 2 or norms.shape[1] != len(self.layer_weights):
            raise RuntimeError(f"expected {len(self.layer_weights)} per-layer norms per client, got shape {norms.shape}")
        self.norm_ema = ema(self.norm_ema, norms.mean(axis=0), self.cfg.awdp.beta)
        self.layer_weights = awdp_layer_weights(self.norm_ema)
        for row in agg.client_logs:
            row["layer_clip_norms"] = used
        return agg


@dataclass(frozen=True)
class AWDPParams:
    """``awdp.*``."""

    beta: float = 0.9                  # (R) EMA of per-layer gradient norms

    def check(self, cfg: Config) -> None:
        if not 0 <= self.beta < 1:
            fail("awdp.beta", f"must be in [0, 1), got {self.beta}")


AWDP_FL = register(MethodSpec(
    name="awdp-fl", summary="AWDP-FL (R): per-layer thresholds C_k = C·w_k, Σw_k² = 1, w_k ∝ EMA of layer update norms",
    source="paper's AWDP-FL baseline ('adaptive privacy weighting'); reconstructed (docs/methods.md)",
    server=AWDPServer, private=True, per_layer_clipping=True, uploads=awdp_uploads, params={"awdp": AWDPParams},
    client_level=lambda cfg: "its per-layer thresholds clip per-example gradients in DP-SGD; under privacy.unit=client "
                             "the whole update is clipped to one C",
    client_columns=(("layer_clip_norms", "string"),),
    audit_caveat=("per-layer clipping gives every real example's gradient in a layer the same threshold C_k as a "
                  "canary there, so in a small layer (the quickstart's first conv, 832 parameters) the real "
                  "examples' summed gradients outweigh the canaries' own part and its canaries score at chance, "
                  "even with the noise off: a bug confined to such a layer can go unseen (docs/privacy.md)")))
