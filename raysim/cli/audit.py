"""``raysim audit CONFIG``: an empirical lower bound on ε from one training run (white-box canaries)."""

from __future__ import annotations

import argparse
import json

from raysim.cli.common import add_run_options
from raysim.config import ConfigError, apply_overrides, cli_overrides, config_from_dict, read_yaml


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("audit", help="empirical lower bound on ε from one run (Steinke et al. 2023)")
    p.add_argument("config", help="YAML config file (with method a list, the first method is audited)")
    add_run_options(p)
    p.add_argument("--canaries", type=int, default=None, metavar="M",
                   help="canaries: gradient canaries under privacy.unit=example (default 10000), canary clients "
                        "under privacy.unit=client (default 1000)")
    p.add_argument("--guess-fraction", type=float, default=0.1, metavar="F",
                   help="guess the top and the bottom F of the canaries' scores (default 0.1; in (0, 0.5])")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    from raysim.audit import run_audit
    from raysim.audit_clients import run_client_audit
    values = apply_overrides(read_yaml(args.config), cli_overrides(list(args.overrides), args.data_root, args.address))
    method = values.get("method", "fedavg")
    values["method"] = method[0] if isinstance(method, list) else method
    cfg = config_from_dict(values)
    if cfg.privacy.epsilon is None and cfg.privacy.noise_multiplier is None:
        raise ConfigError("the audit needs privacy.epsilon or privacy.noise_multiplier")
    if cfg.privacy.unit == "client":
        from raysim.runtime.serial import SerialExecutor
        found = run_client_audit(cfg, SerialExecutor(), canaries=args.canaries if args.canaries is not None else 1000,
                                 guess_fraction=args.guess_fraction)
        if args.json:
            print(json.dumps(found.as_dict()))
        else:
            print(f"{cfg.method} (client-level, σ = {found.noise_multiplier:.4f}, {found.rounds} rounds, "
                  f"{found.insertions} canary updates inserted): ε_lb = {found.epsilon_lower_bound:.3f} (95 % "
                  f"confidence; ceiling {found.epsilon_ceiling:.3f}), one-shot estimate ε ≈ "
                  f"{found.epsilon_estimate:.3f}, against accounted ε = {found.epsilon_accounted:.3f} at δ = "
                  f"{found.delta:g}; {found.correct}/{found.guesses} guesses right over {found.canaries} canary "
                  f"clients")
        return 0
    result = run_audit(cfg, canaries=args.canaries if args.canaries is not None else 10000,
                       guess_fraction=args.guess_fraction)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(f"{cfg.method} ({result.clipping} clipping, σ = {result.noise_multiplier:.4f}, {result.steps} steps): "
              f"ε_lb = {result.epsilon_lower_bound:.3f} (95 % confidence) against accounted ε = "
              f"{result.epsilon_accounted:.3f} at δ = {result.delta:g}; {result.correct}/{result.guesses} guesses "
              f"right over {result.canaries} canaries; ceiling {result.epsilon_ceiling:.3f} (the ε_lb of every "
              f"guess right: a claim above it cannot be refuted by this audit)")
    return 0
