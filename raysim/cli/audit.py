"""``raysim audit CONFIG``: an empirical lower bound on ε from one training run (white-box canaries)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from raysim.cli.common import add_run_options
from raysim.config import ConfigError, apply_overrides, cli_overrides, config_from_dict, read_yaml


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("audit", help="empirical lower bound on ε from one run (Steinke et al. 2023)")
    p.add_argument("config", help="YAML config file (with method a list, the first method is audited)")
    add_run_options(p)
    p.add_argument("--canaries", type=int, default=None, metavar="M",
                   help="privacy.unit=example: gradient canaries spread over every parametrised layer (default "
                        "10000); privacy.unit=client: canary clients (default 1000)")
    p.add_argument("--guess-fraction", type=float, default=None, metavar="F",
                   help="privacy.unit=example: guess the top and the bottom F of the canaries' scores (default 0.1; "
                        "in (0, 0.5]); the client unit chooses its threshold on the scores")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_audit)


def _client_audit(plan: Any, args: argparse.Namespace) -> int:
    """``privacy.unit=client``: canary clients (``raysim.audit_clients``), trained in this process; ``plan``
    is the run's :class:`~raysim.run_plan.RunPlan`."""
    cfg = plan.cfg
    if args.guess_fraction is not None:
        raise ConfigError("--guess-fraction is for privacy.unit=example; the canary-client audit chooses its "
                          "threshold on the scores")
    from raysim.audit_clients import run_client_audit
    from raysim.runtime.serial import SerialExecutor
    found = run_client_audit(plan, SerialExecutor(), canaries=args.canaries if args.canaries is not None else 1000)
    if args.json:
        print(json.dumps(found.as_dict()))
        return 0
    print(f"{cfg.method} (client-level, σ = {found.noise_multiplier:.4f} on the simulated clients' sum, "
          f"{found.rounds} rounds, {found.insertions} canary updates inserted, {found.canaries} canary clients): "
          f"ε_lb = {found.epsilon_lower_bound:.3f} (Steinke et al.) and {found.epsilon_lower_bound_fdp:.3f} (f-DP), "
          f"95 % confidence each, {found.correct}/{found.guesses} one-sided guesses right; one-shot estimate "
          f"ε ≈ {found.epsilon_estimate:.3f}; against the audited clients' ε = {found.epsilon_audited:.3f} at "
          f"δ = {found.delta:g} ({found.audited_scope})")
    if found.accounted_scope != found.audited_scope:
        print(f"the run reports ε = {found.epsilon_accounted:.3f}, the ε of {found.accounted_scope}: not the "
              f"audited clients' and not what this audit can check")
    print(f"ceilings at {found.canaries} canaries: {found.epsilon_ceiling:.3f} (Steinke et al.), "
          f"{found.epsilon_ceiling_fdp:.3f} (f-DP); "
          + ("the audit refutes the claim" if found.refutes else "no claim refuted")
          + ("" if found.can_refute else
             f"; this audit cannot refute ε = {found.epsilon_audited:.3f} (above its f-DP ceiling): add canaries"))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    values = apply_overrides(read_yaml(args.config), cli_overrides(list(args.overrides), args.data_root, args.address))
    method = values.get("method", "fedavg")
    values["method"] = method[0] if isinstance(method, list) else method
    cfg = config_from_dict(values)
    if cfg.privacy.epsilon is None and cfg.privacy.noise_multiplier is None:
        raise ConfigError("the audit needs privacy.epsilon or privacy.noise_multiplier")
    from raysim.run_plan import plan_run
    plan = plan_run(cfg)
    if cfg.privacy.unit == "client":
        return _client_audit(plan, args)
    from raysim.audit import record_level_audit
    report = record_level_audit(plan, canaries=args.canaries if args.canaries is not None else 10000,
                                guess_fraction=args.guess_fraction if args.guess_fraction is not None else 0.1)
    caveat = plan.spec.audit_caveat
    # whose ε: the audited client's own DP-SGD releases (the run's per-client ε, less its side channels)
    scope = "per-client: the audited client's DP-SGD releases"
    if args.json:
        print(json.dumps({**report.as_dict(), "caveat": caveat, "epsilon_scope": "per-client"}))
        return 0
    r = report.dp_sgd
    print(f"{cfg.method} DP-SGD ({r.clipping} clipping, canaries via {r.path}, σ = {r.noise_multiplier:.4f}, "
          f"{r.steps} steps): ε_lb = {r.epsilon_lower_bound:.3f} (95 % confidence) against accounted ε = "
          f"{r.epsilon_accounted:.3f} ({scope}) at δ = {r.delta:g}; {r.correct}/{r.guesses} guesses right over {r.canaries} "
          f"canaries; ceiling {r.epsilon_ceiling:.3f} (the ε_lb of every guess right: a claim above it cannot be "
          f"refuted by this audit)")
    print(f"  with the threshold chosen on the scores (one-sided guesses, Bonferroni over the thresholds): "
          f"ε_lb = {r.threshold_steinke:.3f} (Steinke et al.) and {r.threshold_fdp:.3f} (f-DP), ceilings "
          f"{r.threshold_ceiling_steinke:.3f} and {r.threshold_ceiling_fdp:.3f}"
          + ("" if r.threshold_ceiling_fdp > r.epsilon_accounted else
             f"; this audit cannot refute ε = {r.epsilon_accounted:.3f}: add canaries"))
    if caveat:
        print(f"caveat ({cfg.method}): {caveat}")
    for p in r.per_layer:
        print(f"  layer {p.layer} ({p.parameters} parameters): ε_lb = {p.epsilon_lower_bound:.3f}, "
              f"{p.correct}/{p.guesses} right over {p.canaries} canaries, ceiling {p.epsilon_ceiling:.3f}")
    for s in report.side_channels:
        if s.audited:
            print(f"side channel {s.name} (Gaussian, σ = {s.noise_multiplier:g}): ε_lb = {s.epsilon_lower_bound:.3f} "
                  f"against accounted ε = {s.epsilon_accounted:.3f} per release; {s.correct}/{s.guesses} right over "
                  f"{s.releases} releases; ceiling {s.epsilon_ceiling:.3f}")
        else:
            print(f"side channel {s.name}: not audited: {s.reason}")
    return 0
