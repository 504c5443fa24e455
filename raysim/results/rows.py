"""Rows of the results tables: the runs row of a run as it starts (also what a sweep records for a run
that died early), and the rounds and clients rows of a finished round."""

from __future__ import annotations

import json
import math
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from raysim.config import Config, config_to_dict
from raysim.run_plan import RunPlan, run_id_for
from raysim.privacy.population import privacy_scope

__all__ = ["run_row", "round_row", "client_rows", "code_version", "now", "epsilon_label", "exceptions_of"]


def code_version() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from raysim import __version__
    return __version__


def now() -> datetime:
    return datetime.now(timezone.utc)


def run_row(plan: RunPlan | Config, sweep_id: str | None, status: str) -> dict[str, Any]:
    """The runs row of the run ``plan`` as it starts (also what a sweep records, from the config, for a run
    that failed before writing a row of its own)."""
    cfg = plan.cfg if isinstance(plan, RunPlan) else plan
    return {
        "run_id": run_id_for(plan), "sweep_id": sweep_id, "method": cfg.method, "dataset": cfg.data.name,
        "partition": cfg.data.partition, "alpha": cfg.data.alpha if cfg.data.partition == "dirichlet" else None,
        "seed": cfg.seed, "num_clients": cfg.num_clients, "rounds": cfg.rounds,
        "config": json.dumps(config_to_dict(cfg), sort_keys=True), "status": status, "start_time": now(),
        "rounds_completed": 0, "delta": cfg.privacy.delta, "accountant": cfg.privacy.accountant,
        **privacy_scope(cfg),
        "code_version": code_version(), "hostname": socket.gethostname(),
    }




def round_row(server_round: int, participants: int, test: Any, val: Any, clip_norm: float, epsilon: float,
              scope: str, results: Sequence[Any], timings: Mapping[str, float], logs: Mapping[str, Any]) -> dict[str, Any]:
    """The rounds-table row of one round: its evaluation (``test``, and ``val`` on the public hold-out or
    None), the clip norm it trained with, the run's ε so far and whose it is (``scope``,
    ``raysim.privacy.population.epsilon_scope``), the timings and the method's round logs."""
    return {
        "round": server_round, "participants": participants, "test_accuracy": test.accuracy, "test_f1": test.f1,
        "test_loss": test.loss, "val_accuracy": val.accuracy if val else math.nan,
        "val_f1": val.f1 if val else math.nan, "clip_norm": clip_norm, "epsilon": epsilon, "epsilon_scope": scope,
        "mean_train_loss": float(np.mean([r.train_loss for r in results])) if results else math.nan,
        **timings, **logs,
    }


def client_rows(server_round: int, results: Sequence[Any], tasks: Sequence[Any], logs: Sequence[Mapping[str, Any]],
                clip_norm: float, epsilons: np.ndarray, scope: str) -> list[dict[str, Any]]:
    """The clients-table rows of one round: each participant's result, its task's σ, its ε so far and whose
    it is (``scope``), its diagnostics and the method's client logs."""
    rows = []
    for r, task, extra in zip(results, tasks, logs):
        row = {"round": server_round, "client_id": r.client_id, "num_samples": r.num_samples, "num_steps": r.num_steps,
               "train_loss": r.train_loss, "update_norm": r.update_norm(), "frac_clipped": r.frac_clipped,
               "clip_norm": clip_norm, "noise_multiplier": task.noise_multiplier,
               "epsilon": float(epsilons[r.client_id]), "epsilon_scope": scope, "client_seconds": r.seconds,
               **r.diagnostics}
        row.update(extra)
        rows.append(row)
    return rows


def exceptions_of(value: Any) -> list[str]:
    """The keys of a runs row's ``epsilon_exceptions`` (comma-separated; null or "" when ε covers every upload)."""
    if isinstance(value, str):
        return [k.strip() for k in value.split(",") if k.strip()]
    return [str(k) for k in value] if isinstance(value, (list, tuple)) else []


def epsilon_label(epsilon: Any, exceptions: Any, scope: Any, fmt: str = "{:.2f}") -> str:
    """ε as every report prints it: the number, whose it is (``epsilon_scope``: ``8.00 (deployment)``) and,
    when the run opted in to uploads that ε does not cover (``privacy.allow_uncovered``), those uploads
    beside it: ``8.00 (per-client) except cra.local_val_f1``. No DP (ε = ∞) and no ε yet have no scope."""
    try:
        value = float(epsilon)
    except (TypeError, ValueError):
        value = math.nan
    text = "" if math.isnan(value) else "∞" if math.isinf(value) else fmt.format(value)
    if isinstance(scope, str) and scope and math.isfinite(value):
        text = f"{text} ({scope})"
    keys = exceptions_of(exceptions)
    return f"{text} except {', '.join(keys)}" if keys else text
