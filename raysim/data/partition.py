"""Splitting a labelled dataset across simulated clients, and each client's local validation split.

Every function takes its ``np.random.Generator`` from the caller (derive it with ``raysim.rng``), so a
partition is a pure function of the labels, the arguments and the generator's state. Retries draw
from the same generator, which keeps them reproducible.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable

import numpy as np
from raysim.config import ConfigError

if TYPE_CHECKING:
    import pandas

__all__ = ["PARTITIONERS", "SCHEMES", "partition", "natural_partition", "train_val_split", "partition_stats"]

#: Schemes that cut a labelled data set into clients; ``natural`` (:func:`natural_partition`) gives
#: each client one natural user's rows instead.
PARTITIONERS = ("iid", "dirichlet", "shards")
SCHEMES = (*PARTITIONERS, "natural")


def _validate(labels: np.ndarray, num_clients: int, scheme: str, alpha: float, min_samples_per_client: int,
              shards_per_client: int, shard_size_sigma: float, max_retries: int) -> np.ndarray:
    if scheme not in PARTITIONERS:
        raise ConfigError(f"unknown partition scheme {scheme!r}; valid schemes: {', '.join(PARTITIONERS)}")
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(f"labels must be a 1-D integer array, got {labels.dtype} of shape {labels.shape}")
    n = labels.shape[0]
    if int(num_clients) < 1:
        raise ConfigError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > n:
        raise ConfigError(f"more clients than samples: {num_clients} clients for {n:,} samples")
    if min_samples_per_client < 0:
        raise ConfigError(f"min_samples_per_client must be >= 0, got {min_samples_per_client}")
    if num_clients * min_samples_per_client > n:
        raise ConfigError(
            f"{num_clients} clients x min_samples_per_client={min_samples_per_client} needs "
            f"{num_clients * min_samples_per_client:,} samples but only {n:,} exist; lower "
            f"data.min_samples_per_client or use fewer clients")
    if max_retries < 1:
        raise ConfigError(f"max_retries must be >= 1, got {max_retries}")
    if scheme == "dirichlet" and not (np.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"Dirichlet concentration alpha must be a finite number > 0, got {alpha}")
    if scheme == "shards":
        num_classes = np.unique(labels).size
        if not 1 <= shards_per_client <= num_classes:
            raise ConfigError(f"shards_per_client must be between 1 and the number of classes ({num_classes}), "
                             f"got {shards_per_client}")
        if not (np.isfinite(shard_size_sigma) and shard_size_sigma >= 0):
            raise ConfigError(f"shard_size_sigma must be a finite number >= 0, got {shard_size_sigma}")
    return labels


def _iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return list(np.array_split(rng.permutation(n), num_clients))


def _dirichlet_once(labels: np.ndarray, num_clients: int, alpha: float,
                    rng: np.random.Generator) -> list[np.ndarray]:
    buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        # Cut points from the cumulative proportions: shares sum exactly to the class size.
        cuts = np.floor(np.cumsum(proportions)[:-1] * members.size).astype(np.int64)
        for client, chunk in enumerate(np.split(members, cuts)):
            buckets[client].append(chunk)
    return [np.concatenate(b) for b in buckets]


def _assign_classes(classes: np.ndarray, num_clients: int, per_client: int,
                    rng: np.random.Generator) -> list[list[int]]:
    """Deal classes to clients from a deck of shuffled class lists, so each class is held about equally often.

    A class drawn twice for the same client is set aside and dealt first to the next client; a fresh
    shuffled copy of all classes is added whenever the deck runs out.
    """
    deck: deque[int] = deque()
    held: list[list[int]] = []
    for _ in range(num_clients):
        chosen: list[int] = []
        deferred: list[int] = []
        while len(chosen) < per_client:
            if not deck:
                deck.extend(int(c) for c in rng.permutation(classes))
            c = deck.popleft()
            (deferred if c in chosen else chosen).append(c)
        deck.extendleft(reversed(deferred))
        held.append(chosen)
    return held


def _shards_once(labels: np.ndarray, num_clients: int, per_client: int, sigma: float,
                 min_samples: int, rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(labels)
    held = _assign_classes(classes, num_clients, per_client, rng)
    pools = {int(c): rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    weights = rng.lognormal(mean=0.0, sigma=sigma, size=num_clients)
    # Each class is split among the clients holding it in proportion to their log-normal weights
    # (largest-remainder rounding), so every sample is used and sizes keep the quantity skew.
    take = [[0] * len(own) for own in held]
    used = {c: 0 for c in pools}
    for c in pools:
        holders = [(i, j) for i, own in enumerate(held) for j, cc in enumerate(own) if cc == c]
        if not holders:
            continue
        w = np.array([weights[i] for i, _ in holders])
        exact = w / w.sum() * pools[c].size
        counts = np.floor(exact).astype(int)
        for k in np.argsort(-(exact - counts), kind="stable")[: pools[c].size - counts.sum()]:
            counts[k] += 1
        for (i, j), n in zip(holders, counts):
            take[i][j] = int(n)
        used[c] = int(counts.sum())
    # Top up clients below the minimum, one sample at a time from their own class with most left over.
    for i, own in enumerate(held):
        while sum(take[i]) < min_samples:
            spare = [pools[c].size - used[c] for c in own]
            j = int(np.argmax(spare))
            if spare[j] <= 0:
                break  # own classes exhausted: the caller retries with a fresh draw
            take[i][j] += 1
            used[own[j]] += 1
    cursor = {c: 0 for c in pools}
    parts = []
    for i, own in enumerate(held):
        chunks = []
        for j, c in enumerate(own):
            chunks.append(pools[c][cursor[c]:cursor[c] + take[i][j]])
            cursor[c] += take[i][j]
        parts.append(np.concatenate(chunks))
    return parts


def partition(labels: np.ndarray, num_clients: int, scheme: str, rng: np.random.Generator, *,
              alpha: float = 0.3, min_samples_per_client: int = 10, shards_per_client: int = 2,
              shard_size_sigma: float = 1.0, max_retries: int = 100) -> list[np.ndarray]:
    """Split sample indices ``0..len(labels)-1`` across ``num_clients`` clients.

    Returns one sorted int64 index array per client; the arrays are disjoint. Every client gets at
    least ``min_samples_per_client`` samples or a ``ValueError`` explains why that is impossible.

    Schemes:

    - ``iid``: a random permutation cut into ``num_clients`` near-equal parts (all samples used).
    - ``dirichlet`` (label skew, as in Hsu et al. 2019 and flower's DirichletPartitioner): for every class,
      proportions ~ Dir(alpha · 1) over clients cut that class's shuffled indices (all samples used).
      The whole draw is repeated, up to ``max_retries`` times from the same generator, until every
      client has ``min_samples_per_client`` samples. Small alpha concentrates each client on few classes.
    - ``shards`` (reconstructed for SVHN's "grouped by class and unevenly distributed"):
      (1) classes are dealt to clients from a cycling deck of shuffled class lists, ``shards_per_client``
      distinct classes each, so every class is held about equally often; (2) client sizes are drawn as
      log-normal(0, ``shard_size_sigma``) weights normalised to sum to the number of samples; (3) each
      class is split among the clients holding it in proportion to their weights (largest-remainder
      rounding), so every sample is used; (4) if a client ends below ``min_samples_per_client`` the whole
      draw is retried (up to ``max_retries``). Sizes are therefore log-normally skewed but not exactly
      log-normal (they also depend on how many clients share each class).

    Privacy: partitioning uses labels only and happens before training; it is not a DP mechanism and
    the accountant does not (need to) cover it, since client data sets are fixed inputs of the run.
    """
    labels = _validate(labels, num_clients, scheme, alpha, min_samples_per_client, shards_per_client,
                       shard_size_sigma, max_retries)
    n = labels.shape[0]
    if scheme == "iid":
        parts = _iid(n, num_clients, rng)
        return [np.sort(p).astype(np.int64) for p in parts]

    smallest = -1
    for _ in range(max_retries):
        if scheme == "dirichlet":
            parts = _dirichlet_once(labels, num_clients, alpha, rng)
        else:
            parts = _shards_once(labels, num_clients, shards_per_client, shard_size_sigma,
                                 min_samples_per_client, rng)
        smallest = min(p.size for p in parts)
        if smallest >= min_samples_per_client:
            return [np.sort(p).astype(np.int64) for p in parts]
    knob = "raise alpha" if scheme == "dirichlet" else "lower shard_size_sigma or raise shards_per_client"
    setting = f"alpha={alpha}" if scheme == "dirichlet" else \
        f"shards_per_client={shards_per_client}, shard_size_sigma={shard_size_sigma}"
    raise ConfigError(
        f"{scheme} partition with {setting} for {num_clients} clients on {n:,} samples "
        f"({np.unique(labels).size} classes): after {max_retries} attempts some client still had fewer than "
        f"min_samples_per_client={min_samples_per_client} samples (smallest in the last attempt: {smallest}); "
        f"lower data.min_samples_per_client, {knob}, or use fewer clients")


def natural_partition(users: np.ndarray, user_names: tuple[str, ...], num_clients: int, rng: np.random.Generator,
                      row_keys: Callable[[np.ndarray], np.ndarray], *, min_samples_per_client: int = 1
                      ) -> tuple[list[np.ndarray], list[str]]:
    """One client per natural user: ``num_clients`` users drawn without replacement from those with at
    least ``min_samples_per_client`` rows (all of them when ``num_clients`` is their number), ordered
    by name; each client's rows (indices) ordered by ``row_keys(rows)``, a key of each row's content
    (:func:`raysim.data.natural.row_keys`).

    Nothing here depends on the order of the rows: shuffling them gives the same users, and each user
    the same examples in the same order. Returns (index arrays, user names).
    """
    users = np.asarray(users)
    counts = np.bincount(users, minlength=len(user_names)) if users.size else np.zeros(len(user_names), np.int64)
    eligible = [int(u) for u in np.argsort(np.asarray(user_names, dtype=object), kind="stable")
                if counts[u] >= max(min_samples_per_client, 1)]
    if num_clients > len(eligible):
        floor = f" with at least data.min_samples_per_client={min_samples_per_client} samples" \
            if min_samples_per_client > 1 else ""
        raise ConfigError(f"num_clients={num_clients} is more than the {len(eligible)} natural users{floor} "
                          f"of this data set; lower num_clients (or data.min_samples_per_client)")
    if num_clients < len(eligible):
        eligible = [eligible[i] for i in np.sort(rng.choice(len(eligible), num_clients, replace=False))]
    order = np.argsort(users, kind="stable")
    starts = np.searchsorted(users[order], np.arange(len(user_names) + 1))
    parts = []
    for u in eligible:
        rows = order[starts[u]:starts[u + 1]].astype(np.int64)
        parts.append(rows[np.argsort(row_keys(rows), kind="stable")])
    return parts, [user_names[u] for u in eligible]


def train_val_split(indices: np.ndarray, val_fraction: float,
                    rng: np.random.Generator, *, keep_order: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Split one client's indices into (train, val), both sorted int64 (with ``keep_order``: each in the
    order ``indices`` gives them, for a natural user's rows in content order).

    ``val`` gets ``round(val_fraction * n)`` indices (half rounds up), at least 1 when
    ``val_fraction > 0`` and ``n >= 2``, and never all of them. The validation split is private data of
    the client: anything computed on it and uploaded (CRA's q_i) is outside DP-SGD's guarantee unless
    privatised separately.
    """
    if not (np.isfinite(val_fraction) and 0.0 <= val_fraction < 1.0):
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction}")
    indices = np.asarray(indices, dtype=np.int64)
    n = indices.size
    n_val = int(np.floor(val_fraction * n + 0.5))
    if val_fraction > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    else:
        n_val = 0 if n < 2 else n_val
    order = rng.permutation(n)
    if keep_order:
        return indices[np.sort(order[n_val:])], indices[np.sort(order[:n_val])]
    return np.sort(indices[order[n_val:]]), np.sort(indices[order[:n_val]])


def partition_stats(labels: np.ndarray, parts: list[np.ndarray], num_classes: int,
                    users: list[str] | None = None) -> pandas.DataFrame:
    """Per-client class counts in long format: columns ``client_id``, ``user`` (the client's natural
    user, or None), ``label``, ``count`` (zeros included)."""
    import pandas as pd

    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(f"labels span {labels.min()}..{labels.max()}, outside 0..{num_classes - 1}")
    counts = np.stack([np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)
                       for p in parts]) if parts else np.zeros((0, num_classes), dtype=np.int64)
    return pd.DataFrame({
        "client_id": np.repeat(np.arange(len(parts), dtype=np.int64), num_classes),
        "user": np.repeat(np.asarray(users if users is not None else [None] * len(parts), dtype=object), num_classes),
        "label": np.tile(np.arange(num_classes, dtype=np.int64), len(parts)),
        "count": counts.reshape(-1).astype(np.int64),
    })
