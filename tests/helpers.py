"""Small configs for tests that really run the simulation."""

from __future__ import annotations

from typing import Any

from raysim.config import Config, config_from_dict


def tiny_config(**overrides: Any) -> Config:
    """Digits, 4 clients, 2 rounds, batch 32: a few seconds per run on 2 cores."""
    values: dict[str, Any] = {
        "method": "fedavg", "rounds": 2, "seed": 0, "num_clients": 4, "batch_size": 32, "lr": 0.05,
        "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5, "min_samples_per_client": 20},
        "runtime": {"executor": "serial"},
    }
    for key, value in overrides.items():
        node = values
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return config_from_dict(values)
