"""``raysim`` command line: run, methods, privacy, sweep, tune, report, audit.

One module per command. Each exposes ``register(subparsers) -> None``, which adds the command's
parser and sets ``func`` (``func(args) -> int`` is the exit code). Building the parser imports
neither torch, ray, pandas, pyarrow nor matplotlib: a command imports what it needs when it runs,
so ``raysim --help`` and ``raysim privacy ...`` answer at once (tests/unit/core/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Sequence

from raysim.allocator import spin_less
from raysim.cli import audit, methods, privacy, report, run, sweep, tune
from raysim.config import ConfigError
from raysim.plugins import PluginError

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = (run, methods, privacy, sweep, tune, report, audit)   # in the order `raysim --help` lists them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raysim", description="Ray-parallel simulation of DP federated learning")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def _diverged(exc: BaseException) -> str | None:
    # TrainingDiverged lives in raysim.simulation (torch): if that module was never imported, no run
    # happened and nothing diverged. Importing it here would load torch for every privacy typo.
    simulation = sys.modules.get("raysim.simulation")
    if simulation is None:
        return None
    for e in (exc, getattr(exc, "cause", None)):   # `cause`: the exception raised inside a Ray task
        if isinstance(e, simulation.TrainingDiverged):
            return str(e)
    return None


#: The project's input errors: a bad config, option or file (``ConfigError`` and its subclasses: the audit's,
#: the data registry's, the checkpoint's), a plugin that cannot be imported, and paths that do not exist. Only these get one line and exit
#: code 2; any other exception is a bug and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, PluginError, FileNotFoundError, NotADirectoryError,
                                               IsADirectoryError)


def _user_message(exc: BaseException) -> str | None:
    for e in (exc, getattr(exc, "cause", None)):   # `cause`: the exception raised inside a Ray actor
        if isinstance(e, USER_ERRORS):
            return str(e)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    spin_less()       # before any command loads torch
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("raysim: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # input errors become one line; bugs keep their traceback
        diverged = _diverged(exc)
        if diverged is not None:
            print(f"raysim: run failed: {diverged} (recorded as failed in the runs table)", file=sys.stderr)
            return 1
        msg = _user_message(exc)
        if msg is None:
            traceback.print_exc()
            print(f"raysim: internal error ({type(exc).__name__}): this is a bug in raysim, not in the input; "
                  f"please report it with the traceback above", file=sys.stderr)
            return 1
        print(f"raysim: error: {msg.splitlines()[0] if msg else type(exc).__name__}", file=sys.stderr)
        return 2
