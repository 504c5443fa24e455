"""The contract every registered method keeps (after dp_accounting's accountant contract tests).

Parametrised over the registry, so a new method gets this coverage by registering:

* its declared DP releases per step (``releases_for``) are the releases its client hooks make (for
  DP-FedSAM, ``sam.mode=both`` is covered by tests/unit/algorithms/test_baselines.py);
* its declared uploads are what its clients send, and every logged key is in the results schema;
* the same seed gives identical tables, another seed different ones;
* a 2-round run with σ calibrated to ε = 8 completes within the target.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raysim.algorithms.uploads import uncovered_keys
from raysim.privacy.plan import not_covered, resolve_clipping

import raysim.training as training
from raysim.algorithms.registry import all_methods, get_method, resolve_preset
from raysim.config import config_from_dict
from raysim.results import read_table
from raysim.results.schema import SCHEMAS
from raysim.runtime import execute

pytestmark = pytest.mark.simulation

METHODS = [spec.name for spec in all_methods()]


def tiny(method: str, seed: int, rounds: int = 1, privacy: dict | None = None, partition: str = "dirichlet"):
    """3 clients on 600 training images, 1 round, σ given (no calibration): for the determinism and
    release checks."""
    return config_from_dict({"method": method, "rounds": rounds, "seed": seed, "num_clients": 3, "batch_size": 32,
                             "lr": 0.05, "privacy": privacy or {"noise_multiplier": 1.0},
                             "data": {"name": "digits", "partition": partition, "alpha": 0.5,
                                      "min_samples_per_client": 20, "train_subsample": 600, "test_subsample": 100},
                             "runtime": {"executor": "serial"}})


def calibrated(method: str):
    """The tiny run for 2 rounds with σ calibrated to ε = 8 (non-private methods too, made DP), on an IID
    partition: its clients (200 images each) share one calibration (each calibration costs seconds)."""
    return tiny(method, 0, rounds=2, privacy={"epsilon": 8.0}, partition="iid")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per method: a 2-round run (σ calibrated to ε = 8), and tiny runs with seeds 0, 0, 1
    during which every call of the privatisation step (one DP release) is counted."""
    out = {}
    for method in METHODS:
        folder = tmp_path_factory.mktemp(method)
        execute(calibrated(method), str(folder / "calibrated"))
        counts = []
        real = training.privatize

        def counting(*args, **kwargs):
            counts.append(1)
            return real(*args, **kwargs)

        training.privatize = counting
        try:
            ids = [execute(tiny(method, seed), str(folder / f"r{i}")).run_id for i, seed in enumerate((0, 0, 1))]
        finally:
            training.privatize = real

        def tables(name: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
            return tuple(read_table(str(folder / name), t) for t in ("rounds", "clients", "runs"))

        out[method] = {"ids": ids, "calibrated": tables("calibrated"),
                       "tiny": [tables(f"r{i}") for i in range(3)], "releases": len(counts)}
    return out


@pytest.mark.parametrize("method", METHODS)
def test_declared_releases_are_the_releases_made(runs, method):
    spec = get_method(method)
    cfg = resolve_preset(tiny(method, 0))
    steps = sum(int(clients["num_steps"].sum()) for _, clients, _ in runs[method]["tiny"])
    assert steps > 0
    assert runs[method]["releases"] == spec.client.releases_for(cfg) * steps


@pytest.mark.parametrize("method", METHODS)
def test_declared_uploads_reach_the_server_and_the_schema(runs, method):
    spec = get_method(method)
    cfg = resolve_preset(calibrated(method))
    uploads = spec.uploads(cfg)
    names = [u.name for u in uploads]
    assert len(names) == len(set(names)), "upload names must be unique"
    for u in uploads:
        assert set(u.columns) <= set(SCHEMAS['clients'].names), f"{u.name}: columns {u.columns} not in the clients schema"
    rounds, clients, runs_row = runs[method]["calibrated"]
    assert set(rounds.columns) <= set(SCHEMAS['rounds'].names) and set(clients.columns) <= set(SCHEMAS['clients'].names)
    for u in uploads:
        for col in u.columns:          # what an upload is logged under is actually logged
            assert clients[col].notna().all(), f"{method}: {col} not logged"
    text = runs_row["not_covered_by_epsilon"].item()
    for u in uploads:
        if u.release.kind in ("not_covered", "diagnostic"):
            assert u.name in text
        elif u.release.kind == "gaussian":
            assert u.name not in text


@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_tables_other_seed_differs(runs, method):
    (r0, c0, _), (r1, c1, _), (r2, c2, _) = runs[method]["tiny"]
    ids = runs[method]["ids"]
    assert ids[0] == ids[1] != ids[2]
    timing = [c for c in r0.columns if c.endswith("_seconds")] + ["run_id"]
    pd.testing.assert_frame_equal(r0.drop(columns=timing), r1.drop(columns=timing))
    ctiming = [c for c in c0.columns if c.endswith("_seconds")] + ["run_id"]
    pd.testing.assert_frame_equal(c0.drop(columns=ctiming), c1.drop(columns=ctiming))
    assert not np.array_equal(r0["test_loss"].to_numpy(), r2["test_loss"].to_numpy())


@pytest.mark.parametrize("method", METHODS)
def test_calibrated_run_completes_within_the_target(runs, method):
    rounds, clients, row = runs[method]["calibrated"]
    assert row["status"].item() == "completed" and row["rounds_completed"].item() == 2
    assert list(rounds["round"]) == [1, 2] and np.isfinite(rounds["test_accuracy"]).all()
    if row["clipping"].item() != "none":
        assert row["epsilon"].item() <= 8.0 + 1e-9 and (clients["epsilon"] <= 8.0 + 1e-9).all()
    else:
        assert get_method(method).private is False


@pytest.mark.parametrize("method", METHODS)
def test_no_default_config_uploads_private_data_outside_epsilon(method):
    # Private by default: with every method section at its defaults, each upload computed from private data
    # is noised and accounted (gaussian) or computed from DP outputs and public values (post-processing);
    # what ε leaves out is only what the simulation logs and never uploads. Such a run is not refused.
    spec = get_method(method)
    cfg = resolve_preset(calibrated(method))
    clipping = resolve_clipping(spec, cfg)
    uncovered = [u.name for u in spec.uploads(cfg) if u.release.kind == "not_covered"]
    assert uncovered == [] and uncovered_keys(spec.uploads(cfg), clipping, cfg.privacy.unit) == ()
    text = not_covered(spec, cfg, clipping)
    if clipping != "none":
        assert "uploaded without noise" not in text and text.startswith("logged by the simulation only, never uploaded")
