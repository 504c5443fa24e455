"""pandas over raysim's Parquet results: tables, plots and reports (never imports ray)."""

from analysis.load import Results, load_results
from analysis.tables import summarise, table1, table2

__all__ = ["Results", "load_results", "summarise", "table1", "table2"]
