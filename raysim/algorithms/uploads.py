"""What a method's clients upload besides Δw, and what each upload costs in privacy.

A method declares its uploads (:class:`Upload`): a name, the client-side function that computes it,
and its privacy (:class:`Release`). Everything generic follows from the declarations and never names
a method: the client runner computes them (``raysim.client``), the privacy plan composes the Gaussian
ones into each client's ledger and into σ calibration (``raysim.privacy.plan``), the runs table's
``not_covered_by_epsilon`` lists the unprotected ones, and the method contract test checks that every
declared column exists in the results schema.

Release kinds:

* ``gaussian`` (record level): the client adds N(0, σ²·Δ²) itself, before upload, from its own keyed
  random stream (the server is honest but curious), to a value of L2 sensitivity Δ under add/remove of
  one example. Accounted as a Gaussian mechanism with noise multiplier σ, ``per_round`` times per round,
  in the client's own ledger.
* ``post_processing`` (record level): computed only from DP outputs (Δw_i, which DP-SGD released) and
  public values: free.
* ``joint`` (client level): part of the round's one client-level release, summed over the cohort and
  noised by the server together with the clipped updates, and accounted with them (adaptive clipping's
  count, ``raysim.privacy.population``).
* ``not_covered``: computed from private data and uploaded without noise; no unit's ε covers it.
* ``diagnostic``: logged by the simulation for analysis, never given to the server (the simulation
  strips it before aggregation); computed from private data, so listed as not covered too.

An upload is covered by ε only if the run's privacy unit accounts its kind (:data:`ACCOUNTED`): the
example unit's per-client ledgers account ``gaussian`` releases, and ``post_processing`` is free there
because Δw_i is a DP output; the client unit's one population ledger accounts the clipped update and
``joint`` releases only, and under it Δw_i is the mechanism's input, not a DP output, so a
``post_processing`` upload computed from it is no DP output either. A unit missing from the table
accounts no upload. Every upload that the run's unit does not account is refused in one line unless
the config names its ``opt_in`` key in ``privacy.allow_uncovered`` (:func:`check_uncovered`); with the
opt-in, every place that prints the run's ε prints these keys beside it
(``raysim.results.rows.epsilon_label``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from raysim.config import ConfigError

__all__ = ["Release", "Upload", "UploadContext", "ACCOUNTED", "LOGGED_PRIVATE", "logged_private", "gaussian_uploads",
           "not_covered_text", "uncovered", "uncovered_keys", "check_uncovered"]

RELEASE_KINDS = ("gaussian", "post_processing", "not_covered", "diagnostic", "joint")

#: The release kinds each privacy unit's ledger accounts (the module docstring); a unit not listed
#: accounts none, so every upload it makes needs an opt-in.
ACCOUNTED: dict[str, tuple[str, ...]] = {"example": ("gaussian", "post_processing"), "client": ("joint",)}

#: Values computed from private data that every DP run logs (clients and rounds tables) and that are not
#: uploads: the simulation strips them from the results before the server aggregates
#: (``raysim.messages.ClientResult.server_view``) and writes them into the log rows only.
LOGGED_PRIVATE = ("train_loss, frac_clipped, client_seconds (clients table)",
                  "mean_train_loss, client_train_seconds (rounds table)")

#: What the client unit's log rows hold besides (its adjacency protects a client's membership and all its
#: data): who trained in each round and their updates before the server's noise. The trusted server
#: receives the clipped updates; only the noised release leaves it.
LOGGED_PRIVATE_CLIENT_UNIT = ("which clients trained in each round (the clients table's rows, with num_samples, "
                              "num_steps and update_norm)", "participants, release_snr (rounds table)")


def logged_private(unit: str) -> tuple[str, ...]:
    """The values the simulation logs from private data under ``unit`` that ε does not cover."""
    return LOGGED_PRIVATE + (LOGGED_PRIVATE_CLIENT_UNIT if unit == "client" else ())


def logged_heading(unit: str) -> str:
    """How ``not_covered_by_epsilon`` introduces :func:`logged_private`."""
    return ("logged by the simulation only, never released" if unit == "client"
            else "logged by the simulation only, never uploaded")


@dataclass(frozen=True)
class Release:
    """The privacy of one upload (see the module docstring)."""

    kind: str
    #: gaussian: σ, noise std = σ · sensitivity; joint: σ_b, the std of the server's noise on the cohort's sum
    #: of the values (adaptive clipping's Σ_i (b_i − 1/2)), 0 for the client-level plan's default k/20
    noise_multiplier: float = 0.0
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
    #: the name a config lists in ``privacy.allow_uncovered`` to allow the upload where the run's unit does
    #: not cover it (a dotted key of the method's section, e.g. ``cra.local_val_f1``); default: the upload's name
    opt_in: str = ""

    @property
    def opt_in_key(self) -> str:
        return self.opt_in or self.name


def gaussian_uploads(uploads: Sequence[Upload]) -> list[Upload]:
    return [u for u in uploads if u.release.kind == "gaussian"]


def _unaccounted(upload: Upload, unit: str) -> bool:
    """Whether ``upload`` leaves the client and the ledger of ``unit`` does not account it."""
    kind = upload.release.kind
    return kind != "diagnostic" and kind not in ACCOUNTED.get(unit, ())


def uncovered(uploads: Sequence[Upload], clipping: str, unit: str) -> list[Upload]:
    """The uploads that ε does not cover under privacy unit ``unit`` (:data:`ACCOUNTED`), in declaration
    order; none without DP (then nothing is covered, and the run claims no ε)."""
    if clipping == "none":
        return []
    return [u for u in uploads if _unaccounted(u, unit)]


def not_covered_text(uploads: Sequence[Upload], clipping: str, unit: str) -> str:
    """The runs table's ``not_covered_by_epsilon``: uploads ε does not cover first, then logged-only values."""
    if clipping == "none":
        return "everything (no DP)"
    parts = [f"{u.name} ({u.description}, uploaded without noise)" if u.release.kind == "not_covered"
             else f"{u.name} ({u.description}, a {u.release.kind} upload that privacy.unit={unit} does not account)"
             for u in uncovered(uploads, clipping, unit)]
    logged = list(logged_private(unit)) + [u.name for u in uploads if u.release.kind == "diagnostic"]
    parts.append(f"{logged_heading(unit)}: {', '.join(logged)}")
    return "; ".join(parts)


