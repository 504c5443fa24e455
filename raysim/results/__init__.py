"""Parquet results: runs/, rounds/, clients/ and partitions/ datasets under one folder."""

from raysim.results.schema import SCHEMAS, TABLES
from raysim.results.sink import ResultsSink, read_table

__all__ = ["SCHEMAS", "TABLES", "ResultsSink", "read_table"]
