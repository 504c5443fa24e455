"""Evaluation: ``eval_every`` skips rounds without changing training; ``runtime.eval_on`` changes nothing but where."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from raysim.results import read_table
from raysim.runtime import execute
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation


METRICS = ["test_accuracy", "test_f1", "test_loss"]


def _rounds(folder) -> pd.DataFrame:
    df = read_table(str(folder), "rounds").sort_values("round").reset_index(drop=True)
    return df.drop(columns=[c for c in df.columns if c.endswith("_seconds")] + ["run_id"])


@pytest.fixture(scope="module")
def every_round(tmp_path_factory):
    folder = tmp_path_factory.mktemp("every")
    execute(tiny_config(method="fedsa", rounds=3, privacy__noise_multiplier=1.0), str(folder))
    return _rounds(folder)


def test_eval_every_skips_rounds_but_not_the_last(every_round, tmp_path):
    summary = execute(tiny_config(method="fedsa", rounds=3, eval_every=2, privacy__noise_multiplier=1.0), str(tmp_path))
    got = _rounds(tmp_path)
    assert got[METRICS].iloc[0].isna().all()                       # round 1: not evaluated
    pd.testing.assert_frame_equal(got[METRICS].iloc[1:], every_round[METRICS].iloc[1:], check_exact=True)
    rest = [c for c in got.columns if c not in METRICS]
    pd.testing.assert_frame_equal(got[rest], every_round[rest], check_exact=True)   # training is unchanged
    assert summary.row["final_test_accuracy"] == every_round["test_accuracy"].iloc[-1]
    assert summary.row["best_test_accuracy"] == every_round["test_accuracy"].iloc[1:].max()
    assert not math.isnan(summary.row["best_test_accuracy"])


def test_eval_on_actor_equals_driver(every_round, tmp_path):
    execute(tiny_config(method="fedsa", rounds=3, privacy__noise_multiplier=1.0, runtime__eval_on="actor"), str(tmp_path))
    pd.testing.assert_frame_equal(_rounds(tmp_path), every_round, check_exact=True)


def test_eval_on_ray_actor_equals_serial_driver(ray_session, every_round, tmp_path):
    cfg = tiny_config(method="fedsa", rounds=3, privacy__noise_multiplier=1.0, runtime__executor="ray",
                      runtime__num_actors=2, runtime__eval_on="actor")
    execute(cfg, str(tmp_path))
    pd.testing.assert_frame_equal(_rounds(tmp_path), every_round, check_exact=True)


@pytest.mark.parametrize("eval_on", ["actor", "auto"])
def test_evaluation_split_over_ray_actors_equals_serial_driver(ray_session, eval_on, tmp_path):
    """Two actors evaluate a part each (``actor``: every round; ``auto`` on CPUs: the last round, the
    driver the others), batches of 37 test images: the same metrics, bit for bit, as the driver alone."""
    base = dict(method="fedsa", rounds=3, eval_batch_size=37, privacy__noise_multiplier=1.0)
    execute(tiny_config(**base), str(tmp_path / "serial"))
    execute(tiny_config(**base, runtime__executor="ray", runtime__num_actors=2, runtime__eval_on=eval_on),
            str(tmp_path / "ray"))
    serial, ray_ = _rounds(tmp_path / "serial"), _rounds(tmp_path / "ray")
    assert serial["test_loss"].notna().all()
    pd.testing.assert_frame_equal(ray_, serial, check_exact=True)


def test_eval_every_must_be_positive():
    from raysim.config import ConfigError
    with pytest.raises(ConfigError, match="eval_every"):
        tiny_config(eval_every=0)
    with pytest.raises(ConfigError, match="runtime.eval_on"):
        tiny_config(runtime__eval_on="gpu")
