"""Run one experiment end to end: load data, execute, stream rows into the results folder."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

import numpy as np

from raysim.algorithms.registry import all_methods, get_method, resolve_preset
from raysim.config import MODEL_NAMES, SEQUENCE_MODELS, Config, ConfigError, run_id_for
from raysim.data import DATASETS, load_dataset
from raysim.privacy.plan import epsilon_exceptions
from raysim.results import ResultsSink
from raysim.results.rows import now, run_row
from raysim.rng import np_generator
from raysim.simulation import RoundRecord, SetupRecord, load_checkpoint
from raysim.state_store import delete_files

if TYPE_CHECKING:
    from raysim.algorithms.base import MethodSpec


def check_config(cfg: Config) -> Config:
    """Registry checks (method and its preset, dataset) that config validation cannot do by itself;
    returns ``cfg`` with its method's presets resolved, the config every later step of the run uses."""
    cfg = resolve_preset(cfg)
    if cfg.data.name not in DATASETS:
        raise ConfigError(f"config key 'data.name': unknown dataset {cfg.data.name!r}; choose one of {', '.join(sorted(DATASETS))}")
    tokens = DATASETS[cfg.data.name].kind == "tokens"
    if cfg.model in MODEL_NAMES and tokens != (cfg.model in SEQUENCE_MODELS):
        fits = [m for m in MODEL_NAMES if (m in SEQUENCE_MODELS) == tokens]
        raise ConfigError(f"config key 'model': {cfg.model!r} reads {'images' if tokens else 'token sequences'}, and "
                          f"data set {cfg.data.name!r} has {'token sequences' if tokens else 'images'}; "
                          f"choose {' or '.join(fits)}")
    from raysim.privacy.grad_sample import ENGINES   # the engine registry owns the names
    if cfg.privacy.engine not in ENGINES:
        raise ConfigError(f"config key 'privacy.engine': unknown value {cfg.privacy.engine!r}; "
                          f"choose one of {', '.join(sorted(ENGINES))}")
    if cfg.runtime.sum_on_actors and not get_method(cfg.method).sums_updates:
        able = ", ".join(sorted(s.name for s in all_methods() if s.sums_updates))
        raise ConfigError(f"config key 'runtime.sum_on_actors': method {cfg.method!r}'s server reads each client's "
                          f"update, so its actors cannot sum them; methods that can: {able}")
    return cfg


@dataclass(frozen=True)
class RunPlan:
    """What a run is, settled before anything starts: its config with the method's presets resolved (the
    config every later step reads), the method, the clipping mode and the run id. Built by :func:`plan_run`."""

    cfg: Config
    spec: MethodSpec
    clipping: str
    run_id: str


def plan_run(cfg: Config) -> RunPlan:
    """Check ``cfg`` against the registries and the privacy plan (no data is read) and settle it: the one
    place where ``run``, ``sweep`` and ``tune`` resolve a config before validating it."""
    from raysim.privacy.plan import resolve_clipping
    cfg = check_config(cfg)
    spec = get_method(cfg.method)
    return RunPlan(cfg, spec, resolve_clipping(spec, cfg), run_id_for(cfg))


def prepare(cfg: Config) -> tuple[Any, Any]:
    """Check the config against the registries, load (train, test), and run :func:`preflight`."""
    cfg = check_config(cfg)
    train = load_dataset(cfg.data.name, "train", cfg.data.root, download=cfg.data.download, cache_dir=cfg.data.cache_dir)
    train = subsample_train(cfg, train)
    test = load_dataset(cfg.data.name, "test", cfg.data.root, download=cfg.data.download, cache_dir=cfg.data.cache_dir)
    preflight(cfg, train)
    return train, test


def subsample_train(cfg: Config, train: Any) -> Any:
    """The training split, or its fixed subset of ``data.train_subsample`` images (the same for every seed)."""
    k = cfg.data.train_subsample
    if k is None or k >= len(train.y):
        return train
    return train.take(np.sort(np_generator(0, "train-subsample").choice(len(train.y), k, replace=False)))


def preflight(cfg: Config, train: Any) -> None:
    """Catch user errors (privacy settings, impossible partitions) here, before any actor starts."""
    from raysim.run_data import make_partition
    cfg = plan_run(cfg).cfg
    make_partition(cfg, train)


@dataclass
class RunSummary:
    run_id: str
    row: dict[str, Any]


