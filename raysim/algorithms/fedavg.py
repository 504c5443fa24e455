"""FedAvg (McMahan et al., 2017) and FedSA, the fixed-clip DP-FedAvg baseline (docs/methods.md).

Both are the base server and client: FedAvg weights n_i/Σn_j, local SGD from the global
model. FedSA runs local DP-SGD with a fixed clip norm (``privacy.clip_norm``). Under
``privacy.unit=client`` both are DP-FedAvg (McMahan et al., ICLR 2018): local SGD without DP, each
update clipped to C, the server's noise on the cohort sum, uniform weights (``Server.private_mean``).
"""

from raysim.algorithms.base import ClientHooks, MethodSpec, Server, client_level_any
from raysim.algorithms.registry import register

FEDAVG = register(MethodSpec(
    name="fedavg", summary="FedAvg, non-private unless privacy.epsilon/noise_multiplier is set",
    source="McMahan et al., AISTATS 2017", server=Server, client=ClientHooks, private=False,
    client_level=client_level_any,
    client_level_note="DP-FedAvg (McMahan et al., ICLR 2018); DP-FTRL with privacy.mechanism=tree; "
                      "correlated noise with privacy.mechanism=blt|bandmf"))

FEDSA = register(MethodSpec(
    name="fedsa", summary="DP-SGD with a fixed clip norm, FedAvg aggregation (= DP-FedAvg)",
    source="paper's FedSA baseline, described as FedAvg-style DP with fixed-variance noise",
    server=Server, client=ClientHooks, private=True, client_level=client_level_any,
    client_level_note="DP-FedAvg: without local DP-SGD, FedSA is FedAvg's client-level form"))
