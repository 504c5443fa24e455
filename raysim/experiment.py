"""Run one experiment end to end: load data, execute, stream rows into the results folder."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from raysim.algorithms.registry import get_method, resolve_preset
from raysim.config import Config, ConfigError, config_hash, config_to_dict
from raysim.data import DATASETS, load_dataset
from raysim.results import ResultsSink
from raysim.simulation import RoundRecord, SetupRecord


def run_id_for(cfg: Config, sweep_id: str | None = None) -> str:
    """Stable id: readable prefix + hash of the result-relevant config (runtime and paths excluded)."""
    return f"{cfg.method}-{cfg.data.name}-s{cfg.seed}-{result_hash(cfg)[:10]}"


def result_hash(cfg: Config) -> str:
    # Where and how fast a run executes does not change its results (determinism test), so the
    # runtime section and data paths are not part of the identity.
    d = cfg.data.__class__(**{**config_to_dict(cfg.data), "root": None, "cache_dir": None, "download": False})
    return config_hash(cfg.replace(runtime=cfg.runtime.__class__(), data=d))


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


def check_config(cfg: Config) -> None:
    """Registry checks (method and its preset, dataset) that config validation cannot do by itself."""
    resolve_preset(cfg)
    if cfg.data.name not in DATASETS:
        raise ConfigError(f"config key 'data.name': unknown dataset {cfg.data.name!r}; choose one of {', '.join(sorted(DATASETS))}")


def prepare(cfg: Config) -> tuple[Any, Any]:
    """Check the config against the registries, load (train, test), and run :func:`preflight`."""
    check_config(cfg)
    train = load_dataset(cfg.data.name, "train", cfg.data.root, download=cfg.data.download, cache_dir=cfg.data.cache_dir)
    test = load_dataset(cfg.data.name, "test", cfg.data.root, download=cfg.data.download, cache_dir=cfg.data.cache_dir)
    preflight(cfg, train)
    return train, test


def preflight(cfg: Config, train: Any) -> None:
    """Catch user errors (privacy settings, impossible partitions) here, before any actor starts."""
    from raysim.privacy.plan import resolve_clipping
    from raysim.simulation import make_partition
    resolve_clipping(get_method(cfg.method), cfg)
    make_partition(cfg, train.y)


@dataclass
class RunSummary:
    run_id: str
    row: dict[str, Any]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def run_row(cfg: Config, sweep_id: str | None, status: str) -> dict[str, Any]:
    """The runs row of ``cfg`` as it starts (also what a sweep records for a run that failed before
    writing a row of its own)."""
    return {
        "run_id": run_id_for(cfg), "sweep_id": sweep_id, "method": cfg.method, "dataset": cfg.data.name,
        "partition": cfg.data.partition, "alpha": cfg.data.alpha if cfg.data.partition == "dirichlet" else None,
        "seed": cfg.seed, "num_clients": cfg.num_clients, "rounds": cfg.rounds,
        "config": json.dumps(config_to_dict(cfg), sort_keys=True), "status": status, "start_time": _now(),
        "rounds_completed": 0, "delta": cfg.privacy.delta, "accountant": cfg.privacy.accountant,
        "code_version": code_version(), "hostname": socket.gethostname(),
    }


def run_experiment(cfg: Config, results_dir: str, *, sweep_id: str | None = None,
                   on_setup: Callable[[SetupRecord], None] | None = None,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   placement_group: Any = None, data: tuple[Any, Any] | None = None) -> RunSummary:
    """Execute ``cfg`` and write its rows; returns the final runs row (status completed).

    ``data`` is the (train, test) pair from :func:`prepare`, which is called here when omitted.
    """
    cfg = resolve_preset(cfg)
    train, test = data if data is not None else prepare(cfg)
    sink = ResultsSink(results_dir)
    run_id = run_id_for(cfg)
    sink.clear_run(run_id)
    row = run_row(cfg, sweep_id, "running")
    sink.write_run(row)
    t0 = time.perf_counter()
    best_acc = best_f1 = -math.inf
    try:
        if cfg.runtime.executor == "serial":
            from raysim.runtime.serial import SerialExecutor
            from raysim.simulation import Simulation
            sim = Simulation(cfg, train, test, SerialExecutor())
            setup, records = sim.setup, sim.run()
        else:
            from raysim.runtime.driver import init_ray, ray_rounds, run_placement
            init_ray(cfg.runtime.address)
            setup, records, driver = ray_rounds(cfg, train, test, placement_group)
            row.update(run_placement(driver))
        row.update(clipping=setup.clipping, noise_multiplier=max(setup.noise_multipliers),
                   not_covered_by_epsilon=setup.not_covered_by_epsilon, num_params=setup.num_params)
        sink.write_partition(run_id, setup.partition_stats)
        sink.write_run(row)
        if on_setup:
            on_setup(setup)
        for rec in records:
            sink.write_round(run_id, rec.server_round, rec.round_row, rec.client_rows)
            rr = rec.round_row
            best_acc, best_f1 = max(best_acc, rr["test_accuracy"]), max(best_f1, rr["test_f1"])
            row.update(rounds_completed=rec.server_round, final_test_accuracy=rr["test_accuracy"],
                       final_test_f1=rr["test_f1"], final_test_loss=rr["test_loss"], best_test_accuracy=best_acc,
                       best_test_f1=best_f1, epsilon=rr["epsilon"], wall_seconds=time.perf_counter() - t0)
            sink.write_run(row)
            if on_round:
                on_round(rec)
    except BaseException as exc:
        row.update(status="failed", error=f"{type(exc).__name__}: {exc}", end_time=_now(), wall_seconds=time.perf_counter() - t0)
        sink.write_run(row)
        raise
    row.update(status="completed", end_time=_now(), wall_seconds=time.perf_counter() - t0)
    sink.write_run(row)
    return RunSummary(run_id, row)