class DriverHost(Protocol):
    """Where a run's simulation (the server loop, the driver) executes, chosen once by the caller and passed in:
    in this process (``raysim.runtime.serial.InProcessDriverHost``; ``raysim.runtime.head_start.HeadStartHost``,
    whose clients move to Ray actors once they are warm) or in a driver actor on Ray
    (``raysim.runtime.driver.RayDriverHost``); ``raysim.runtime.driver_host_for`` picks one from
    ``runtime.executor``. Where the clients train is the ``Executor`` (what pfl-research calls a backend).
    Nothing here imports the runtime."""

    def start(self, cfg: Config, train: Any, test: Any, resume: bytes | None = None,
              state_dir: str | None = None) -> tuple[SetupRecord, Iterator[RoundRecord], dict[str, Any]]:
        """Set the run up (from the checkpoint ``resume`` if given; large client states spill to
        ``state_dir``); returns its setup, the stream of round records still to run and extra runs-row fields."""
        ...


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def run_experiment(cfg: Config, results_dir: str, host: DriverHost, *, sweep_id: str | None = None,
                   on_setup: Callable[[SetupRecord], None] | None = None,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   data: tuple[Any, Any] | None = None, restart: bool = False) -> RunSummary:
    """Execute ``cfg`` on ``host`` and write its rows; returns the final runs row (status completed).

    A run whose runs row says ``running`` or ``failed`` (interrupted, pre-empted, killed) resumes
    from its last checkpoint (``<results_dir>/checkpoints/<run_id>/``, every
    ``runtime.checkpoint_every`` rounds): rows of later (half-written) rounds are deleted and those
    rounds run again, so the tables end equal to an uninterrupted run's, bit for bit. ``restart``
    starts from scratch instead. ``data`` is the (train, test) pair from :func:`prepare`.
    """
    plan = plan_run(cfg)   # presets resolved once, here; every later step gets this config
    cfg, run_id = plan.cfg, plan.run_id
    train, test = data if data is not None else prepare(cfg)
    sink = ResultsSink(results_dir)
    previous = None if restart else sink.read_run(run_id)
    blob = sink.read_checkpoint(run_id) if previous and previous.get("status") in ("running", "failed") else None
    best_acc = best_f1 = -math.inf
    if blob is not None:
        done = int(load_checkpoint(blob)["completed_rounds"])
        sink.clear_rounds_after(run_id, done)
        kept = sink.read_run_rounds(run_id)   # rounds after `done` were just deleted
        if len(kept):
            best_acc, best_f1 = float(kept["test_accuracy"].max()), float(kept["test_f1"].max())
        row = {**previous, "status": "running", "error": None, "diverged": None, "end_time": None, "rounds_completed": done}
    else:
        sink.clear_run(run_id)
        sink.delete_checkpoint(run_id)
        row = run_row(cfg, sweep_id, "running")
    sink.write_run(row)
    t0 = time.perf_counter() - float(row.get("wall_seconds") or 0.0)
    records: Any = None
    try:
        state_dir = sink.client_state_dir(run_id)
        setup, records, placement = host.start(cfg, train, test, resume=blob, state_dir=state_dir)
        row.update(placement)
        row.update(clipping=setup.clipping, noise_multiplier=_finite_or_none(setup.max_noise_multiplier),
                   startup_seconds=setup.startup_seconds,
                   not_covered_by_epsilon=setup.not_covered_by_epsilon, num_params=setup.num_params,
                   epsilon_exceptions=epsilon_exceptions(plan.spec, cfg, setup.clipping))
        sink.write_partition(run_id, setup.partition_stats)
        sink.write_run(row)
        if on_setup:
            on_setup(setup)
        for rec in records:
            sink.write_round(run_id, rec.server_round, rec.round_row, rec.client_rows)
            row.update(placement)   # a head-start run learns its actors' nodes once they are warm
            rr = rec.round_row
            best_acc, best_f1 = max(best_acc, rr["test_accuracy"]), max(best_f1, rr["test_f1"])
            row.update(rounds_completed=rec.server_round, final_test_accuracy=rr["test_accuracy"],
                       final_test_f1=rr["test_f1"], final_test_loss=rr["test_loss"], best_test_accuracy=best_acc,
                       best_test_f1=best_f1, final_val_accuracy=_finite_or_none(rr["val_accuracy"]),
                       final_val_f1=_finite_or_none(rr["val_f1"]), epsilon=rr["epsilon"],
                       wall_seconds=time.perf_counter() - t0)
            if math.isfinite(rec.max_noise_multiplier):   # partial participation plans σ_i as clients first train
                row["noise_multiplier"] = rec.max_noise_multiplier
            if rec.rdp_epsilons is not None:
                row["rdp_epsilons"] = rec.rdp_epsilons
            sink.write_run(row)
            if rec.checkpoint is not None:   # after the round's rows: a crash in between redoes the round
                sink.write_checkpoint(run_id, rec.checkpoint)
                delete_files(state_dir, rec.released_state_files)   # named by no checkpoint from now on
            if on_round:
                on_round(rec)
    except BaseException as exc:
        close = getattr(records, "close", None)
        if close is not None:   # end the driver host's run (its actors) even if the stream never started
            close()
        from raysim.simulation import TrainingDiverged
        row.update(status="failed", error=f"{type(exc).__name__}: {exc}", end_time=now(), wall_seconds=time.perf_counter() - t0,
                   diverged=any(isinstance(e, TrainingDiverged) for e in (exc, getattr(exc, "cause", None))))
        sink.write_run(row)
        raise
    row.update(status="completed", end_time=now(), wall_seconds=time.perf_counter() - t0)
    sink.write_run(row)
    sink.delete_checkpoint(run_id)
    return RunSummary(run_id, row)
