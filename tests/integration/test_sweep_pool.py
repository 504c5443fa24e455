"""A sweep's warm pool: later runs borrow running actors, and their tables equal fresh runs' bit for bit."""

from __future__ import annotations

import pandas as pd
import pytest

from raysim.results import read_table
from raysim.runtime import execute, execute_row
from raysim.run_plan import plan_run
from raysim.runtime.sweep_runner import run_sweep
from tests.helpers import tiny_config

pytestmark = pytest.mark.cluster


def _tables(folder, run_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    out = []
    for name, keys in (("rounds", ["round"]), ("clients", ["round", "client_id"])):
        df = read_table(str(folder), name)
        df = df[df["run_id"] == run_id].drop(columns=[c for c in df.columns if c.endswith("_seconds")])
        out.append(df.sort_values(keys).reset_index(drop=True))
    return out[0], out[1]


def test_warm_actors_are_reused_and_results_equal_fresh_runs(ray_session, tmp_path):
    # Two kinds of run: fedsa (per-sample DP, with per-client state none) and scaffold (client state,
    # a different model-independent method) on the same data; a warm actor must forget the last run.
    configs = [tiny_config(method=m, seed=s, privacy__noise_multiplier=1.0, runtime__executor="ray",
                           runtime__num_actors=2) for m, s in (("fedsa", 0), ("scaffold", 0), ("fedsa", 1))]
    outcomes = run_sweep([plan_run(c) for c in configs], str(tmp_path / "pooled"), "pool-test", run_one=execute_row, max_concurrent=1)
    assert [o.status for o in outcomes] == ["completed"] * 3
    runs = read_table(str(tmp_path / "pooled"), "runs").set_index("run_id")
    ids = [o.run_id for o in outcomes]
    assert runs.loc[ids, "warm_actors"].tolist() == [False, True, True]
    for cfg, run_id in zip(configs, ids):
        reference = tmp_path / f"serial-{run_id}"
        execute(cfg.replace(runtime=tiny_config().runtime), str(reference))
        for got, want in zip(_tables(tmp_path / "pooled", run_id), _tables(reference, run_id)):
            assert len(got) > 0
            pd.testing.assert_frame_equal(got.drop(columns="run_id"), want.drop(columns="run_id"), check_exact=True)


def test_a_kept_pool_lends_warm_actors_to_the_next_sweep(ray_session, tmp_path):
    # The stages of a tune are sweeps in a row: the second borrows the actors the first left warm.
    from raysim.runtime.sweep_runner import KeptPool
    configs = [tiny_config(method="fedsa", seed=s, privacy__noise_multiplier=1.0, runtime__executor="ray",
                           runtime__num_actors=2) for s in (0, 1)]
    kept = KeptPool()
    try:
        first = run_sweep([plan_run(configs[0])], str(tmp_path), "stage-1", run_one=execute_row, kept_pool=kept)
        handle = kept.handle
        second = run_sweep([plan_run(configs[1])], str(tmp_path), "stage-2", run_one=execute_row, kept_pool=kept)
        assert handle is not None and kept.handle is handle
    finally:
        kept.close()
    assert kept.handle is None
    runs = read_table(str(tmp_path), "runs").set_index("run_id")
    assert runs.loc[[first[0].run_id, second[0].run_id], "warm_actors"].tolist() == [False, True]
