"""A run's data set-up on the server: the public hold-out, the clients' shards, the test subsample.

Every draw here uses the data streams of the run seed (``(seed, "server-holdout")``,
``(seed, "partition")``, ``(seed, "val-split", 0, client)``, ``(seed, "test-subsample")``), never the
training streams, so replicates of one federation (``replicate``) share all of it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from raysim.config import Config, ConfigError, server_holdout_size
from raysim.data import (DATASETS, ArrayDataset, natural_partition, partition, partition_stats, to_float_tensor,
                         train_val_split)
from raysim.data.natural import row_keys
from raysim.messages import ClientData
from raysim.rng import np_generator


def server_holdout(cfg: Config, num_train: int) -> tuple[np.ndarray, np.ndarray]:
    """(public server hold-out, the rest) as sorted indices into the train split (``data.server_holdout``).

    The hold-out is drawn from the stream ``(seed, "server-holdout")`` before partitioning and belongs
    to no client; without one the rest is every index, so partitions are unchanged."""
    size = server_holdout_size(cfg)
    if size == 0:
        return np.zeros(0, dtype=np.int64), np.arange(num_train)
    if size >= num_train:
        raise ConfigError(f"data.server_holdout={size} leaves no training data ({num_train} images)")
    held = np.sort(np_generator(cfg.seed, "server-holdout").choice(num_train, size, replace=False))
    rest = np.ones(num_train, dtype=bool)
    rest[held] = False                      # a mask, not setdiff1d: that hashes every index (3 s for 3.2M rows)
    return held, np.flatnonzero(rest)


def make_partition(cfg: Config, train: ArrayDataset) -> list[ClientData]:
    """Seeded partition of the train split (less the server hold-out) into clients, each with a local
    validation split: by the labels (``data.partition``: iid, dirichlet, shards), or one client per
    natural user (``natural``, for data sets with users), whose rows are then taken in content order
    so that the clients and their examples do not depend on the order of the rows."""
    d = cfg.data
    _, pool = server_holdout(cfg, len(train.y))
    if d.partition == "natural":
        return _natural_clients(cfg, train, pool)
    if cfg.num_clients > len(pool):
        raise ConfigError(f"num_clients={cfg.num_clients} is more than the {len(pool)} training samples of {d.name}")
    parts = partition(train.y[pool], cfg.num_clients, d.partition, np_generator(cfg.seed, "partition"), alpha=d.alpha,
                      min_samples_per_client=d.min_samples_per_client, shards_per_client=d.shards_per_client,
                      shard_size_sigma=d.shard_size_sigma)
    return [_with_val(cfg, cid, pool[np.asarray(local, dtype=np.int64)]) for cid, local in enumerate(parts)]


def _with_val(cfg: Config, cid: int, idx: np.ndarray, user: str | None = None) -> ClientData:
    tr, va = train_val_split(idx, cfg.data.val_fraction, np_generator(cfg.seed, "val-split", 0, cid),
                             keep_order=user is not None)
    if len(tr) == 0:
        raise ConfigError(f"client {cid} has no training samples after the validation split; "
                          f"lower data.val_fraction or num_clients")
    return ClientData(cid, tr, va, user)


def _natural_clients(cfg: Config, train: ArrayDataset, pool: np.ndarray) -> list[ClientData]:
    d = cfg.data
    if train.users is None:
        natural = ", ".join(n for n, info in DATASETS.items() if info.natural_users)
        raise ConfigError(f"data.partition: natural needs a data set with natural users, and {d.name!r} has none; "
                          f"use iid, dirichlet or shards, or a data set with users ({natural})")
    parts, names = natural_partition(train.users[pool], train.user_names, cfg.num_clients,
                                     np_generator(cfg.seed, "partition"),
                                     lambda rows: row_keys(train.x[pool[rows]], train.y[pool[rows]]),
                                     min_samples_per_client=d.min_samples_per_client)
    clients = []
    for cid, (local, name) in enumerate(zip(parts, names)):
        if d.max_samples_per_user is not None and len(local) > d.max_samples_per_user:
            # A fixed subset for every seed, keyed by the user's name, in content order.
            rng = np.random.default_rng([zlib.crc32(name.encode("utf-8")), 0x55534552])
            local = local[np.sort(rng.choice(len(local), d.max_samples_per_user, replace=False))]
        clients.append(_with_val(cfg, cid, pool[local], name))
    return clients


def natural_test(test: ArrayDataset, clients: list[ClientData]) -> ArrayDataset:
    """The test split of a natural federation restricted to the users its clients hold (LEAF's test
    set: the held-out samples of the federation's users)."""
    if test.users is None or any(c.user is None for c in clients):
        return test
    index = {name: i for i, name in enumerate(test.user_names)}
    held = np.array([index[c.user] for c in clients if c.user in index], dtype=np.int32)
    return test.take(np.flatnonzero(np.isin(test.users, held)))


@dataclass
class RunData:
    """What the server holds of a run's data: the shards, their label counts, the test split
    (subsampled; its images uint8 until :meth:`test_x` first needs them as floats) and the public
    hold-out the server evaluates on (float tensors, or None without one)."""

    clients: list[ClientData]
    partition_stats: pd.DataFrame
    test: ArrayDataset
    test_y: torch.Tensor
    val_x: torch.Tensor | None
    val_y: torch.Tensor | None
    _test_x: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_samples(self) -> np.ndarray:
        """n_i, the clients' training-set sizes."""
        return np.array([len(c.train_indices) for c in self.clients])

    def test_x(self) -> torch.Tensor:
        """The test images normalised to float32, built when the server first evaluates them itself (a
        CIFAR-10 test split is 123 MB of floats; actors that evaluate normalise their own part)."""
        if self._test_x is None:
            self._test_x = to_float_tensor(self.test.x, self.test.info, channels_last=True)
        return self._test_x


def prepare_run_data(cfg: Config, train: ArrayDataset, test: ArrayDataset) -> RunData:
    """Hold-out, partition and test subsample of the run ``cfg``."""
    clients = make_partition(cfg, train)
    classes = train.info.num_classes
    users = [c.user for c in clients] if train.users is not None else None
    stats = pd.concat([
        partition_stats(train.y, [c.train_indices for c in clients], classes, users).assign(split="train"),
        partition_stats(train.y, [c.val_indices for c in clients], classes, users).assign(split="val")],
        ignore_index=True)
    test = natural_test(test, clients)
    if cfg.data.test_subsample is not None and cfg.data.test_subsample < len(test.y):
        keep = np.sort(np_generator(cfg.seed, "test-subsample").choice(len(test.y), cfg.data.test_subsample, replace=False))
        test = test.take(keep)
    # The public server hold-out doubles as the validation set (``val_*`` columns): the global model is
    # scored on it whenever it is scored on the test split, so tuning never needs the test split.
    held, _ = server_holdout(cfg, len(train.y))
    val_x = to_float_tensor(train.x[held], train.info) if len(held) else None
    val_y = torch.from_numpy(train.y[held].astype(np.int64)) if len(held) else None
    return RunData(clients, stats, test, torch.from_numpy(test.y.astype(np.int64)), val_x, val_y)
