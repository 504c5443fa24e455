"""What several commands share: the run options and the summary table printer."""

from __future__ import annotations

import argparse
import math
from typing import Any, Mapping, Sequence

__all__ = ["add_run_options", "format_cell", "print_table"]


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that runs experiments (``run``, ``sweep``)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set data.alpha=0.1 (repeatable)")
    parser.add_argument("--results-dir", default="./results", help="where the Parquet tables go (default ./results)")
    parser.add_argument("--data-root", default=None, help="folder holding cifar10/, svhn/, stl10/ (sets data.root)")
    parser.add_argument("--address", default=None, help="join an existing Ray cluster (sets runtime.address)")
    parser.add_argument("--restart", action="store_true",
                        help="start interrupted or failed runs from scratch instead of resuming them from their checkpoint")


def format_cell(value: Any) -> str:
    """A table cell: floats with 4 decimals, ∞ for infinity, blank for NaN and None."""
    if isinstance(value, float):
        return "∞" if math.isinf(value) else ("" if math.isnan(value) else f"{value:.4f}")
    return "" if value is None else str(value)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """Print ``rows`` as left-aligned columns; ``columns`` are ``(row key, header)`` pairs."""
    table = [[format_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(header), *(len(cells[i]) for cells in table)) for i, (_, header) in enumerate(columns)]
    print("  ".join(header.ljust(w) for (_, header), w in zip(columns, widths)))
    for cells in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(cells, widths)))
