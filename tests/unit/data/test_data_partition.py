"""Partitioners and local validation splits: determinism, disjointness, skew, validation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysim.data import PARTITIONERS, partition, partition_stats, train_val_split
from raysim.rng import np_generator

# 10 balanced classes of 500, shuffled so that index order carries no label information.
LABELS = np.random.default_rng(12345).permutation(np.repeat(np.arange(10), 500))


def _rng(seed: int) -> np.random.Generator:
    return np_generator(seed, "partition")


def _check_valid(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "each client's indices must be sorted and unique"
        assert p.size == 0 or (p[0] >= 0 and p[-1] < n)
    joined = np.concatenate(parts)
    assert np.unique(joined).size == joined.size, "clients must not share indices"


@pytest.mark.parametrize("scheme", PARTITIONERS)
def test_same_seed_identical_different_seed_different(scheme: str) -> None:
    a = partition(LABELS, 10, scheme, _rng(1))
    b = partition(LABELS, 10, scheme, _rng(1))
    c = partition(LABELS, 10, scheme, _rng(2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("scheme", PARTITIONERS)
def test_disjoint_sorted_and_min_samples(scheme: str) -> None:
    parts = partition(LABELS, 10, scheme, _rng(3), min_samples_per_client=50)
    _check_valid(parts, LABELS.size, 10)
    assert min(p.size for p in parts) >= 50


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_iid_and_dirichlet_use_every_sample(scheme: str) -> None:
    parts = partition(LABELS, 7, scheme, _rng(4))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(LABELS.size))


def test_iid_sizes_are_even() -> None:
    sizes = [p.size for p in partition(LABELS, 7, "iid", _rng(5))]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == LABELS.size


def test_dirichlet_small_alpha_concentrates_large_alpha_spreads() -> None:
    def mean_top_class_share(alpha: float) -> float:
        parts = partition(LABELS, 10, "dirichlet", _rng(6), alpha=alpha, min_samples_per_client=1)
        return float(np.mean([np.bincount(LABELS[p], minlength=10).max() / p.size for p in parts]))

    # Balanced data would give 0.1 per class; alpha=0.05 puts most of a client's data in one class.
    assert mean_top_class_share(0.05) > 0.6
    assert mean_top_class_share(1000.0) < 0.15


def test_dirichlet_large_alpha_gives_each_client_about_one_nth_of_each_class() -> None:
    parts = partition(LABELS, 5, "dirichlet", _rng(7), alpha=1e5)
    counts = np.stack([np.bincount(LABELS[p], minlength=10) for p in parts])
    assert np.abs(counts - 100).max() <= 3  # 500 per class / 5 clients, up to rounding of the cuts


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_dirichlet_rejects_bad_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        partition(LABELS, 10, "dirichlet", _rng(0), alpha=alpha)


def test_dirichlet_unachievable_minimum_explains() -> None:
    with pytest.raises(ValueError, match=r"alpha=0\.01.*100 clients.*5,000 samples.*min_samples_per_client"):
        partition(LABELS, 100, "dirichlet", _rng(0), alpha=0.01, min_samples_per_client=10, max_retries=5)


def test_more_clients_than_samples() -> None:
    with pytest.raises(ValueError, match="more clients than samples"):
        partition(np.arange(5), 6, "iid", _rng(0), min_samples_per_client=0)


def test_minimum_larger_than_data_and_unknown_scheme() -> None:
    with pytest.raises(ValueError, match="min_samples_per_client"):
        partition(LABELS, 10, "iid", _rng(0), min_samples_per_client=501)
    with pytest.raises(ValueError, match="iid, dirichlet, shards"):
        partition(LABELS, 10, "pathological", _rng(0))


@pytest.mark.parametrize("num_clients,shards", [(10, 2), (7, 3), (23, 1), (4, 10)])
def test_shards_each_client_holds_at_most_its_classes_and_classes_are_dealt_evenly(num_clients: int,
                                                                                   shards: int) -> None:
    parts = partition(LABELS, num_clients, "shards", _rng(8), shards_per_client=shards,
                      min_samples_per_client=1)
    _check_valid(parts, LABELS.size, num_clients)
    holders = np.zeros(10, dtype=int)
    for p in parts:
        present = np.flatnonzero(np.bincount(LABELS[p], minlength=10))
        assert 1 <= present.size <= shards
        holders[present] += 1
    assert holders.max() - holders.min() <= 1


def test_shards_sizes_follow_sigma() -> None:
    even = [p.size for p in partition(LABELS, 10, "shards", _rng(9), shard_size_sigma=0.0)]
    # sigma=0: every client asks for 500 (250 per class, each class held twice): all data, equal sizes.
    assert even == [500] * 10
    skewed = [p.size for p in partition(LABELS, 10, "shards", _rng(9), shard_size_sigma=1.0)]
    assert max(skewed) / min(skewed) > 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shards_uses_every_sample_once(seed: int) -> None:
    parts = partition(LABELS, 10, "shards", _rng(seed), shard_size_sigma=1.0)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(LABELS.size))


def test_shards_splits_each_client_evenly_between_its_classes_when_unclipped() -> None:
    parts = partition(LABELS, 10, "shards", _rng(10), shard_size_sigma=0.0)
    for p in parts:
        counts = np.bincount(LABELS[p], minlength=10)
        assert sorted(counts[counts > 0].tolist()) == [250, 250]


def test_shards_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="shards_per_client"):
        partition(LABELS, 10, "shards", _rng(0), shards_per_client=11)
    with pytest.raises(ValueError, match="shard_size_sigma"):
        partition(LABELS, 10, "shards", _rng(0), shard_size_sigma=-0.5)


@settings(max_examples=40, deadline=None)
@given(num_clients=st.integers(1, 40), scheme=st.sampled_from(PARTITIONERS), seed=st.integers(0, 2**31),
       alpha=st.floats(0.05, 10.0), shards=st.integers(1, 4), min_samples=st.integers(0, 20))
def test_partition_properties(num_clients: int, scheme: str, seed: int, alpha: float, shards: int,
                              min_samples: int) -> None:
    labels = LABELS[:1200]
    try:
        parts = partition(labels, num_clients, scheme, _rng(seed), alpha=alpha, shards_per_client=shards,
                          min_samples_per_client=min_samples, max_retries=20)
    except ValueError as exc:  # a documented refusal is fine; anything else is a bug
        assert "min_samples_per_client" in str(exc)
        return
    _check_valid(parts, labels.size, num_clients)
    assert min(p.size for p in parts) >= min_samples


def test_train_val_split_sizes_and_determinism() -> None:
    idx = np.arange(1000, 1100, dtype=np.int64)
    train, val = train_val_split(idx, 0.1, _rng(0))
    assert (train.size, val.size) == (90, 10)
    assert np.array_equal(np.sort(np.concatenate([train, val])), idx)
    assert np.all(np.diff(train) > 0) and np.all(np.diff(val) > 0)
    again = train_val_split(idx, 0.1, _rng(0))
    other = train_val_split(idx, 0.1, _rng(1))
    assert np.array_equal(val, again[1]) and not np.array_equal(val, other[1])


@pytest.mark.parametrize("n,fraction,expected_val", [(5, 0.1, 1), (2, 0.1, 1), (1, 0.1, 0), (0, 0.1, 0),
                                                     (15, 0.1, 2), (25, 0.1, 3), (10, 0.0, 0), (3, 0.9, 2)])
def test_train_val_split_rounding(n: int, fraction: float, expected_val: int) -> None:
    train, val = train_val_split(np.arange(n), fraction, _rng(0))
    assert val.size == expected_val and train.size == n - expected_val


@pytest.mark.parametrize("fraction", [-0.1, 1.0, float("nan")])
def test_train_val_split_rejects_bad_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="val_fraction"):
        train_val_split(np.arange(10), fraction, _rng(0))


def test_partition_stats_hand_computed() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    parts = [np.array([0, 1]), np.array([2, 3, 4, 5])]
    expected = pd.DataFrame({"client_id": [0, 0, 0, 1, 1, 1], "user": [None] * 6, "label": [0, 1, 2, 0, 1, 2],
                             "count": [1, 1, 0, 0, 1, 3]})
    pd.testing.assert_frame_equal(partition_stats(labels, parts, 3), expected, check_dtype=False)
    stats = partition_stats(labels, parts, 3)
    assert all(np.issubdtype(stats[c].dtype, np.integer) for c in ("client_id", "label", "count"))
