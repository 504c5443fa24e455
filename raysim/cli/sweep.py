"""``raysim sweep SWEEP.yaml``: expand, skip completed runs, run the rest in parallel, summarise."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any, Sequence

from raysim.cli.common import add_run_options, print_table
from raysim.config import ConfigError
from raysim.run_plan import RunPlan
from raysim.sweep import Sweep, check_sweep, load_sweep, read_statuses, run_label

SWEEP_COLUMNS = [("run_id", "run_id"), ("alpha", "α"), ("status", "status"), ("final_test_accuracy", "accuracy"),
                 ("final_test_f1", "macro-F1"), ("epsilon_shown", "ε"), ("wall_seconds", "wall s")]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sweep", help="run a grid of experiments in parallel on Ray (resumable)")
    p.add_argument("sweep", help="sweep YAML: base config + grid of dotted keys (+ overrides)")
    add_sweep_options(p)
    p.set_defaults(func=cmd_sweep)


def add_sweep_options(p: argparse.ArgumentParser) -> None:
    """The options of the commands that run sweeps (``sweep``, ``tune``)."""
    add_run_options(p)
    p.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                   help="runs in flight at once (default: as many as fit the cluster's resources)")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their status, run nothing")
    p.add_argument("--retries", type=int, default=2, metavar="K",
                   help="times a run lost to the cluster (dead node or actors) is resumed from its checkpoint (default 2)")
    p.add_argument("--fresh-actors", action="store_true",
                   help="start new actors for every run instead of reusing warm ones across runs on the same data")


class SweepProgress:
    """One tqdm bar over the rounds still to run: runs done / running / queued / failed, and ETA."""

    def __init__(self, sweep: Sweep, todo: Sequence[RunPlan], results_dir: str) -> None:
        from tqdm import tqdm
        from raysim.results import ResultsSink
        self.sink = ResultsSink(results_dir)
        self.rounds = {p.run_id: p.cfg.rounds for p in todo}
        self.labels = {p.run_id: run_label(p.cfg) for p in todo}
        self.running: dict[str, int] = {}
        self.done_rounds = 0
        self.completed = self.failed = self.queued = 0
        self.last_poll = self.last_draw = 0.0
        self.shown: tuple[int, str] | None = None
        self.bar = tqdm(total=sum(self.rounds.values()), desc=f"sweep {sweep.sweep_id}", unit="round",
                        file=sys.stderr, dynamic_ncols=True)
        self._update(force=True)

    def _update(self, force: bool = False) -> None:
        # Redraw only on change (or every 30 s): under `ray job submit` each redraw is a log line.
        n = self.done_rounds + sum(self.running.values())
        postfix = (f"runs {self.completed}/{len(self.rounds)} done, {len(self.running)} running, "
                   f"{self.queued} queued, {self.failed} failed")
        now = time.monotonic()
        if force or (n, postfix) != self.shown or now - self.last_draw > 30:
            self.shown, self.last_draw = (n, postfix), now
            self.bar.n = n
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.refresh()

    def started(self, run_id: str) -> None:
        self.running[run_id] = 0
        self._update()

    def finished(self, outcome: Any) -> None:
        self.running.pop(outcome.run_id, None)
        self.done_rounds += self.rounds[outcome.run_id]   # a failed run's rounds will not be run either
        label = self.labels[outcome.run_id]
        if outcome.status == "completed":
            self.completed += 1
            acc = (outcome.row or {}).get("final_test_accuracy")
            self.bar.write(f"done    {outcome.run_id}  ({label})  accuracy {acc:.4f}" if acc is not None
                           else f"done    {outcome.run_id}  ({label})")
        else:
            self.failed += 1
            self.bar.write(f"FAILED  {outcome.run_id}  ({label}): {outcome.error}")
        self._update()

    def tick(self, queued: int) -> None:
        self.queued = queued
        now = time.monotonic()
        if now - self.last_poll >= 2.0:   # rounds of running runs, read from their runs rows
            self.last_poll = now
            for run_id in self.running:
                try:
                    row = self.sink.read_run(run_id)
                except (ValueError, OSError):   # a display poll never stops a sweep: skip, read it next time
                    continue
                if row is not None:
                    self.running[run_id] = min(int(row.get("rounds_completed") or 0), self.rounds[run_id])
        self._update()

    def close(self) -> None:
        self.bar.close()


def print_sweep_summary(sweep: Sweep, rows: dict[str, dict[str, Any] | None], results_dir: str) -> int:
    """The table of every run of the sweep; returns how many are not completed."""
    from raysim.results.rows import epsilon_label
    shown = [rows.get(run_id) or {"run_id": run_id, "status": "missing"} for run_id in sweep.run_ids]
    shown = [{**r, "epsilon_shown": epsilon_label(r.get("epsilon"), r.get("epsilon_exceptions"), r.get("epsilon_scope"),
                                                  "{:.4f}")} for r in shown]
    print_table(shown, SWEEP_COLUMNS)
    bad = [(cfg, run_id, rows.get(run_id) or {}) for cfg, run_id in zip(sweep.configs, sweep.run_ids)
           if (rows.get(run_id) or {}).get("status") != "completed"]
    if bad:
        print(f"\n{len(bad)} run(s) did not complete:")
        for cfg, run_id, row in bad:
            print(f"  {run_id} ({run_label(cfg)}): {row.get('status', 'missing')}: "
                  f"{row.get('error') or 'no error recorded'}")
        print("Rerun the same command to resume them from their last checkpoints (completed runs are skipped).")
    print(f"\nResults (Parquet, sweep_id {sweep.sweep_id}): {results_dir}/runs, /rounds, /clients, /partitions")
    return len(bad)


def check_sweep_options(args: argparse.Namespace) -> None:
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise ConfigError(f"--max-concurrent must be >= 1, got {args.max_concurrent}")
    if args.retries < 0:
        raise ConfigError(f"--retries must be >= 0, got {args.retries}")


def cmd_sweep(args: argparse.Namespace) -> int:
    check_sweep_options(args)
    from raysim.results.sink import check_results_dir
    check_results_dir(args.results_dir)
    sweep = load_sweep(args.sweep, args.overrides, args.data_root, args.address)
    plans = check_sweep(sweep)
    results_dir = args.results_dir
    if "://" not in results_dir:
        if not os.path.isabs(results_dir) and "runtime_resources" in os.getcwd():
            print(f"raysim: warning: --results-dir {results_dir} is relative to the job's temporary working dir; "
                  f"pass an absolute path (or s3://…) to keep the results", file=sys.stderr)
        results_dir = os.path.abspath(results_dir)   # the run tasks' working directory may differ
    rows = read_statuses(sweep, results_dir)
    todo = [plan for plan in plans if (rows[plan.run_id] or {}).get("status") != "completed"]
    skipped = len(sweep.configs) - len(todo)
    dup = f" ({sweep.duplicates} duplicate grid points merged)" if sweep.duplicates else ""
    print(f"sweep {sweep.sweep_id}: {len(sweep.configs)} runs{dup}, {skipped} already completed, {len(todo)} to run",
          flush=True)
    if args.dry_run:
        for cfg, run_id in zip(sweep.configs, sweep.run_ids):
            print(f"  {(rows[run_id] or {}).get('status', 'new'):<10} {run_id}  {run_label(cfg)}")
        return 0
    if todo:
        execute_sweep(sweep, todo, results_dir, args)
    failed = print_sweep_summary(sweep, read_statuses(sweep, results_dir), results_dir)
    return 1 if failed else 0


def execute_sweep(sweep: Sweep, todo: Sequence[RunPlan], results_dir: str, args: argparse.Namespace,
                  kept_pool: Any = None) -> None:
    """Run ``todo`` (runs of ``sweep``) in parallel on Ray with a progress bar (``args``: the sweep options;
    ``kept_pool``: a ``KeptPool`` whose warm actors outlive this sweep)."""
    from raysim.runtime import execute_row
    from raysim.runtime.sweep_runner import run_sweep
    progress = SweepProgress(sweep, todo, results_dir)
    try:
        run_sweep(todo, results_dir, sweep.sweep_id,
                  run_one=functools.partial(execute_row, restart=True) if args.restart else execute_row,
                  address=args.address, max_concurrent=args.max_concurrent, retries=args.retries,
                  reuse_actors=not args.fresh_actors, listener=progress, kept_pool=kept_pool)
    except KeyboardInterrupt:
        progress.close()
        print("raysim: sweep interrupted; rerun the same command to resume it", file=sys.stderr)
        raise
    finally:
        progress.close()
