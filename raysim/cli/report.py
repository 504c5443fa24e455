"""``raysim report RESULTS_DIR [--out DIR]``: tables, figures and privacy notes of a results folder."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    # takes its own arguments, not the run options
    p = subparsers.add_parser("report", help="write report.md/.html and summary.csv for a results folder "
                                             "(works while a sweep is running)")
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="folder with runs/, rounds/, clients/, partitions/")
    p.add_argument("--out", default=None, help="output folder (default RESULTS_DIR/report)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import build_report   # pandas/matplotlib only when the command runs
    out = build_report(args.results_dir, args.out)
    print(f"report written to {out / 'report.md'} and {out / 'report.html'} (summary: {out / 'summary.csv'})")
    return 0
