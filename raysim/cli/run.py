"""``raysim run CONFIG.yaml``: one experiment (or one per method if ``method`` is a list), then a summary."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from raysim.cli.common import add_run_options, print_table
from raysim.config import apply_overrides, cli_overrides, config_from_dict, read_yaml

RUN_COLUMNS = [("run_id", "run_id"), ("method", "method"), ("dataset", "dataset"),
               ("final_test_accuracy", "accuracy"), ("final_test_f1", "macro-F1"), ("epsilon_shown", "ε"),
               ("privacy_unit", "unit"), ("wall_seconds", "wall s")]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run one experiment (or one per method if `method` is a list)")
    p.add_argument("config", help="YAML config file")
    add_run_options(p)
    p.add_argument("--dry-run", action="store_true",
                   help="check the config, load the data and partition it, print the runs, run nothing")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from raysim.experiment import prepare
    from raysim.run_plan import plan_run
    from raysim.runtime import execute
    from raysim.progress import RunProgress
    from raysim.results.sink import check_results_dir
    check_results_dir(args.results_dir)
    values = apply_overrides(read_yaml(args.config),
                             cli_overrides(list(args.overrides), args.data_root, args.address))
    methods = values.get("method", "fedavg")
    methods = methods if isinstance(methods, list) else [methods]
    plans = [plan_run(config_from_dict({**values, "method": m})) for m in methods]
    data = [prepare(plan) for plan in plans]   # every user error surfaces before anything runs
    if args.dry_run:
        for plan in plans:
            cfg = plan.cfg
            print(f"{plan.run_id}  {cfg.method} on {cfg.data.name}: {cfg.num_clients} clients, {cfg.rounds} rounds, "
                  f"seed {cfg.seed}")
        return 0
    rows = []
    for plan, pair in zip(plans, data):
        with RunProgress(plan) as progress:
            summary = execute(plan, args.results_dir, on_setup=progress.setup, on_round=progress.round, data=pair,
                              restart=args.restart)
        rows.append(summary.row)
    print_run_summary(rows, args.results_dir)
    return 0


def print_run_summary(rows: Sequence[dict[str, Any]], results_dir: str) -> None:
    from raysim.results.rows import epsilon_label
    # ε with whose it is and the uploads it does not cover beside it (privacy.allow_uncovered)
    rows = [{**r, "epsilon_shown": epsilon_label(r.get("epsilon"), r.get("epsilon_exceptions"), r.get("epsilon_scope"),
                                                 "{:.4f}")} for r in rows]
    print_table(rows, RUN_COLUMNS)
    for row in rows:
        if row.get("privacy_unit") == "client" and row.get("clipping") != "none":
            print(f"{row['run_id']}: client-level ε ({row['adjacency']}) of {row.get('epsilon_scope_detail') or row['epsilon_scope']}")
    print(f"\nResults (Parquet): {results_dir}/runs, {results_dir}/rounds, {results_dir}/clients, {results_dir}/partitions")
    print(f"  pandas: pd.read_parquet('{results_dir}/rounds')")
