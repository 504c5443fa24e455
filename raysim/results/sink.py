"""Append-as-you-go Parquet sink, local folder or any pyarrow filesystem URI (s3://…).

Layout: ``<dir>/runs/<run_id>.parquet`` (one row, rewritten atomically on each status change),
``<dir>/rounds/<run_id>-r<round>.parquet`` and ``<dir>/clients/<run_id>-r<round>.parquet`` (one
file per finished round: a crash loses at most the round in flight), and
``<dir>/partitions/<run_id>.parquet``. File names are deterministic, so a redone round
overwrites rather than duplicates; ``pandas.read_parquet(dir / "rounds")`` works while runs
are going (files are written under a dot-name and renamed into place, and readers skip
dot-files).
"""

from __future__ import annotations

import itertools
import os
import posixpath
import socket
import threading
from typing import Any, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raysim.results.schema import SCHEMAS
from raysim.config import ConfigError


_TMP_COUNTER = itertools.count()


def _tmp_name(folder: str, name: str) -> str:
    """A temp file name no other writer uses: host, process, thread and a per-process counter. Two writers
    of one file (a run and the sweep recording its failure, a retried run and its lost attempt) each
    write their own temp file and rename it into place, so the final file is always one writer's whole
    file, never a mix. Readers skip dot-files."""
    token = f"{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}-{next(_TMP_COUNTER)}"
    return posixpath.join(folder, f".{name}.{token}.tmp")


