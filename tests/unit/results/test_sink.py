"""ResultsSink on a local folder: schema checks, round files and their deletion."""

from __future__ import annotations

import pandas as pd
import pytest

from raysim.results import ResultsSink, read_table


def _round(sink: ResultsSink, run_id: str, t: int) -> None:
    sink.write_round(run_id, t, {"round": t, "test_accuracy": 0.1 * t},
                     [{"round": t, "client_id": c, "num_samples": 10} for c in range(2)])


def test_a_row_with_an_unknown_column_is_refused_and_nothing_is_written(tmp_path):
    sink = ResultsSink(str(tmp_path))
    with pytest.raises(ValueError, match=r"rounds table has no column\(s\) \['not_a_column'\]"):
        sink.write_round("r", 1, {"round": 1, "not_a_column": 1.0}, [])
    assert list((tmp_path / "rounds").iterdir()) == []


def test_round_files_read_back_with_the_full_schema(tmp_path):
    sink = ResultsSink(str(tmp_path))
    _round(sink, "a", 1)
    rounds = read_table(str(tmp_path), "rounds")
    clients = read_table(str(tmp_path), "clients")
    assert list(rounds["round"]) == [1] and rounds["test_loss"].isna().all()   # unlogged columns are null
    assert list(clients["client_id"]) == [0, 1] and (clients["run_id"] == "a").all()
    assert not any(p.name.startswith(".") for p in (tmp_path / "rounds").iterdir())   # temp files renamed away


def test_clear_rounds_after_deletes_only_later_rounds_of_that_run(tmp_path):
    sink = ResultsSink(str(tmp_path))
    for t in (1, 2, 3):
        _round(sink, "a", t)
    _round(sink, "a-b", 3)            # another run whose id starts with the same text
    _round(sink, "b", 3)
    sink.clear_rounds_after("a", 1)
    rounds = read_table(str(tmp_path), "rounds")
    kept = sorted(zip(rounds["run_id"], rounds["round"]))
    assert kept == [("a", 1), ("a-b", 3), ("b", 3)]
    clients = read_table(str(tmp_path), "clients")
    assert sorted(set(zip(clients["run_id"], clients["round"]))) == kept
    assert list(sink.read_run_rounds("a")["round"]) == [1]


def test_a_redone_round_overwrites_its_file(tmp_path):
    sink = ResultsSink(str(tmp_path))
    _round(sink, "a", 1)
    sink.write_round("a", 1, {"round": 1, "test_accuracy": 0.5}, [])
    rounds = read_table(str(tmp_path), "rounds")
    assert len(rounds) == 1 and rounds["test_accuracy"].item() == 0.5


def test_run_rows_and_checkpoints_round_trip(tmp_path):
    sink = ResultsSink(str(tmp_path))
    assert sink.read_run("x") is None and sink.read_checkpoint("x") is None
    sink.write_run({"run_id": "x", "status": "running", "rounds_completed": 2})
    assert sink.read_run("x")["status"] == "running"
    sink.write_checkpoint("x", b"blob")
    assert sink.read_checkpoint("x") == b"blob"
    sink.delete_checkpoint("x")
    assert sink.read_checkpoint("x") is None
    runs = read_table(str(tmp_path), "runs")
    assert isinstance(runs, pd.DataFrame) and runs["rounds_completed"].item() == 2
