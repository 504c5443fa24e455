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
* ``not_covered``: computed from private data and uploaded without noise; ε does not cover it. A run that
  makes such an upload is refused unless the config names the upload's ``opt_in`` key in
  ``privacy.allow_uncovered`` (:func:`check_uncovered`); with the opt-in, every place that prints the
  run's ε prints these keys beside it (``raysim.results.rows.epsilon_label``).
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

from raysim.config import ConfigError

__all__ = ["Release", "Upload", "UploadContext", "LOGGED_PRIVATE", "gaussian_uploads", "not_covered_text",
           "uncovered_keys", "check_uncovered"]

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
    rng: Callable[[str], np.random.Generator]   # the client's keyed stream for a purpose, this round
    #: ``privacy.unit=client``: the l2 norm of the client's update before it was clipped (private); else None
    update_norm: float | None = None


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
    #: ``not_covered`` only: the name a config lists in ``privacy.allow_uncovered`` to allow the upload
    #: (a dotted key of the method's section, e.g. ``cra.local_val_f1``); default: the upload's name
    opt_in: str = ""

    @property
    def opt_in_key(self) -> str:
        return self.opt_in or self.name


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


def uncovered_keys(uploads: Sequence[Upload], clipping: str) -> tuple[str, ...]:
    """The opt-in keys of the uploads ε does not cover (``not_covered`` releases), in declaration order;
    empty without DP (then nothing is covered, and the run claims no ε)."""
    if clipping == "none":
        return ()
    return tuple(u.opt_in_key for u in uploads if u.release.kind == "not_covered")


def check_uncovered(uploads: Sequence[Upload], clipping: str, allowed: Sequence[str]) -> tuple[str, ...]:
    """Fail closed: raise :class:`~raysim.config.ConfigError` (one line, exit code 2) naming the first uncovered upload that ``allowed``
    (``privacy.allow_uncovered``) does not list, and the key that opts in to it; else return the run's
    exceptions (:func:`uncovered_keys`)."""
    keys = uncovered_keys(uploads, clipping)
    missing = [k for k in keys if k not in set(allowed)]
    if missing:
        upload = next(u for u in uploads if u.opt_in_key == missing[0])
        raise ConfigError(f"this config uploads {missing[0]} ({upload.description}) without noise, so ε would not cover it; "
                    f"use its private default, or opt in with privacy.allow_uncovered: [{', '.join(missing)}]")
    return keys
