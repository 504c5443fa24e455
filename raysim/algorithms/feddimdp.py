"""FedDimDP (SPEC §3): LLDM client model + ADPC adaptive clipping + CRA robust aggregation.

The three components are independent switches of one server class, so each ablation removes
exactly its component:

* ``feddimdp-no-lldm`` builds the plain backbone (``MethodSpec.lldm = False``);
* ``feddimdp-no-adpc`` keeps C fixed at ``adpc.c0``;
* ``feddimdp-no-cra`` aggregates with FedAvg weights n_i / Σ n_j (and uploads no q_i).

Privacy: clients clip with C^(t) and add N(0, σ²C^(t)²) (DP-SGD, accounted). ADPC's next C is
computed from the uploaded Δw_i, which are DP outputs, so it is post-processing. CRA's q_i is
computed from local validation data outside DP-SGD; it is recorded in the run as not covered by
ε unless ``cra.private_val_f1`` noises it (that cost is then composed into the same ledger).
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np
import torch

from raysim.algorithms.base import Aggregate, MethodContext, MethodSpec, Server, weighted_sum
from raysim.algorithms.clip_rules import adpc_next_clip, denoise_update_norm, update_norm_per_step
from raysim.algorithms.cra_math import cra_weights
from raysim.algorithms.registry import register
from raysim.types import ClientResult


class FedDimDPServer(Server):
    use_adpc: ClassVar[bool] = True
    use_cra: ClassVar[bool] = True
    uses_val_f1: ClassVar[bool] = True   # q_i is uploaded only when CRA is on

    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        self.current_clip = float(self.cfg.adpc.c0)
        self.val_f1_ema: np.ndarray | None = None
        self.update_norm_ema: np.ndarray | None = None

    def clip_norm(self, server_round: int) -> float:
        return self.current_clip

    def update_norms(self, results: Sequence[ClientResult]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(s_i in the configured unit, ‖Δw_i‖ raw, ŝ_i denoised in the same unit)."""
        cfg, ctx = self.cfg, self.ctx
        raw = np.array([float(r.delta.norm()) for r in results])
        s, s_hat = np.empty_like(raw), np.empty_like(raw)
        for i, r in enumerate(results):
            per_step = update_norm_per_step(raw[i], cfg.lr, r.num_steps)
            expected_batch = min(cfg.batch_size, r.num_samples)
            clean = denoise_update_norm(per_step, num_params=ctx.num_params,
                                        noise_multiplier=self.noise_multiplier(r.client_id, r.server_round),
                                        clip_norm=self.current_clip, expected_batch_size=expected_batch,
                                        num_steps=r.num_steps, mode=ctx.clipping)
            scale = 1.0 if cfg.adpc.norm_unit == "per_step" else cfg.lr * r.num_steps
            s[i], s_hat[i] = per_step * scale, clean * scale
        return s, raw, s_hat

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        cfg = self.cfg
        s, raw, s_hat = self.update_norms(results)
        logs: list[dict[str, float]] = [
            {"update_norm": float(a), "update_norm_raw": float(b), "update_norm_denoised": float(c)}
            for a, b, c in zip(s, raw, s_hat)]
        if self.use_cra:
            deltas = torch.stack([r.delta for r in results]).numpy()
            q = np.array([r.val_f1 for r in results], dtype=np.float64)
            n = np.array([r.num_samples for r in results], dtype=np.float64)
            res = cra_weights(deltas, q, s, n, self.val_f1_ema, self.update_norm_ema, beta=cfg.cra.beta,
                              rho=cfg.cra.rho, eta_p=cfg.cra.eta_p, weight_by_samples=cfg.cra.weight_by_samples)
            self.val_f1_ema, self.update_norm_ema = res.val_f1_ema, res.update_norm_ema
            weights, step_size = res.robust_weight, cfg.cra.eta_g
            for i, row in enumerate(logs):
                row.update(val_f1_ema=res.val_f1_ema[i], update_norm_ema=res.update_norm_ema[i],
                           reliability=res.reliability[i], nominal_weight=res.nominal_weight[i],
                           deviation=res.deviation[i], deviation_normalized=res.deviation_normalized[i],
                           robust_weight=res.robust_weight[i])
        else:
            weights, step_size = self.sample_weights(results), 1.0
        for row, w in zip(logs, weights):
            row["aggregation_weight"] = float(w)
        new_weights = global_weights + step_size * weighted_sum([r.delta for r in results], weights)
        if self.use_adpc:
            used = s_hat if cfg.adpc.denoise else s
            self.current_clip = adpc_next_clip(used, self.current_clip, c_min=cfg.adpc.c_min, smoothing=cfg.adpc.smoothing)
        return Aggregate(new_weights, logs, {"next_clip_norm": self.current_clip})


class NoADPCServer(FedDimDPServer):
    use_adpc = False


class NoCRAServer(FedDimDPServer):
    use_cra = False
    uses_val_f1 = False

_SOURCE = "FedDimDP, arXiv 2602.06838 (withdrawn); reconstructed per SPEC §3"
register(MethodSpec("feddimdp", "FedDimDP: LLDM + ADPC adaptive clipping + CRA robust aggregation", _SOURCE,
                    FedDimDPServer, lldm=True))
register(MethodSpec("feddimdp-no-cra", "FedDimDP ablation w/o CRA (FedAvg weights)", _SOURCE, NoCRAServer, lldm=True))
register(MethodSpec("feddimdp-no-adpc", "FedDimDP ablation w/o ADPC (fixed C = adpc.c0)", _SOURCE, NoADPCServer, lldm=True))
register(MethodSpec("feddimdp-no-lldm", "FedDimDP ablation w/o LLDM (plain backbone)", _SOURCE, FedDimDPServer, lldm=False))