def _table(name: str, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    schema = SCHEMAS[name]
    rows = list(rows)
    unknown = sorted({k for r in rows for k in r} - set(schema.names))
    if unknown:
        raise ValueError(f"{name} table has no column(s) {unknown}; a method declares the columns it logs "
                         f"(MethodSpec.client_columns / round_columns)")
    columns = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.Table.from_pydict(columns, schema=schema)


def _check_folder(fs: pafs.FileSystem, path: str, shown: str) -> None:
    """One-line error (ValueError) when ``path`` exists on ``fs`` and is not a folder."""
    if fs.get_file_info(path).type not in (pafs.FileType.Directory, pafs.FileType.NotFound):
        raise ConfigError(f"results folder {shown} is not a folder (a file of that name exists); "
                         f"pass another --results-dir")


def check_results_dir(root: str) -> None:
    """The check of :class:`ResultsSink` for a local ``--results-dir``, before any work starts."""
    if "://" not in str(root):
        _check_folder(pafs.LocalFileSystem(), os.path.abspath(root), os.path.abspath(root))


class ResultsSink:
    """Writes result rows under ``root`` (a path or a filesystem URI)."""

    def __init__(self, root: str) -> None:
        self.uri = str(root)
        self.fs, self.root = pafs.FileSystem.from_uri(root) if "://" in str(root) else (pafs.LocalFileSystem(), str(root))
        if isinstance(self.fs, pafs.LocalFileSystem):
            self.root = self.uri = os.path.abspath(self.root)
        _check_folder(self.fs, self.root, self.uri)
        try:
            for name in SCHEMAS:
                self.fs.create_dir(posixpath.join(self.root, name), recursive=True)
        except OSError as exc:
            raise ConfigError(f"results folder {self.uri}: cannot create its tables ({_first_line(exc)})") from None

    def _write(self, table_name: str, file_stem: str, rows: Iterable[Mapping[str, Any]]) -> None:
        final = posixpath.join(self.root, table_name, f"{file_stem}.parquet")
        tmp = _tmp_name(posixpath.join(self.root, table_name), f"{file_stem}.parquet")
        table = _table(table_name, rows)
        with self.fs.open_output_stream(tmp) as out:
            pq.write_table(table, out)
        self.fs.move(tmp, final)

    def write_run(self, row: Mapping[str, Any]) -> None:
        self._write("runs", row["run_id"], [row])

    def write_round(self, run_id: str, server_round: int, round_row: Mapping[str, Any], client_rows: list[Mapping[str, Any]]) -> None:
        # clients first: a rounds row implies its clients rows exist
        stem = f"{run_id}-r{server_round:05d}"
        self._write("clients", stem, [{"run_id": run_id, **r} for r in client_rows])
        self._write("rounds", stem, [{"run_id": run_id, **round_row}])

    def write_partition(self, run_id: str, stats: pd.DataFrame) -> None:
        self._write("partitions", run_id, [{"run_id": run_id, **r} for r in stats.to_dict("records")])

    def write_tuning(self, tune_id: str, rows: list[Mapping[str, Any]]) -> None:
        """A tune's table, rewritten whole (a rerun of the same tune writes the same rows)."""
        self._write("tuning", tune_id, rows)

    def read_run(self, run_id: str) -> dict[str, Any] | None:
        path = posixpath.join(self.root, "runs", f"{run_id}.parquet")
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        try:
            return pq.read_table(path, filesystem=self.fs).to_pylist()[0]
        except (pa.ArrowException, OSError, IndexError) as exc:
            raise ConfigError(f"{path}: unreadable runs file ({_first_line(exc)}); delete it to redo the run") from None

    def clear_rounds_after(self, run_id: str, server_round: int) -> None:
        """Delete a run's round and client files of rounds > ``server_round`` (a half-written round
        and anything after the checkpoint a run resumes from)."""
        for name in ("rounds", "clients"):
            selector = pafs.FileSelector(posixpath.join(self.root, name), allow_not_found=True)
            for info in self.fs.get_file_info(selector):
                base = posixpath.basename(info.path)
                if base.startswith(f"{run_id}-r") and base.endswith(".parquet"):
                    if int(base[len(run_id) + 2:-len(".parquet")]) > server_round:
                        self.fs.delete_file(info.path)

    def read_run_rounds(self, run_id: str) -> pd.DataFrame:
        """The rounds rows of one run, reading only that run's files (not the whole folder)."""
        selector = pafs.FileSelector(posixpath.join(self.root, "rounds"), allow_not_found=True)
        paths = [i.path for i in self.fs.get_file_info(selector)
                 if posixpath.basename(i.path).startswith(f"{run_id}-r") and i.path.endswith(".parquet")]
        if not paths:
            return SCHEMAS["rounds"].empty_table().to_pandas()
        return pa.concat_tables([pq.read_table(p, filesystem=self.fs, schema=SCHEMAS["rounds"])
                                 for p in sorted(paths)]).to_pandas()

    # --- checkpoints: <root>/checkpoints/<run_id>/state.pkl, atomic (write, then rename), latest only;
    # large client states (raysim.state_store) live next to it in client_states/, named by the checkpoint
    def _checkpoint_path(self, run_id: str) -> str:
        return posixpath.join(self.root, "checkpoints", run_id, "state.pkl")

    def client_state_dir(self, run_id: str) -> str:
        """Where a run spills its clients' states (a path, or a URI like the results folder's)."""
        return posixpath.join(self.uri, "checkpoints", run_id, "client_states")

    def write_checkpoint(self, run_id: str, blob: bytes) -> None:
        path = self._checkpoint_path(run_id)
        self.fs.create_dir(posixpath.dirname(path), recursive=True)
        tmp = _tmp_name(posixpath.dirname(path), "state.pkl")
        with self.fs.open_output_stream(tmp) as out:
            out.write(blob)
        self.fs.move(tmp, path)

    def read_checkpoint(self, run_id: str) -> bytes | None:
        path = self._checkpoint_path(run_id)
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def delete_checkpoint(self, run_id: str) -> None:
        """Delete a run's checkpoint and its client state files."""
        folder = posixpath.dirname(self._checkpoint_path(run_id))
        if self.fs.get_file_info(folder).type != pafs.FileType.NotFound:
            self.fs.delete_dir(folder)

    def clear_run(self, run_id: str) -> None:
        """Delete a run's round, client and partition files (before it is redone from scratch)."""
        for name in ("rounds", "clients", "partitions"):
            selector = pafs.FileSelector(posixpath.join(self.root, name), allow_not_found=True)
            for info in self.fs.get_file_info(selector):
                base = posixpath.basename(info.path)
                if base == f"{run_id}.parquet" or base.startswith(f"{run_id}-r"):
                    self.fs.delete_file(info.path)


def read_table(root: str, name: str) -> pd.DataFrame:
    """One table of a results folder as a DataFrame (empty with the right columns if none yet)."""
    if name not in SCHEMAS:
        raise ValueError(f"unknown table {name!r}; tables: {', '.join(SCHEMAS)}")
    fs, path = pafs.FileSystem.from_uri(root) if "://" in str(root) else (pafs.LocalFileSystem(), str(root))
    full = posixpath.join(str(path), name)
    info = fs.get_file_info(full)
    if info.type == pafs.FileType.NotFound or not fs.get_file_info(pafs.FileSelector(full)):
        return SCHEMAS[name].empty_table().to_pandas()
    try:
        return pq.read_table(full, filesystem=fs, schema=SCHEMAS[name]).to_pandas()
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"{_bad_file(fs, full) or full}: unreadable Parquet ({_first_line(exc)}); "
                         f"delete that file (its round is redone when the run resumes)") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _bad_file(fs: pafs.FileSystem, folder: str) -> str | None:
    """The first file under ``folder`` whose Parquet footer cannot be read (None if all can)."""
    for info in fs.get_file_info(pafs.FileSelector(folder)):
        if info.type != pafs.FileType.File or posixpath.basename(info.path).startswith("."):
            continue
        try:
            with fs.open_input_file(info.path) as f:
                pq.read_metadata(f)
        except (pa.ArrowException, OSError):
            return info.path
    return None
