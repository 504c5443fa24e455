"""``raysim privacy ...``: epsilon of a DP-SGD run, or the noise multiplier that reaches a target.

Both commands describe one client doing ``--steps`` Poisson-subsampled Gaussian steps (record-level DP,
add/remove-one neighbours) and delegate to :mod:`raysim.privacy.accounting`, imported when a command
runs (dp_accounting and scipy take a second to load; ``raysim --help`` need not wait for them). Bad
values raise ``ValueError`` with a one-line message; the main CLI prints it as ``raysim: error: ...``
(exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
from raysim.config import ConfigError

# = raysim.privacy.accounting.ACCOUNTANTS (tests/unit/cli/test_privacy_cli.py checks), spelled out so
# that building the parser does not import the accountant.
ACCOUNTANTS = ("pld", "rdp")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``privacy`` command (sub-commands ``epsilon`` and ``calibrate``) to ``subparsers``."""
    privacy = subparsers.add_parser(
        "privacy",
        help="privacy accounting: epsilon of a run, or calibrate the noise multiplier",
        description="Privacy accounting for DP-SGD with Poisson sampling (dp-accounting, PLD or RDP).",
    )
    commands = privacy.add_subparsers(dest="privacy_command", metavar="{epsilon,calibrate}")
    commands.required = True

    for name, help_text, flag, metavar, flag_help, func in (
            ("epsilon", "epsilon spent by a run with a given noise multiplier", "--noise-multiplier", "S",
             "noise std / clipping norm (sigma); 0 means no privacy", cmd_epsilon),
            ("calibrate", "smallest noise multiplier that keeps epsilon <= target", "--target-epsilon", "E",
             "epsilon the whole run may spend", cmd_calibrate)):
        command = commands.add_parser(name, help=help_text)
        _add_run_arguments(command)
        command.add_argument(flag, type=float, required=True, metavar=metavar, help=flag_help)
        _add_common_arguments(command)
        command.set_defaults(func=func)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sample-rate", type=float, required=True, metavar="Q",
                        help="Poisson sampling rate q = expected batch size / local data size, in (0, 1]")
    parser.add_argument("--steps", type=int, required=True, metavar="N", help="number of DP-SGD steps")


def _add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delta", type=float, required=True, metavar="D", help="delta, in (0, 1)")
    parser.add_argument("--accountant", choices=ACCOUNTANTS, default="pld", help="default: %(default)s")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _validate(args: argparse.Namespace) -> None:
    if not 0.0 < args.sample_rate <= 1.0:
        raise ConfigError(f"--sample-rate must be in (0, 1], got {args.sample_rate:g}")
    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if not 0.0 < args.delta < 1.0:
        raise ConfigError(f"--delta must be in (0, 1), got {args.delta:g}")
    sigma = getattr(args, "noise_multiplier", None)
    if sigma is not None and not (sigma >= 0.0 and math.isfinite(sigma)):
        raise ConfigError(f"--noise-multiplier must be finite and >= 0, got {sigma:g}")
    target = getattr(args, "target_epsilon", None)
    if target is not None and not (target > 0.0 and math.isfinite(target)):
        raise ConfigError(f"--target-epsilon must be finite and > 0, got {target:g}")


def _json_number(value: float) -> float | None:
    # Strict JSON has no Infinity; epsilon without noise is reported as null.
    return value if math.isfinite(value) else None


def _round_up(value: float, digits: int = 6) -> float:
    """``value`` rounded up to ``digits`` significant digits: a printed sigma never overshoots epsilon."""
    if value <= 0.0:
        return value
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    return math.ceil(value * scale) / scale


def cmd_epsilon(args: argparse.Namespace) -> int:
    _validate(args)
    from raysim.privacy.accounting import compute_epsilon_steps
    eps = compute_epsilon_steps(args.sample_rate, args.noise_multiplier, args.steps, args.delta, args.accountant)
    if args.json:
        print(json.dumps({
            "epsilon": _json_number(eps),
            "delta": args.delta,
            "accountant": args.accountant,
            "sample_rate": args.sample_rate,
            "noise_multiplier": args.noise_multiplier,
            "steps": args.steps,
        }))
    else:
        print(f"epsilon = {eps:.4f} (delta={args.delta:g}, accountant={args.accountant})")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    _validate(args)
    from raysim.privacy.accounting import calibrate_noise_multiplier, compute_epsilon_steps
    sigma = calibrate_noise_multiplier(
        args.target_epsilon, args.delta, [(args.sample_rate, args.steps)], args.accountant
    )
    eps = compute_epsilon_steps(args.sample_rate, sigma, args.steps, args.delta, args.accountant)
    if args.json:
        print(json.dumps({
            "noise_multiplier": sigma,
            "epsilon": eps,
            "target_epsilon": args.target_epsilon,
            "delta": args.delta,
            "accountant": args.accountant,
            "sample_rate": args.sample_rate,
            "steps": args.steps,
        }))
    else:
        print(
            f"noise_multiplier = {_round_up(sigma):g} (epsilon={eps:.4f} <= target {args.target_epsilon:g}, "
            f"delta={args.delta:g}, accountant={args.accountant})"
        )
    return 0
