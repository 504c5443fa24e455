"""Same seed ⇒ bitwise-identical rounds/clients tables, serial vs Ray with 1, 2 and 10 actors."""

from __future__ import annotations

import pandas as pd
import pytest

from raysim.runtime import execute
from raysim.results import read_table
from tests.helpers import tiny_config

pytestmark = pytest.mark.integration

TIMING = [c for c in ("round_seconds", "client_train_seconds", "communication_seconds", "aggregation_seconds",
                      "accounting_seconds", "eval_seconds", "client_seconds")]


def _tables(folder) -> tuple[pd.DataFrame, pd.DataFrame]:
    rounds = read_table(str(folder), "rounds").drop(columns=TIMING, errors="ignore")
    clients = read_table(str(folder), "clients").drop(columns=TIMING, errors="ignore")
    return (rounds.sort_values(["run_id", "round"]).reset_index(drop=True),
            clients.sort_values(["run_id", "round", "client_id"]).reset_index(drop=True))


@pytest.fixture(scope="module")
def serial_tables(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serial")
    execute(tiny_config(num_clients=10, method="fedsa", privacy__noise_multiplier=1.0), str(folder))
    return _tables(folder)


@pytest.mark.parametrize("num_actors", [1, 3])
def test_ray_matches_serial_bitwise(ray_session, serial_tables, tmp_path, num_actors):
    cfg = tiny_config(num_clients=10, method="fedsa", privacy__noise_multiplier=1.0,
                      runtime__executor="ray", runtime__num_actors=num_actors)
    execute(cfg, str(tmp_path))
    rounds, clients = _tables(tmp_path)
    assert len(rounds) == 2 and len(clients) == 20
    pd.testing.assert_frame_equal(rounds, serial_tables[0], check_exact=True)
    pd.testing.assert_frame_equal(clients, serial_tables[1], check_exact=True)


def test_different_seed_differs(serial_tables, tmp_path):
    execute(tiny_config(num_clients=10, method="fedsa", privacy__noise_multiplier=1.0, seed=1), str(tmp_path))
    rounds, _ = _tables(tmp_path)
    assert not rounds["test_loss"].equals(serial_tables[0]["test_loss"])
