"""How a folded round's share is cut into calls (raysim.runtime.ray_executor.fold_chunks)."""

from __future__ import annotations

import pytest

from raysim.runtime.ray_executor import fold_chunks


@pytest.mark.parametrize("n, sizes", [(1, [1]), (6, [2, 2, 1, 1]), (25, [9, 6, 4, 2, 2, 1, 1]),
                                      (100, [34, 22, 15, 10, 7, 4, 3, 2, 1, 1, 1])])
def test_calls_shrink_to_single_clients_and_keep_the_order(n, sizes):
    share = [7 * j for j in range(n)]
    parts = fold_chunks(share, 3)
    assert [len(p) for p in parts] == sizes
    assert [j for p in parts for j in p] == share


def test_an_empty_share_makes_no_call():
    assert fold_chunks([], 3) == []
