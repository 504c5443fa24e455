"""Reading a results folder (docs/architecture.md, "Results") into pandas, and the labels that group its runs.

Works while a sweep is still writing: the sink renames finished files into place, so every file
read here is complete; a run that is still going simply has fewer rounds.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from raysim.results import read_table
from raysim.privacy.population import EPSILON_SCOPES
from raysim.results.rows import exceptions_of
from raysim.config import DEFAULT_MECHANISM, ConfigError

# the columns that identify one experimental setting; seeds of a setting are averaged
GROUP_KEYS: list[str] = ["method", "dataset", "partition", "alpha", "privacy"]


@dataclass(frozen=True)
class Results:
    """The four result tables of one folder, with the columns of raysim/results/schema.py."""

    runs: pd.DataFrame
    rounds: pd.DataFrame
    clients: pd.DataFrame
    partitions: pd.DataFrame


def load_results(folder: str | os.PathLike[str]) -> Results:
    """Read runs/, rounds/, clients/ and partitions/ of ``folder`` (a path or a pyarrow URI).

    Raises ValueError when a local ``folder`` does not exist; an existing folder without runs
    gives empty tables (the caller decides whether that is an error).
    """
    folder = str(folder)
    if "://" not in folder and not os.path.isdir(folder):
        raise ConfigError(f"results folder {folder!r} does not exist")
    return Results(*(read_table(folder, name) for name in ("runs", "rounds", "clients", "partitions")))


def _config(row: pd.Series) -> dict[str, Any]:
    try:
        return json.loads(row["config"]) if isinstance(row["config"], str) else {}
    except json.JSONDecodeError:
        return {}


def _scope(row: pd.Series, privacy: dict) -> str:
    """The run's ``epsilon_scope`` (from its config where the row predates the column)."""
    scope = row.get("epsilon_scope")
    if isinstance(scope, str) and scope in EPSILON_SCOPES:
        return scope
    if privacy.get("unit") != "client":
        return "per-client"
    return "deployment" if privacy.get("noise_cohort_size") is not None else "population"


def privacy_label(row: pd.Series) -> str:
    """'no DP', 'ε=8 (per-client)' (calibrated target, and whose ε: ``epsilon_scope``) or 'σ=1.1' (given
    noise), with the uploads ε does not cover ('ε=8 (per-client) except cra.local_val_f1'), the noise
    mechanism unless independent ('ε=8 (per-client), bandmf η=0.3'), and a non-default clipping mode or
    the client unit (and the deployment the noise is sized for)."""
    privacy = _config(row).get("privacy", {})
    clipping = row.get("clipping") if isinstance(row.get("clipping"), str) else privacy.get("clipping", "auto")
    if clipping == "none":
        return "no DP"
    if privacy.get("epsilon") is not None:
        label = f"ε={privacy['epsilon']:g} ({_scope(row, privacy)})"
    elif privacy.get("noise_multiplier") is not None:
        label = f"σ={privacy['noise_multiplier']:g}"
    else:
        # a non-private method with clipping=auto before its setup row was written
        return "no DP"
    keys = exceptions_of(row.get("epsilon_exceptions"))
    if keys:   # uploads ε does not cover (privacy.allow_uncovered): never a bare ε
        label = f"{label} except {', '.join(keys)}"
    mechanism = row.get("privacy_mechanism")
    mechanism = mechanism if isinstance(mechanism, str) else privacy.get("mechanism", DEFAULT_MECHANISM)
    if mechanism != DEFAULT_MECHANISM:   # correlated noise: never averaged with independent noise
        decay = privacy.get("workload_decay") or 0.0
        label = f"{label}, {mechanism}" + (f" η={decay:g}" if decay else "")
    if privacy.get("unit") == "client":
        deployment = privacy.get("noise_cohort_size")
        return f"{label}, client-level" + (f", noise of {deployment}/{privacy['population_size']}" if deployment else "")
    return label if clipping in ("per_sample", "auto") else f"{label}, {clipping} clipping"


def partition_label(partition: Any, alpha: Any) -> str:
    if partition == "dirichlet":
        return f"Dirichlet α={alpha:g}" if isinstance(alpha, float) and not math.isnan(alpha) else "Dirichlet"
    return {"shards": "class shards", "iid": "IID"}.get(partition, str(partition))


def with_keys(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` plus the derived columns ``privacy`` and ``setting`` (dataset and partition, readable)."""
    from analysis.paper import dataset_label
    out = runs.copy()
    out["privacy"] = [privacy_label(r) for _, r in out.iterrows()] if len(out) else pd.Series(dtype=str)
    out["setting"] = [f"{dataset_label(d)}, {partition_label(p, a)}"
                      for d, p, a in zip(out["dataset"], out["partition"], out["alpha"])]
    return out
