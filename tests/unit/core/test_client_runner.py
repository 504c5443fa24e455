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


def test_client_tensors_are_gathered_from_rows_normalised_once():
    """A task's tensors are rows of float images that the runner normalises once, when a task first
    needs them: the same bits as converting the client's own uint8 rows, x channels-last (the bk
    engine's layout), also from read-only arrays (Ray's zero-copy views) and without a warning."""
    import warnings

    from raysim.data import ArrayDataset, DatasetInfo, to_float_tensor
    info = DatasetInfo("rgb", 10, 3, 8, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8), rng.integers(0, 10, 30).astype(np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    data = ArrayDataset(x, y, info)
    train_idx, val_idx = np.array([7, 2, 29, 11]), np.array([3, 5])
    train_idx.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner = ClientRunner(tiny_config(method="fedavg"), "none", data)
        assert not runner._normalised.any()                     # nothing converted before a task needs it
        xt, yt, xv, yv = runner.tensors(ClientData(0, train_idx, val_idx))
        assert sorted(np.flatnonzero(runner._normalised.numpy())) == [2, 3, 5, 7, 11, 29]
        original = x.copy()
        x.setflags(write=True)
        x[7] = 0                                                # a row already normalised is not converted again
        x.setflags(write=False)
        again, *_ = runner.tensors(ClientData(1, np.array([29, 7, 7, 0]), np.array([], dtype=np.int64)))
    assert torch.equal(again[1], xt[0]) and torch.equal(again[2], xt[0]) and torch.equal(again[0], xt[2])
    assert torch.equal(again[3], to_float_tensor(x[[0]], info)[0]) and runner._normalised.sum() == 7
    x = original
    assert xt.is_contiguous(memory_format=torch.channels_last) and not xt.is_contiguous() and xv.is_contiguous()
    assert torch.equal(xt, to_float_tensor(x[train_idx], info)) and torch.equal(xv, to_float_tensor(x[val_idx], info))
    assert yt.tolist() == y[train_idx].tolist() and yv.tolist() == y[val_idx].tolist() and yt.dtype == torch.int64
    assert torch.equal(to_float_tensor(x, info, channels_last=True), to_float_tensor(x, info))



def test_the_delta_is_read_from_the_weights_in_place_or_gathered_when_a_parameter_moved(train, monkeypatch):
    """The parameters train as views of one flat copy of the start weights, so Δ is read from it; a
    parameter given storage of its own (a hook assigning ``p.data``) is gathered instead, the same bits.
    The client sends ‖Δ‖ (``delta_norm``), so the server reads Δ neither to check it nor to log it."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from raysim.algorithms.base import ClientHooks
    from raysim.client import _tiles

    cfg = tiny_config(method="fedavg")
    in_place = _run(ClientRunner(cfg, "none", train), sigma=0.0)
    finalize = ClientHooks.finalize

    def moved(self, params, num_steps):
        params[0].data = params[0].data.clone()     # no longer a view of the flat weights
        return finalize(self, params, num_steps)
    monkeypatch.setattr(ClientHooks, "finalize", moved)
    runner = ClientRunner(cfg, "none", train)
    assert type(runner.spec.client(cfg, None, None)).finalize is moved
    gathered = _run(runner, sigma=0.0)
    assert torch.equal(in_place.delta, gathered.delta) and in_place.delta.abs().sum() > 0
    assert in_place.delta_norm == gathered.delta_norm == float(in_place.delta.norm())

    w = torch.zeros(count_parameters(runner.model))
    vector_to_parameters(w, runner.model.parameters())
    params = list(runner.model.parameters())
    assert _tiles(w, params) and not _tiles(w.clone(), params)
    params[1].data = params[1].data.clone()
    assert not _tiles(w, params) and torch.equal(parameters_to_vector(params), w)
