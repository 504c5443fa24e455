"""Values that travel between the server and the clients (plain data, picklable)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class ClientData:
    """One client's shard: indices into the shared train arrays (the arrays travel once per run)."""

    client_id: int
    train_indices: np.ndarray
    val_indices: np.ndarray


@dataclass(frozen=True)
class RoundPayload:
    """What every client of a round receives; put into the object store once per round."""

    server_round: int
    start_weights: torch.Tensor            # flat float32 vector the clients start local training from
    global_weights: torch.Tensor           # flat vector of the current global model (proximal terms)
    broadcast: dict[str, Any] = field(default_factory=dict)  # method-specific server state (e.g. SCAFFOLD's c)


@dataclass(frozen=True)
class ClientTask:
    """The per-client part of a round: small values only."""

    client_id: int
    server_round: int
    clip_norm: float | tuple[float, ...]   # C^(t), or per-layer thresholds C_k
    noise_multiplier: float                 # σ of this client's DP-SGD steps this round (0: no noise)
    client_state: dict[str, Any] | None = None  # persisted client state (lives on the server, survives actor restarts)


@dataclass
class ClientResult:
    """What a client uploads, plus the per-client statistics the simulation logs."""

    client_id: int
    server_round: int
    num_samples: int                  # local training-set size n_i
    num_steps: int                    # τ_i local steps taken
    delta: torch.Tensor               # Δw_i = w_end − w_start (flat)
    train_loss: float
    frac_clipped: float
    uploads: dict[str, Any] = field(default_factory=dict)      # the method's declared uploads, by name
    diagnostics: dict[str, float] = field(default_factory=dict)  # logged only; stripped before the server sees it
    client_state: dict[str, Any] | None = None
    seconds: float = 0.0
