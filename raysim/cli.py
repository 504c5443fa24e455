"""``raysim`` command line: run, methods, privacy, sweep, report."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from raysim.config import ConfigError, apply_overrides, cli_overrides, config_from_dict, read_yaml


class UserError(Exception):
    """Bad input: printed as one line, exit code 2."""


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set data.alpha=0.1 (repeatable)")
    p.add_argument("--results-dir", default="./results", help="where the Parquet tables go (default ./results)")
    p.add_argument("--data-root", default=None, help="folder holding cifar10/, svhn/, stl10/ (sets data.root)")
    p.add_argument("--address", default=None, help="join an existing Ray cluster (sets runtime.address)")


def resolve_values(path: str, overrides: Sequence[str], data_root: str | None, address: str | None) -> dict[str, Any]:
    return apply_overrides(read_yaml(path), cli_overrides(list(overrides), data_root, address))


def cmd_run(args: argparse.Namespace) -> int:
    from raysim.experiment import prepare
    from raysim.runtime import execute
    from raysim.progress import RunProgress, print_summary
    values = resolve_values(args.config, args.overrides, args.data_root, args.address)
    methods = values.get("method", "fedavg")
    methods = methods if isinstance(methods, list) else [methods]
    configs = [config_from_dict({**values, "method": m}) for m in methods]
    data = [prepare(cfg) for cfg in configs]   # every user error surfaces before anything runs
    rows = []
    for cfg, pair in zip(configs, data):
        with RunProgress(cfg) as progress:
            summary = execute(cfg, args.results_dir, on_setup=progress.setup, on_round=progress.round, data=pair)
        rows.append(summary.row)
    print_summary(rows, args.results_dir)
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from raysim.algorithms.registry import all_methods
    specs = all_methods()
    width = max(len(s.name) for s in specs)
    for s in specs:
        kind = "DP " if s.private else "   "
        print(f"{s.name:<{width}}  {kind} {s.summary}")
    print("\nDP = differentially private by default; the others take privacy.epsilon to become DP variants.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raysim", description="Ray-parallel simulation of DP federated learning")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment (or one per method if `method` is a list)")
    run.add_argument("config", help="YAML config file")
    _add_common(run)
    run.set_defaults(func=cmd_run)
    methods = sub.add_parser("methods", help="list the registered methods")
    methods.set_defaults(func=cmd_methods)
    from raysim.privacy.privacy_cli import add_privacy_subparser
    add_privacy_subparser(sub)
    for extra in ("raysim.sweep_cli", "raysim.report_cli"):
        try:
            module = __import__(extra, fromlist=["add_subparser"])
        except ModuleNotFoundError as exc:
            if exc.name != extra:
                raise
            continue
        module.add_subparser(sub, _add_common)
    return parser


def _diverged(exc: BaseException) -> str | None:
    from raysim.simulation import TrainingDiverged
    for e in (exc, getattr(exc, "cause", None)):
        if isinstance(e, TrainingDiverged):
            return str(e)
    return None


def _user_message(exc: BaseException) -> str | None:
    if isinstance(exc, (ConfigError, ValueError, UserError, FileNotFoundError)):
        return str(exc)
    cause = getattr(exc, "cause", None)   # a ValueError raised inside a Ray actor
    if isinstance(cause, ValueError):
        return str(cause)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("raysim: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # user errors become one line; bugs keep their traceback
        diverged = _diverged(exc)
        if diverged is not None:
            print(f"raysim: run failed: {diverged} (recorded as failed in the runs table)", file=sys.stderr)
            return 1
        msg = _user_message(exc)
        if msg is None:
            raise
        print(f"raysim: error: {msg.splitlines()[0] if msg else type(exc).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
