"""Run one experiment end to end: load data, execute, stream rows into the results folder."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from raysim.config import Config
from raysim.data import load_dataset
from raysim.run_plan import RunPlan, plan_run
from raysim.results import ResultsSink
from raysim.results.rows import now, run_row
from raysim.rng import np_generator
from raysim.simulation import RoundRecord, SetupRecord, load_checkpoint
from raysim.state_store import delete_files


def prepare(plan: RunPlan | Config) -> tuple[Any, Any]:
    """Plan the run (:func:`raysim.run_plan.plan_run`), load (train, test), and run :func:`preflight`."""
    plan = plan_run(plan)
    cfg = plan.cfg
    train = load_dataset(cfg.data.name, "train", cfg.data.root, download=cfg.data.download, cache_dir=cfg.data.cache_dir)
    train = subsample_train(cfg, train)
    test = load_dataset(cfg.data.name, "test", cfg.data.root, download=cfg.data.download, cache_dir=cfg.data.cache_dir)
    preflight(plan, train)
    return train, test


def subsample_train(cfg: Config, train: Any) -> Any:
    """The training split, or its fixed subset of ``data.train_subsample`` images (the same for every seed)."""
    k = cfg.data.train_subsample
    if k is None or k >= len(train.y):
        return train
    return train.take(np.sort(np_generator(0, "train-subsample").choice(len(train.y), k, replace=False)))


def preflight(plan: RunPlan | Config, train: Any) -> None:
    """Catch user errors (privacy settings, impossible partitions) here, before any actor starts."""
    from raysim.run_data import make_partition
    make_partition(plan_run(plan).cfg, train)


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

    def start(self, plan: RunPlan, train: Any, test: Any, resume: bytes | None = None,
              state_dir: str | None = None) -> tuple[SetupRecord, Iterator[RoundRecord], dict[str, Any]]:
        """Set the run up (from the checkpoint ``resume`` if given; large client states spill to
        ``state_dir``); returns its setup, the stream of round records still to run and extra runs-row fields."""
        ...


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def run_experiment(plan: RunPlan | Config, results_dir: str, host: DriverHost, *, sweep_id: str | None = None,
                   on_setup: Callable[[SetupRecord], None] | None = None,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   data: tuple[Any, Any] | None = None, restart: bool = False) -> RunSummary:
    """Execute the run ``plan`` (a config is planned first) on ``host`` and write its rows; returns the final runs row (status completed).

    A run whose runs row says ``running`` or ``failed`` (interrupted, pre-empted, killed) resumes
    from its last checkpoint (``<results_dir>/checkpoints/<run_id>/``, every
    ``runtime.checkpoint_every`` rounds): rows of later (half-written) rounds are deleted and those
    rounds run again, so the tables end equal to an uninterrupted run's, bit for bit. ``restart``
    starts from scratch instead. ``data`` is the (train, test) pair from :func:`prepare`.
    """
    plan = plan_run(plan)
    run_id = plan.run_id
    train, test = data if data is not None else prepare(plan)
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
        row = run_row(plan, sweep_id, "running")
    sink.write_run(row)
    t0 = time.perf_counter() - float(row.get("wall_seconds") or 0.0)
    records: Any = None
    try:
        state_dir = sink.client_state_dir(run_id)
        setup, records, placement = host.start(plan, train, test, resume=blob, state_dir=state_dir)
        row.update(placement)
        row.update(clipping=setup.clipping, noise_multiplier=_finite_or_none(setup.max_noise_multiplier),
                   startup_seconds=setup.startup_seconds,
                   not_covered_by_epsilon=setup.not_covered_by_epsilon, num_params=setup.num_params,
                   epsilon_exceptions=plan.epsilon_exceptions)
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
