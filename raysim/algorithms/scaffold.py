"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates.

Server: control variate c (0 before round 1), broadcast as ``payload.broadcast["control"]``.
Client i: its own c_i (0 before its first round) travels in ``ClientTask.client_state`` and so lives
on the server (a restarted actor recovers it). Each local step adds the correction c − c_i to the
gradient; after K local steps of size η_l from x to y_i,
c_i⁺ = c_i − c + (x − y_i)/(K·η_l) becomes the new client state. Server, with the round's cohort S
of the N clients (S = all under full participation): x ← x + (1/|S|) Σ_{i∈S} Δy_i (global step 1, the
uniform mean of the paper) and c ← c + (1/N) Σ_{i∈S} (c_i⁺ − c_i), the paper's update with the whole
population N in the denominator (absent clients' c_i are unchanged, so c stays the mean of all c_i).

Privacy: non-private by default; with ``privacy.epsilon`` the local steps are DP-SGD. The correction
c − c_i is added after privatisation, and c_i⁺ and c are computed from the DP-trained y_i (uploaded
as Δy_i anyway) and earlier controls, so the controls are post-processing of DP outputs: free.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from raysim.algorithms.base import Aggregate, ClientHooks, ClientStates, MethodContext, MethodSpec, Server
from raysim.algorithms.flat import flatten, split_like, sum64
from raysim.algorithms.registry import register
from raysim.algorithms.server_math import scaffold_control_update
from raysim.config import Config
from raysim.messages import ClientResult, ClientTask, RoundPayload

CONTROL = "control"

_CLIENT_LEVEL_REFUSAL = ("its control variate update c_i⁺ − c_i is a second upload computed from the client's data; "
                         "it would have to be clipped and noised with Δ_i as one vector, which raysim does not do")


class ScaffoldHooks(ClientHooks):
    def __init__(self, cfg: Config, payload: RoundPayload, task: ClientTask) -> None:
        super().__init__(cfg, payload, task)
        self.server_control: torch.Tensor = payload.broadcast[CONTROL]
        state = task.client_state or {}
        own = state.get(CONTROL)
        self.client_control = torch.zeros_like(self.server_control) if own is None else own
        self._correction: list[torch.Tensor] | None = None

    def extra_gradient(self, params: list[torch.nn.Parameter]) -> list[torch.Tensor] | None:
        if self._correction is None:
            self._correction = split_like(self.server_control - self.client_control, params)
        return self._correction

    def finalize(self, params: list[torch.nn.Parameter], num_steps: int) -> dict[str, Any] | None:
        new = scaffold_control_update(
            self.client_control.double().numpy(), self.server_control.double().numpy(),
            self.payload.start_weights.double().numpy(), flatten(params).double().cpu().numpy(),
            lr=self.cfg.lr, num_steps=num_steps)
        return {CONTROL: torch.from_numpy(new).to(self.server_control.dtype)}


class ScaffoldServer(Server):
    def __init__(self, ctx: MethodContext) -> None:
        super().__init__(ctx)
        self.control = torch.zeros(ctx.num_params, dtype=torch.float32)
        # c_i each participant started the round with; emptied by aggregate, so no checkpoint holds cohort states.
        self.sent: dict[int, torch.Tensor | None] = {}

    def payload(self, server_round: int, global_weights: torch.Tensor) -> RoundPayload:
        return RoundPayload(server_round, global_weights, global_weights, {CONTROL: self.control})

    def tasks(self, server_round: int, client_states: ClientStates,
              participants: Sequence[int]) -> list[ClientTask]:
        tasks = super().tasks(server_round, client_states, participants)
        self.sent = {t.client_id: (t.client_state or {}).get(CONTROL) for t in tasks}
        return tasks

    def aggregate(self, server_round: int, global_weights: torch.Tensor, results: Sequence[ClientResult]) -> Aggregate:
        step = sum64([r.delta for r in results])
        control_deltas = []
        for r in results:
            new = (r.client_state or {}).get(CONTROL)
            if new is None:
                raise RuntimeError(f"client {r.client_id} returned no SCAFFOLD control variate")
            old = self.sent.get(r.client_id)
            control_deltas.append(new if old is None else new - old)
        # c ← c + (|S|/N)·mean_S Δc_i = c + (1/N) Σ_{i∈S} Δc_i (the factor is exactly 1 when all take part).
        share = len(results) / self.cfg.num_clients
        mean_control = sum64(control_deltas)
        self.control = (self.control.double() + (mean_control if share == 1.0 else share * mean_control)
                        ).to(self.control.dtype)
        self.sent = {}
        logs = [{"aggregation_weight": 1.0 / len(results)} for _ in results]
        return Aggregate((global_weights.double() + step).to(global_weights.dtype), logs, {})


SCAFFOLD = register(MethodSpec(
    name="scaffold", summary="SCAFFOLD (option II control variates), non-private unless privacy.epsilon is set",
    source="Karimireddy et al., SCAFFOLD: Stochastic Controlled Averaging for Federated Learning, ICML 2020",
    server=ScaffoldServer, client=ScaffoldHooks, private=False, client_level=lambda cfg: _CLIENT_LEVEL_REFUSAL,
    audit_caveat=("from round 2 on, each local step subtracts c_i, the client's previous mean gradient, canaries "
                  "included, so the summed update the audit scores keeps about one round of a canary's signal: "
                  "even without noise the top-and-bottom bound stays near its one-round value; the thresholded "
                  "bounds are the ones to read (docs/privacy.md)")))
