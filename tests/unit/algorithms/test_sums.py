"""The float64 update sums: :func:`raysim.algorithms.flat.sum64` and the sums that workers return."""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms.base import fold_updates, sum_weight
from raysim.algorithms.flat import sum64
from raysim.messages import ClientResult
from tests.helpers import tiny_config


def _deltas(k: int = 7, n: int = 1000) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(n, generator=gen) * 10.0 ** (i - 3) for i in range(k)]


def test_sum64_is_the_exact_sum_of_widened_products_in_order():
    deltas, weights = _deltas(), [45.0, 50.0, 3.0, 1.0, 17.0, 0.1, 2.5]
    expected = np.zeros(1000)
    for d, w in zip(deltas, weights):
        expected = expected + w * d.numpy().astype(np.float64)   # NumPy's float64 arithmetic, one op at a time
    assert np.array_equal(sum64(deltas, weights).numpy(), expected)
    assert np.array_equal(sum64(deltas).numpy(), sum(d.numpy().astype(np.float64) for d in deltas) / len(deltas))


def test_sum64_a_slice_at_a_time_gives_the_same_bits(monkeypatch):
    """Summed a slice of entries at a time (the last slice shorter), each entry still gets the same adds in
    the same order: the bits of one pass per Δ, for flat and shaped updates."""
    from raysim.algorithms import flat

    deltas, weights = _deltas(), [45.0, 50.0, 3.0, 1.0, 17.0, 0.1, 2.5]
    whole = sum64(deltas, weights)
    monkeypatch.setattr(flat, "SUM_SLICE", 96)      # 1000 entries: ten slices of 96 and one of 40
    assert torch.equal(sum64(deltas, weights), whole)
    assert torch.equal(sum64([d.view(10, 100) for d in deltas], weights), whole.view(10, 100))
    assert torch.equal(sum64([d.view(100, 10).t() for d in deltas], weights), sum64([d.view(100, 10).t().contiguous()
                                                                                      for d in deltas], weights))


def test_a_sum_taken_a_few_terms_at_a_time_gives_sum64s_bits():
    """The executor folds updates into a :class:`Sum64` as they arrive, a few at a time: the same bits as
    :func:`sum64` over all of them in that order."""
    from raysim.algorithms.flat import Sum64

    deltas, weights = _deltas(), [45.0, 50.0, 3.0, 1.0, 17.0, 0.1, 2.5]
    total = Sum64(deltas[0])
    for lo, hi in ((0, 1), (1, 4), (4, 4), (4, 7)):
        total.add(deltas[lo:hi], weights[lo:hi])
    assert torch.equal(total.out, sum64(deltas, weights))
    shuffled = Sum64(deltas[0])
    shuffled.add(deltas[::-1], weights[::-1])
    assert not torch.equal(shuffled.out, total.out)   # the order is what fixes the bits


def test_fold_updates_returns_the_norms_and_the_weighted_sum_in_client_order():
    deltas = _deltas(3)
    results = [ClientResult(cid, 1, n, 5, d, 0.0, 0.0) for cid, n, d in zip((4, 1, 2), (45, 50, 40), deltas)]
    folded, total = fold_updates(tiny_config(), results)
    assert [r.client_id for r in folded] == [1, 2, 4]
    assert all(r.delta.numel() == 0 for r in folded)
    by_id = {r.client_id: r for r in results}
    assert [r.delta_norm for r in folded] == [float(by_id[c].delta.norm()) for c in (1, 2, 4)]
    assert torch.equal(total, sum64([by_id[c].delta for c in (1, 2, 4)], [50.0, 40.0, 45.0]))
    client_level = tiny_config(privacy__unit="client", privacy__noise_multiplier=1.0)
    assert sum_weight(client_level, results[0]) == 1.0 and sum_weight(tiny_config(), results[0]) == 45.0
