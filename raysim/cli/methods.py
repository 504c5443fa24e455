"""``raysim methods``: the registered methods, one line each."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("methods", help="list the registered methods")
    p.set_defaults(func=cmd_methods)


def cmd_methods(args: argparse.Namespace) -> int:
    from raysim.algorithms.registry import all_methods, origin
    specs = all_methods()
    width = max(len(s.name) for s in specs)
    units = {s.name: "+".join(s.units()) for s in specs}
    unit_width = max(len(u) for u in units.values())
    for s in specs:
        kind = "DP " if s.private else "   "
        print(f"{s.name:<{width}}  {kind} {units[s.name]:<{unit_width}}  {s.summary}")
        print(f"{'':<{width}}      from: {origin(s)}")
    print("\nDP = differentially private by default; the others take privacy.epsilon to become DP variants.")
    print("example / client = the privacy units a method supports (privacy.unit). Under the client unit:")
    from raysim.config import Config
    for s in specs:
        note = s.client_level_note if "client" in s.units() else f"refused: {s.client_level(Config())}"
        print(f"  {s.name:<{width}}  {note}")
    return 0
