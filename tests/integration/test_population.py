"""Populations: SCAFFOLD under partial participation with its controls spilled to files.

The driver keeps no control tensor in memory, checkpoints carry only the global model and the server's
control (whatever the number of clients that trained), the run resumes bit for bit from the files the
checkpoint names, and serial and Ray give identical tables.
"""

from __future__ import annotations

import pickle

import pandas as pd
import pytest
import torch

from raysim.experiment import prepare
from raysim.results import ResultsSink, read_table
from raysim.runtime import execute
from raysim.runtime.serial import SerialExecutor
from raysim.simulation import Simulation
from raysim.state_store import tensor_bytes
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation


TIMING = ("round_seconds", "client_train_seconds", "communication_seconds", "aggregation_seconds",
          "accounting_seconds", "eval_seconds", "client_seconds")


def _cfg(**changes):
    return tiny_config(method="scaffold", num_clients=8, clients_per_round=2, rounds=4,
                       privacy__noise_multiplier=1.0, **changes)


def _rows(records) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING}
            for rec in records for row in [rec.round_row, *rec.client_rows]]


def _tables(folder) -> tuple[pd.DataFrame, pd.DataFrame]:
    rounds = read_table(str(folder), "rounds").drop(columns=list(TIMING), errors="ignore")
    clients = read_table(str(folder), "clients").drop(columns=list(TIMING), errors="ignore")
    return (rounds.sort_values("round").reset_index(drop=True),
            clients.sort_values(["round", "client_id"]).reset_index(drop=True))


@pytest.fixture(scope="module")
def data():
    return prepare(_cfg())


def test_spilled_controls_leave_the_heap_and_resume_bit_for_bit(data, tmp_path):
    cfg = _cfg()
    train, test = data
    in_memory = list(Simulation(cfg, train, test, SerialExecutor()).run())
    sim = Simulation(cfg, train, test, SerialExecutor(), state_dir=str(tmp_path / "states"))
    records = list(sim.run())
    assert _rows(records) == _rows(in_memory)                       # spilling changes no result
    trained = {row["client_id"] for rec in records for row in rec.client_rows}
    assert len(trained) > 2 and list(sim.client_states) == sorted(trained)
    assert sim.client_states.spilled == len(trained) and sim.client_states.memory_bytes() == 0
    num_params = int(sim.weights.numel())
    for rec in records:   # global model + server control only: no client's control in any checkpoint
        assert tensor_bytes(pickle.loads(rec.checkpoint)) == 2 * 4 * num_params
    # A file released with checkpoint k (deletable once k is written) is named by neither k nor a later one.
    released: set[str] = set()
    for rec in records:
        released |= set(rec.released_state_files)
        names = set(pickle.loads(rec.checkpoint)["client_state_manifest"]["files"].values())
        assert names and names.isdisjoint(released)
    assert released
    again = Simulation(cfg, train, test, SerialExecutor(), state_dir=str(tmp_path / "states"))
    again.restore(records[1].checkpoint)
    redo = list(again.run())
    assert [r.server_round for r in redo] == [3, 4]
    assert _rows(redo) == _rows(records[2:])
    assert torch.equal(again.weights, sim.weights) and torch.equal(again.server.control, sim.server.control)
    for cid in trained:
        assert torch.equal(again.client_states.get(cid)["control"], sim.client_states.get(cid)["control"])


class Stop(Exception):
    pass


def test_interrupted_run_keeps_only_the_files_its_checkpoint_names(tmp_path):
    cfg = _cfg()
    execute(cfg, str(tmp_path / "whole"))
    folder = tmp_path / "cut"

    def stop_after_3(rec):
        if rec.server_round == 3:
            raise Stop

    with pytest.raises(Stop):
        execute(cfg, str(folder), on_round=stop_after_3)
    sink = ResultsSink(str(folder))
    run_id = read_table(str(folder), "runs")["run_id"].item()
    manifest = pickle.loads(sink.read_checkpoint(run_id))["client_state_manifest"]
    on_disk = {p.name for p in (folder / "checkpoints" / run_id / "client_states").iterdir()}
    assert manifest["memory"] == {} and on_disk == set(manifest["files"].values()) and len(on_disk) >= 3
    execute(cfg, str(folder))
    for a, b in zip(_tables(tmp_path / "whole"), _tables(folder)):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert not (folder / "checkpoints" / run_id).exists()             # a completed run keeps no state files


def test_ray_matches_serial_with_spilled_states(ray_session, tmp_path):
    execute(_cfg(), str(tmp_path / "serial"))
    execute(_cfg(runtime__executor="ray", runtime__num_actors=2), str(tmp_path / "ray"))
    for a, b in zip(_tables(tmp_path / "serial"), _tables(tmp_path / "ray")):
        assert len(a)
        pd.testing.assert_frame_equal(a, b, check_exact=True)
