"""A run's data set-up on the server: the public hold-out, the clients' shards, the test subsample.

Every draw here uses the data streams of the run seed (``(seed, "server-holdout")``,
``(seed, "partition")``, ``(seed, "val-split", 0, client)``, ``(seed, "test-subsample")``), never the
training streams, so replicates of one federation (``replicate``) share all of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from raysim.config import Config, ConfigError, server_holdout_size
from raysim.data import ArrayDataset, partition, partition_stats, to_float_tensor, train_val_split
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
    return held, np.setdiff1d(np.arange(num_train), held)


def make_partition(cfg: Config, labels: np.ndarray) -> list[ClientData]:
    """Seeded partition of the train labels (less the server hold-out) into clients, each with a local
    validation split."""
    d = cfg.data
    _, pool = server_holdout(cfg, len(labels))
    if cfg.num_clients > len(pool):
        raise ConfigError(f"num_clients={cfg.num_clients} is more than the {len(pool)} training samples of {d.name}")
    parts = partition(labels[pool], cfg.num_clients, d.partition, np_generator(cfg.seed, "partition"), alpha=d.alpha,
                      min_samples_per_client=d.min_samples_per_client, shards_per_client=d.shards_per_client,
                      shard_size_sigma=d.shard_size_sigma)
    clients = []
    for cid, local in enumerate(parts):
        idx = pool[np.asarray(local, dtype=np.int64)]
        tr, va = train_val_split(idx, d.val_fraction, np_generator(cfg.seed, "val-split", 0, cid))
        if len(tr) == 0:
            raise ConfigError(f"client {cid} has no training samples after the validation split; "
                              f"lower data.val_fraction or num_clients")
        clients.append(ClientData(cid, tr, va))
    return clients


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
    clients = make_partition(cfg, train.y)
    classes = train.info.num_classes
    stats = pd.concat([
        partition_stats(train.y, [c.train_indices for c in clients], classes).assign(split="train"),
        partition_stats(train.y, [c.val_indices for c in clients], classes).assign(split="val")], ignore_index=True)
    if cfg.data.test_subsample is not None and cfg.data.test_subsample < len(test.y):
        keep = np.sort(np_generator(cfg.seed, "test-subsample").choice(len(test.y), cfg.data.test_subsample, replace=False))
        test = dataclasses.replace(test, x=test.x[keep], y=test.y[keep])
    # The public server hold-out doubles as the validation set (``val_*`` columns): the global model is
    # scored on it whenever it is scored on the test split, so tuning never needs the test split.
    held, _ = server_holdout(cfg, len(train.y))
    val_x = to_float_tensor(train.x[held], train.info) if len(held) else None
    val_y = torch.from_numpy(train.y[held].astype(np.int64)) if len(held) else None
    return RunData(clients, stats, test, torch.from_numpy(test.y.astype(np.int64)), val_x, val_y)
