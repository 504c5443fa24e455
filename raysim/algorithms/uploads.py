"""What a method's clients upload besides Δw, and what each upload costs in privacy.

A method declares its uploads (:class:`Upload`): a name, the client-side function that computes it,
and its privacy (:class:`Release`). Everything generic follows from the declarations and never names
a method: the client runner computes them (``raysim.client``), the privacy plan composes the Gaussian
ones into each client's ledger and into σ calibration (``raysim.privacy.plan``), the runs table's
``not_covered_by_epsilon`` lists the unprotected ones, and the method contract test checks that every
declared column exists in the results schema.

Release kinds (record-level DP of one client's local data, docs/privacy.md):

* ``gaussian``: the client adds N(0, σ²·Δ²) itself, before upload, from its own keyed random stream
  (the server is honest but curious), to a value of L2 sensitivity Δ under add/remove of one example.
  Accounted as a Gaussian mechanism with noise multiplier σ, ``per_round`` times per round.
* ``post_processing``: computed only from DP outputs (Δw_i) and public values: free.
* ``not_covered``: computed from private data and uploaded without noise; ε does not cover it and every
  report says so.
* ``diagnostic``: logged by the simulation for analysis, never given to the server (the simulation
  strips it before aggregation); computed from private data, so listed as not covered too.
* ``joint`` (``privacy.unit=client`` only): part of the round's one client-level release, summed over
  the cohort and noised by the server together with the clipped updates, and accounted with them
  (adaptive clipping's count, ``raysim.privacy.population``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

__all__ = ["Release", "Upload", "UploadContext", "LOGGED_PRIVATE", "gaussian_uploads", "not_covered_text"]

RELEASE_KINDS = ("gaussian", "post_processing", "not_covered", "diagnostic", "joint")

#: Values every run logs in the clients table that are computed from private data outside DP-SGD.
LOGGED_PRIVATE = ("train_loss", "frac_clipped", "client_seconds")


@dataclass(frozen=True)
class Release:
    """The privacy of one upload (see the module docstring)."""

    kind: str
    noise_multiplier: float = 0.0      # gaussian: σ, noise std = σ · sensitivity
    per_round: int = 1                 # gaussian: releases per round

    def __post_init__(self) -> None:
        if self.kind not in RELEASE_KINDS:
            raise ValueError(f"release kind must be one of {RELEASE_KINDS}, got {self.kind!r}")
        if self.kind == "gaussian" and not (self.noise_multiplier > 0 and self.per_round >= 1):
            raise ValueError(f"a gaussian release needs noise_multiplier > 0 and per_round >= 1, got {self}")


@dataclass
class UploadContext:
    """What a client's upload functions may read after local training (on the client).

    ``example_norms`` holds the pre-clipping gradient norm of every example of the client at the round's
    starting model (the pre-round norm pass, :func:`raysim.training.example_norm_pass`), computed
    only when an upload declares ``needs_example_norms``; else ``None``.
    """

    cfg: Any
    task: Any
    model: torch.nn.Module
    delta: torch.Tensor
    num_samples: int
    num_steps: int
    frac_clipped: float
    val_x: torch.Tensor
    val_y: torch.Tensor
    num_classes: int
    layer_slices: tuple[tuple[int, int], ...]
    example_norms: np.ndarray | None
    #: ``privacy.unit=client``: the l2 norm of the client's update before it was clipped (private); else None
    update_norm: float | None
    rng: Callable[[str], np.random.Generator]   # the client's keyed stream for a purpose, this round


@dataclass(frozen=True)
class Upload:
    """One value a client uploads (or logs, for ``diagnostic``), computed on the client.

    ``columns`` names the clients-table columns the value ends up in (by the server's logs or, for
    diagnostics, directly); the method contract test checks they exist in the results schema.
    """

    name: str
    description: str
    compute: Callable[[UploadContext], Any]
    release: Release
    columns: tuple[str, ...] = field(default=())
    needs_example_norms: bool = False  # the client runs the pre-round norm pass before training


def gaussian_uploads(uploads: Sequence[Upload]) -> list[Upload]:
    return [u for u in uploads if u.release.kind == "gaussian"]


def not_covered_text(uploads: Sequence[Upload], clipping: str) -> str:
    """The runs table's ``not_covered_by_epsilon``: unprotected uploads first, then logged-only values."""
    if clipping == "none":
        return "everything (no DP)"
    uploaded = [f"{u.name} ({u.description}, uploaded without noise)" for u in uploads if u.release.kind == "not_covered"]
    logged = list(LOGGED_PRIVATE) + [u.name for u in uploads if u.release.kind == "diagnostic"]
    parts = uploaded + [f"logged by the simulation only, never uploaded: {', '.join(logged)}"]
    return "; ".join(parts)