def uncovered_keys(uploads: Sequence[Upload], clipping: str, unit: str) -> tuple[str, ...]:
    """The opt-in keys of the uploads ε does not cover (:func:`uncovered`), in declaration order."""
    return tuple(u.opt_in_key for u in uncovered(uploads, clipping, unit))


def check_uncovered(uploads: Sequence[Upload], clipping: str, unit: str, allowed: Sequence[str]) -> tuple[str, ...]:
    """Fail closed: raise :class:`~raysim.config.ConfigError` (one line, exit code 2) naming the first upload
    ε does not cover that ``allowed`` (``privacy.allow_uncovered``) does not list, and the key that opts in
    to it; else return the run's exceptions (:func:`uncovered_keys`)."""
    keys = uncovered_keys(uploads, clipping, unit)
    missing = [k for k in keys if k not in set(allowed)]
    if missing:
        upload = next(u for u in uploads if u.opt_in_key == missing[0])
        if upload.release.kind == "not_covered":
            what = "without noise"
        else:
            accounted = ACCOUNTED.get(unit, ())
            what = (f"as a {upload.release.kind} release, which privacy.unit={unit} does not account (its ledger "
                    f"accounts {'only ' + ' and '.join(accounted) + ' uploads' if accounted else 'no upload'} besides the update)")
        raise ConfigError(f"this config uploads {missing[0]} ({upload.description}) {what}, so ε would not cover "
                          f"it; use its private default, or opt in with privacy.allow_uncovered: [{', '.join(missing)}]")
    return keys
