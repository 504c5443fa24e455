"""raysim.client.ClientRunner: one round of one client on the digits data, in this process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.client import ClientRunner
from raysim.data import load_dataset
from raysim.messages import ClientData, ClientTask, RoundPayload
from raysim.models import count_parameters, model_for
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def train():
    return load_dataset("digits", "train", None)


def _run(runner: ClientRunner, cid: int = 1, sigma: float = 1.0):
    w = torch.linspace(-0.1, 0.1, count_parameters(runner.model))      # the broadcast start weights
    shard = ClientData(cid, np.arange(40 * cid, 40 * cid + 40), np.arange(1000, 1010))
    return runner.train(RoundPayload(1, w, w), ClientTask(cid, 1, 1.0, sigma), shard)


def test_a_round_returns_a_model_sized_delta_and_the_declared_uploads(train):
    cfg = tiny_config(method="feddimdp", privacy__noise_multiplier=1.0)
    runner = ClientRunner(cfg, "per_sample", train)
    result = _run(runner)
    assert result.client_id == 1 and result.num_samples == 40 and result.num_steps == 2   # ⌈40/32⌉
    assert result.delta.shape == (count_parameters(runner.model),) and torch.isfinite(result.delta).all()
    assert result.delta.device.type == "cpu" and result.delta.abs().sum() > 0
    declared = {u.name for u in runner.uploads if u.release.kind != "diagnostic"}
    assert set(result.uploads) == declared and declared                 # FedDimDP uploads its histogram and q_i
    assert set(result.diagnostics) == {u.name for u in runner.uploads if u.release.kind == "diagnostic"}


def test_the_same_task_gives_the_same_bits_on_a_fresh_runner(train):
    cfg = tiny_config(method="fedsa", privacy__noise_multiplier=1.0)
    a = _run(ClientRunner(cfg, "per_sample", train))
    b = _run(ClientRunner(cfg, "per_sample", train))
    assert torch.equal(a.delta, b.delta) and a.train_loss == b.train_loss


def test_a_shard_of_another_client_is_refused(train):
    runner = ClientRunner(tiny_config(), "none", train)
    w = torch.cat([p.detach().flatten() for p in runner.model.parameters()])
    with pytest.raises(ValueError, match="task for client 2 came with the shard of client 1"):
        runner.train(RoundPayload(1, w, w), ClientTask(2, 1, 1.0, 0.0), ClientData(1, np.arange(10), np.arange(0)))


def test_configure_retargets_the_runner_at_another_run(train):
    runner = ClientRunner(tiny_config(), "none", train)
    assert runner.uploads == ()
    cfg = tiny_config(method="feddimdp", privacy__noise_multiplier=1.0)
    runner.configure(cfg, "per_sample")
    expected = model_for(cfg, train.info, {"lldm": True})
    assert count_parameters(runner.model) == count_parameters(expected) and runner.uploads
