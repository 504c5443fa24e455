"""A client actor killed mid-run is restarted, its task retried, and the tables do not change."""

from __future__ import annotations

import threading

import pandas as pd
import pytest

from raysim.runtime import execute
from raysim.results import read_table
from tests.helpers import tiny_config

pytestmark = pytest.mark.cluster   # kills actors: make test-cluster


def _tables(folder) -> tuple[pd.DataFrame, pd.DataFrame]:
    out = []
    for name, keys in (("rounds", ["round"]), ("clients", ["round", "client_id"])):
        df = read_table(str(folder), name)
        df = df.drop(columns=[c for c in df.columns if c.endswith("_seconds")])
        out.append(df.sort_values(keys).reset_index(drop=True))
    return out[0], out[1]


def test_killed_client_actor_is_restarted_and_results_are_unchanged(ray_session, tmp_path, monkeypatch):
    import ray
    import raysim.runtime.driver as driver_module

    # DP-SGD with 3 local epochs: each round takes long enough that round 2 is in flight at the kill.
    settings = dict(method="fedsa", privacy__noise_multiplier=1.0, rounds=3, local_epochs=3)
    execute(tiny_config(**settings), str(tmp_path / "undisturbed"))   # serial: bitwise = Ray (test_determinism)

    seen: dict[str, object] = {}
    real_ray_rounds = driver_module.ray_rounds

    def capturing_ray_rounds(*args, **kwargs):
        setup, records, driver, warm = real_ray_rounds(*args, **kwargs)
        # The driver serves one call at a time: ask for its actors before the round stream starts.
        seen["actors"] = ray.get(driver.client_actors.remote())
        seen["pids_before"] = ray.get([a.where.remote() for a in seen["actors"]])
        return setup, records, driver, warm

    monkeypatch.setattr(driver_module, "ray_rounds", capturing_ray_rounds)

    def on_round(rec):
        # The driver's stream runs ahead: when round 1 arrives here, round 2's tasks are running.
        if rec.server_round == 1:
            killer = threading.Thread(target=ray.kill, args=(seen["actors"][1],), kwargs={"no_restart": False})
            killer.start()
            killer.join()
        if rec.server_round == 3:
            seen["pids_after"] = ray.get([a.where.remote() for a in seen["actors"]])

    cfg = tiny_config(**settings, runtime__executor="ray", runtime__num_actors=2)
    summary = execute(cfg, str(tmp_path / "killed"), on_round=on_round)

    assert summary.row["status"] == "completed" and summary.row["rounds_completed"] == 3
    before, after = seen["pids_before"], seen["pids_after"]
    assert after[0]["pid"] == before[0]["pid"]            # the other actor was untouched
    assert after[1]["pid"] != before[1]["pid"]            # the killed one is a new process…
    assert after[1]["clients"]                            # …that took tasks again after its restart
    for got, want in zip(_tables(tmp_path / "killed"), _tables(tmp_path / "undisturbed")):
        assert len(got) > 0
        pd.testing.assert_frame_equal(got, want, check_exact=True)
