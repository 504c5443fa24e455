from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score

from raysim.metrics import macro_f1
from raysim.models import build_model
from raysim.models.lldm import TopKGradSparsifier
from raysim.rng import np_generator, torch_generator


def test_streams_are_keyed_and_reproducible():
    a = np_generator(0, "batches", 3, 2).random(5)
    assert np.array_equal(a, np_generator(0, "batches", 3, 2).random(5))
    for other in (np_generator(1, "batches", 3, 2), np_generator(0, "noise", 3, 2),
                  np_generator(0, "batches", 4, 2), np_generator(0, "batches", 3, 1)):
        assert not np.array_equal(a, other.random(5))
    t = torch.randn(4, generator=torch_generator(0, "dp-noise", 1, 0, 7))
    torch.manual_seed(123)  # the global RNG must not matter
    assert torch.equal(t, torch.randn(4, generator=torch_generator(0, "dp-noise", 1, 0, 7)))


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 7, 200)
    p = np.where(rng.random(200) < 0.5, y, rng.integers(0, 10, 200))
    assert macro_f1(y, p, 10) == pytest.approx(f1_score(y, p, average="macro"), abs=1e-12)


@pytest.mark.parametrize("kappa", [0.5, 0.25, 0.9])
def test_lldm_backward_keeps_exactly_ceil_kappa_d_per_example(kappa):
    x = torch.randn(6, 8, 4, 4, requires_grad=True)
    out = TopKGradSparsifier(kappa)(x)
    assert torch.equal(out, x)  # identity forward
    upstream = torch.randn_like(x)
    out.backward(upstream)
    d = 8 * 4 * 4
    k = math.ceil(kappa * d)
    grad = x.grad.reshape(6, -1)
    assert ((grad != 0).sum(dim=1) == k).all()
    # the kept entries are the largest in magnitude, unchanged
    up = upstream.reshape(6, -1)
    for i in range(6):
        top = up[i].abs().topk(k).indices
        assert torch.equal(grad[i, top], up[i, top])


def test_cnn_shapes_follow_input():
    for channels, size in ((3, 32), (1, 8), (3, 96)):
        model = build_model(channels, size, 10, lldm=True)
        assert model(torch.zeros(2, channels, size, size)).shape == (2, 10)
    plain, lldm = build_model(3, 32, 10), build_model(3, 32, 10, lldm=True)
    assert lldm.fc1.in_features == plain.fc1.in_features // 2   # LLDM halves the first FC layer


def _batch_by_batch(model, x, y, batch_size, layout):
    """Each batch in one forward pass, in ``layout``: what eval_batches must give, chunks or not."""
    losses, preds = [], []
    with torch.no_grad():
        for lo in range(0, len(y), batch_size):
            logits = model(layout(x[lo:lo + batch_size]))
            losses.append(float(torch.nn.functional.cross_entropy(logits, y[lo:lo + batch_size], reduction="sum")))
            preds.append(logits.argmax(dim=1))
    return losses, torch.cat(preds)


def test_eval_batches_in_chunks_keep_each_batch_bits():
    from raysim import metrics
    torch.manual_seed(0)
    model = build_model(3, 32, 10)
    batch = metrics.EVAL_CHUNK + 50   # a chunk and a part of one
    n = 2 * batch + 30                # and a short last batch
    x, y = torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses, preds = metrics.eval_batches(model, x, y, batch)
        want_losses, want_preds = _batch_by_batch(model, x, y, batch, metrics.channels_last)
    finally:
        torch.set_num_threads(threads)
    assert losses == want_losses and torch.equal(preds, want_preds)
    assert len(losses) == 3 and model.training


class _Viewing(torch.nn.Module):
    """A model that .view()s its input, which a channels-last batch cannot be."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(x.view(x.shape[0], -1))


def test_eval_batches_run_a_model_that_needs_nchw_as_given():
    from raysim import metrics
    torch.manual_seed(1)
    model = _Viewing()
    x, y = torch.randn(300, 3, 4, 4), torch.randint(0, 5, (300,))
    with pytest.raises(RuntimeError):
        model(metrics.channels_last(x))
    losses, preds = metrics.eval_batches(model, x, y, 200)
    want_losses, want_preds = _batch_by_batch(model, x, y, 200, lambda rows: rows)
    assert losses == want_losses and torch.equal(preds, want_preds)
