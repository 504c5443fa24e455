"""Values that travel between the server and the clients (plain data, picklable).

On the wire (any pickling, Ray's included) the CPU tensors inside a payload, task or result, at
any depth of their dicts, lists and tuples, travel as NumPy arrays: Ray passes those out of band
(one memcpy into the object store, zero-copy reads), whereas a pickled tensor goes through
``torch.save`` of its storage, which costs a copy more on each side.
A received array that Ray maps read-only is copied once, so every tensor a message yields is
writable and owns its memory.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


class _WireTensor:
    """A CPU tensor's data as a NumPy array while pickled; unpickles to a tensor again."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self):
        return _tensor_from_wire, (self.array,)


def _tensor_from_wire(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _to_wire(value: Any, memo: dict[int, Any]) -> Any:
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:  # one array per tensor object, so pickle's memo still shares it
            wire: Any = value
            if value.device.type == "cpu" and value.layout == torch.strided and not value.requires_grad:
                try:
                    wire = _WireTensor(value.numpy())
                except TypeError:  # dtypes NumPy lacks (bfloat16, float8): pickled as tensors
                    pass
            memo[id(value)] = wire
        return memo[id(value)]
    if isinstance(value, dict):
        return {k: _to_wire(v, memo) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_wire(v, memo) for v in value)
    return value


class _Wire:
    """Mixin for the message dataclasses: pickle with the tensors as arrays (module docstring)."""

    def __reduce__(self):
        memo: dict[int, Any] = {}
        return type(self), tuple(_to_wire(getattr(self, f.name), memo) for f in dataclasses.fields(self))


@dataclass(frozen=True)
class ClientData:
    """One client's shard: indices into the shared train arrays (the arrays travel once per run)."""

    client_id: int
    train_indices: np.ndarray
    val_indices: np.ndarray
    user: str | None = None   # the natural user whose rows these are (data.partition: natural)


@dataclass(frozen=True)
class RoundPayload(_Wire):
    """What every client of a round receives; put into the object store once per round."""

    server_round: int
    start_weights: torch.Tensor            # flat float32 vector the clients start local training from
    global_weights: torch.Tensor           # flat vector of the current global model (proximal terms)
    broadcast: dict[str, Any] = field(default_factory=dict)  # method-specific server state (e.g. SCAFFOLD's c)


@dataclass(frozen=True)
class ClientTask(_Wire):
    """The per-client part of a round: small values only."""

    client_id: int
    server_round: int
    clip_norm: float | tuple[float, ...]   # C^(t), or per-layer thresholds C_k
    noise_multiplier: float                 # σ of this client's DP-SGD steps this round (0: no noise)
    client_state: dict[str, Any] | None = None  # persisted client state (lives on the server, survives actor restarts)
    lr_scale: float = 1.0                   # the local steps use lr · lr_scale (a server choice from public values)
    #: Correlated noise on the DP-SGD steps (privacy.unit=example, privacy.mechanism=bandmf): the client's
    #: strategy (its banded coefficients) and how its steps sample (:class:`~raysim.privacy.mechanisms.base.
    #: ExampleSteps`: b cyclic groups of its examples, each drawn at ``rate``); None: independent noise.
    step_strategy: tuple[float, ...] | None = None
    step_groups: int = 1
    step_rate: float = 0.0


@dataclass
class ClientResult(_Wire):
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
    device: str = "cpu"               # where the client trained (its DP noise generator follows the device)
    #: ‖Δw_i‖ (float32 ``delta.norm()``), computed where the client trained, so that the server neither
    #: reads Δ again to check that it is finite nor to log its norm (a function of Δ, which the server
    #: receives: no release of its own); when the client's worker summed
    #: the round's updates (``runtime.sum_on_actors``), ``delta`` is empty and the sum travels instead
    #: (:func:`raysim.algorithms.base.fold_updates`)
    delta_norm: float | None = None

    def update_norm(self) -> float:
        """‖Δw_i‖: ``delta_norm`` where the client sent it, else computed here from ``delta``."""
        return float(self.delta.norm()) if self.delta_norm is None else self.delta_norm

    def server_view(self, unit: str) -> "ClientResult":
        """What the server's aggregation receives: the uploads, without the values the simulation only logs
        (``train_loss``, ``frac_clipped``, ``seconds``: NaN; ``diagnostics``: empty), and under
        ``privacy.unit=client`` without ‖Δ_i‖ (``delta_norm``: NaN), which there is the norm of the
        mechanism's input, not of a DP output, and without the client's new state (``client_state``: None;
        the simulation keeps it for the client's next round). The log rows are written from the full result."""
        client = unit == "client"
        return dataclasses.replace(self, train_loss=math.nan, frac_clipped=math.nan, seconds=math.nan, diagnostics={},
                                   delta_norm=math.nan if client else self.delta_norm,
                                   client_state=None if client else self.client_state)

    def without_delta(self) -> "ClientResult":
        """This result with ‖Δw_i‖ and an empty ``delta``, for a Δ that is summed apart from it."""
        return dataclasses.replace(self, delta=self.delta.new_zeros(0), delta_norm=self.update_norm())
