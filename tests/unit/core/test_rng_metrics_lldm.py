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
