"""FedProx (Li et al., MLSys 2020): local objective f_i(w) + (μ/2)‖w − w_g‖², FedAvg aggregation.

The proximal gradient μ(w − w_g) depends only on the current weights and the broadcast global
model, so it is added after privatisation (post-processing): with ``privacy.epsilon`` set, the
DP variant costs exactly what FedSA's local DP-SGD costs. Non-private by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim.algorithms.base import ClientHooks, MethodSpec, Server, client_level_any
from raysim.algorithms.flat import split_like
from raysim.algorithms.registry import register
from raysim.config import Config, fail


class ProximalHooks(ClientHooks):
    """Adds ``coefficient()·(w − w_c)`` to every step, with centre w_c = ``payload.global_weights``."""

    _centre: list[torch.Tensor] | None = None

    def coefficient(self) -> float:
        return float(self.cfg.fedprox.mu)

    def extra_gradient(self, params: list[torch.nn.Parameter]) -> list[torch.Tensor] | None:
        mu = self.coefficient()
        if mu == 0.0:
            return None
        if self._centre is None:
            self._centre = split_like(self.payload.global_weights, params)
        return [mu * (p.detach() - c) for p, c in zip(params, self._centre)]


@dataclass(frozen=True)
class FedProxParams:
    """``fedprox.*``."""

    mu: float = 0.01

    def check(self, cfg: Config) -> None:
        if not self.mu >= 0:
            fail("fedprox.mu", f"must be >= 0, got {self.mu}")


FEDPROX = register(MethodSpec(
    name="fedprox", summary="FedProx: local proximal term (fedprox.mu/2)‖w − w_g‖², FedAvg aggregation",
    source="Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020",
    server=Server, client=ProximalHooks, private=False, params={"fedprox": FedProxParams},
    client_level=client_level_any, client_level_note="the proximal local objective, then DP-FedAvg's release"))
