"""FedACG (Kim et al., CVPR 2024): accelerated client gradient via a broadcast look-ahead (docs/methods.md).

Server, round t: broadcast w̃ = w + λ·m^(t−1); clients start from w̃ and minimise
f_i(w) + (β/2)‖w − w̃‖² with local (DP-)SGD; with Δ_i = w_i − w̃ the server sets
m^(t) = λ·m^(t−1) + mean_i Δ_i and w^(t+1) = w^(t) + m^(t) (the uniform mean over the round's
participants, as in the paper; m^(0) = 0). Keys: ``fedacg.lam`` (λ = 0.85), ``fedacg.beta`` (β = 0.001).

Privacy: clients run DP-SGD (same clipping, accountant and calibrated σ as every DP method). The
proximal gradient β(w − w̃) depends only on the weights and the broadcast, and the momentum only
on the uploaded DP outputs, so both are post-processing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from raysim.algorithms.base import Aggregate, MethodContext, MethodSpec, Server, client_level_gaussian
from raysim.algorithms.fedprox import ProximalHooks
from raysim.algorithms.registry import register
from raysim.config import Config, fail
from raysim.algorithms.server_math import fedacg_lookahead, fedacg_server_update
from raysim.messages import ClientResult, RoundPayload


class FedACGHooks(ProximalHooks):
    """Proximal term towards the look-ahead w̃ (= ``payload.global_weights``) with coefficient β."""

    def coefficient(self) -> float:
        return float(self.cfg.fedacg.beta)


class FedACGServer(Server):
    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        self.momentum: np.ndarray | None = None    # m^(t−1), float64; None = 0

    def lookahead(self, global_weights: torch.Tensor) -> torch.Tensor:
        w = global_weights.detach().to(torch.float64).cpu().numpy()
        return torch.from_numpy(fedacg_lookahead(w, self.momentum, self.cfg.fedacg.lam)).to(global_weights.dtype)

    def payload(self, server_round: int, global_weights: torch.Tensor) -> RoundPayload:
        w_tilde = self.lookahead(global_weights)
        # The proximal centre is the look-ahead too, so both vectors are w̃.
        return RoundPayload(server_round, w_tilde, w_tilde, {})

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        mean_delta, logs = self.mean_update(server_round, results, [1 / max(len(results), 1)] * len(results))
        w = global_weights.detach().to(torch.float64).cpu().numpy()
        new_w, self.momentum = fedacg_server_update(w, self.momentum, mean_delta.numpy(), self.cfg.fedacg.lam)
        return Aggregate(torch.from_numpy(new_w).to(global_weights.dtype), logs, {})


@dataclass(frozen=True)
class FedACGParams:
    """``fedacg.*``."""

    lam: float = 0.85
    beta: float = 0.001

    def check(self, cfg: Config) -> None:
        if not 0 <= self.lam < 1:
            fail("fedacg.lam", f"must be in [0, 1), got {self.lam}")
        if not self.beta >= 0:
            fail("fedacg.beta", f"must be >= 0, got {self.beta}")


FEDACG = register(MethodSpec(
    name="fedacg", summary="FedACG: server momentum broadcast as a look-ahead, proximal local objective, DP-SGD",
    source="Kim et al., Communication-Efficient Federated Learning with Accelerated Client Gradient, CVPR 2024",
    server=FedACGServer, client=FedACGHooks, private=True, params={"fedacg": FedACGParams},
    client_level=client_level_gaussian,
    client_level_note="look-ahead and momentum on the server's noised mean (post-processing)"))
