"""The runs-table row of a run as it starts (also what a sweep records for a run that died early)."""

from __future__ import annotations

import json
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from raysim.config import Config, config_to_dict, run_id_for

__all__ = ["run_row", "code_version", "now"]


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


def run_row(cfg: Config, sweep_id: str | None, status: str) -> dict[str, Any]:
    """The runs row of ``cfg`` as it starts (also what a sweep records for a run that failed before
    writing a row of its own)."""
    return {
        "run_id": run_id_for(cfg), "sweep_id": sweep_id, "method": cfg.method, "dataset": cfg.data.name,
        "partition": cfg.data.partition, "alpha": cfg.data.alpha if cfg.data.partition == "dirichlet" else None,
        "seed": cfg.seed, "num_clients": cfg.num_clients, "rounds": cfg.rounds,
        "config": json.dumps(config_to_dict(cfg), sort_keys=True), "status": status, "start_time": now(),
        "rounds_completed": 0, "delta": cfg.privacy.delta, "accountant": cfg.privacy.accountant,
        "code_version": code_version(), "hostname": socket.gethostname(),
    }


