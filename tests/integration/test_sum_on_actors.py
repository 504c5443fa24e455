"""``runtime.sum_on_actors``: each actor returns the weighted sum of its clients' updates.

The aggregate is the same rule rounded differently (float64 sums grouped by actor, the step divided by
Σ n_j once), so after a round the global weights stay within one float32 rounding of the step (and one
of the sum) of the per-update aggregation;
with one actor the grouping is the serial executor's, bit for bit.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from raysim.config import ConfigError
from raysim.data import load_dataset
from raysim.run_plan import plan_run
from raysim.runtime.ray_executor import RayExecutor
from raysim.runtime.serial import SerialExecutor
from raysim.simulation import Simulation
from tests.helpers import tiny_config

pytestmark = pytest.mark.simulation

TIMING = ("round_seconds", "client_train_seconds", "communication_seconds", "aggregation_seconds",
          "accounting_seconds", "eval_seconds", "client_seconds")


def _run(cfg, executor):
    """(the initial weights, [(round row, client rows, weights after the round)])."""
    train, test = load_dataset("digits", "train", None), load_dataset("digits", "test", None)
    sim = Simulation(cfg, train, test, executor)
    start = sim.weights.clone()
    try:
        return start, [(rec.round_row, rec.client_rows, pickle.loads(rec.checkpoint)["weights"]) for rec in sim.run()]
    finally:
        executor.shutdown()


def _untimed(row):
    return {k: v for k, v in row.items() if k not in TIMING}


def _within_one_rounding(start: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Elementwise, ``a`` and ``b`` (weights after one aggregation from ``start``) differ by at most one
    float32 rounding of the step plus one of the sum: |a − b| ≤ spacing(|step|) + spacing(|w|)."""
    start, a, b = start.numpy(), a.numpy(), b.numpy()
    step = np.maximum(np.abs(a - start), np.abs(b - start))
    return bool(np.all(np.abs(a - b) <= np.spacing(step) + np.spacing(np.maximum(np.abs(a), np.abs(b)))))


def _config(executor: str, summed: bool, **extra):
    return tiny_config(method="fedsa", num_clients=10, rounds=3, privacy__noise_multiplier=1.0,
                       runtime__checkpoint_every=1, runtime__executor=executor, runtime__sum_on_actors=summed, **extra)


@pytest.fixture(scope="module")
def per_update():
    return _run(_config("serial", False), SerialExecutor())


def test_actor_sums_stay_within_one_rounding_of_per_update_sums(ray_session, per_update):
    start, summed = _run(_config("ray", True, runtime__num_actors=3), RayExecutor())
    assert torch.equal(start, per_update[0])
    per_update = per_update[1]
    (_, c1, w1), (_, d1, v1) = per_update[0], summed[0]
    # Round 1: the clients train from the same weights, so their rows (‖Δ‖ included) are the same bits;
    # only the server's sum is rounded differently.
    assert [_untimed(c) for c in c1] == [_untimed(c) for c in d1]
    assert _within_one_rounding(start, w1, v1)
    for (rr, _, _), (sr, _, _) in zip(per_update, summed):
        assert sr["test_loss"] == pytest.approx(rr["test_loss"], rel=1e-4)
        assert sr["mean_train_loss"] == pytest.approx(rr["mean_train_loss"], rel=1e-4)


def test_one_actor_sums_as_the_serial_executor_does(ray_session):
    serial = _run(_config("serial", True), SerialExecutor())[1]
    ray_one = _run(_config("ray", True, runtime__num_actors=1), RayExecutor())[1]
    for (rs, cs, ws), (rr, cr, wr) in zip(serial, ray_one):
        assert _untimed(rs) == _untimed(rr)
        assert [_untimed(c) for c in cs] == [_untimed(c) for c in cr]
        assert torch.equal(ws, wr)


def test_client_level_sums_on_actors(ray_session):
    base = dict(method="fedavg", num_clients=10, rounds=2, runtime__checkpoint_every=1, privacy__unit="client",
                privacy__noise_multiplier=1.0, privacy__clip_norm=0.5)
    start, per = _run(tiny_config(**base), SerialExecutor())
    _, summed = _run(tiny_config(**base, runtime__executor="ray", runtime__num_actors=2, runtime__sum_on_actors=True),
                     RayExecutor())
    assert [_untimed(c) for c in per[0][1]] == [_untimed(c) for c in summed[0][1]]
    assert _within_one_rounding(start, per[0][2], summed[0][2])


def test_a_server_that_reads_each_update_refuses_it():
    with pytest.raises(ConfigError, match="runtime.sum_on_actors.*feddimdp.*methods that can: .*fedavg"):
        plan_run(tiny_config(method="feddimdp", privacy__noise_multiplier=1.0, runtime__sum_on_actors=True))


def test_summing_runs_wait_for_ray_instead_of_a_head_start(monkeypatch):
    import ray

    from raysim.runtime import head_starts
    from raysim.runtime.sweep_runner import first_run_head_starts
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)   # as in a fresh `raysim run` process
    for summed in (False, True):
        cfg = tiny_config(runtime__executor="ray", runtime__sum_on_actors=summed)
        assert head_starts(cfg) is not summed
        assert first_run_head_starts(cfg, None) is not summed


@pytest.mark.parametrize("mechanism", ["gaussian", "tree", "blt", "bandmf"])
def test_client_level_releases_from_the_sum_in_one_process(mechanism):
    """Under privacy.unit=client (DP-FedAvg, DP-FTRL, BLT, BandMF) the serial executor's one sum gives the
    release within one rounding of the per-update sum, the noise being the same draws."""
    base = dict(method="fedavg", num_clients=8, clients_per_round=3, rounds=2,
                participation={"tree": "shuffle", "gaussian": "uniform"}.get(mechanism, "poisson"),
                runtime__checkpoint_every=1, privacy__unit="client", privacy__mechanism=mechanism,
                privacy__accountant="rdp", privacy__noise_multiplier=1.0, privacy__clip_norm=0.5)
    start, per = _run(tiny_config(**base), SerialExecutor())
    _, summed = _run(tiny_config(**base, runtime__sum_on_actors=True), SerialExecutor())
    assert [_untimed(c) for c in per[0][1]] == [_untimed(c) for c in summed[0][1]]
    assert _within_one_rounding(start, per[0][2], summed[0][2])
