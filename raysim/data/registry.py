"""The datasets raysim knows, and the one entry point that loads them.

``load_dataset`` never touches the network unless ``download=True`` and never writes into the data
root except through that download; decoded arrays go to a separate on-disk cache (see ``cache.py``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from raysim.data import cache as _cache
from raysim.data import natural as _natural
from raysim.data import readers as _readers
from raysim.config import ConfigError

__all__ = [
    "DatasetNotFoundError",
    "DatasetInfo",
    "ArrayDataset",
    "DATASETS",
    "SPLITS",
    "dataset_names",
    "load_dataset",
    "register_dataset",
    "to_float_tensor",
]

SPLITS = ("train", "test")


class DatasetNotFoundError(ConfigError):
    """A dataset's files are not where the configuration says; the message says where to put them."""


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset; ``mean``/``std`` are per channel, in [0, 1] pixel units.

    ``kind`` is ``image`` (uint8 rows (H, W, C), normalised to floats for the model) or ``tokens``
    (uint8 rows of ``seq_len`` token ids, given to the model as int64; ``num_classes`` is then the
    vocabulary, the labels being the next token). ``natural_users``: every row belongs to a natural user
    (a speaking role, a writer), so ``data.partition: natural`` can give each client one user's rows."""

    name: str
    num_classes: int
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    kind: str = "image"
    seq_len: int = 0
    natural_users: bool = False


@dataclass(frozen=True)
class ArrayDataset:
    """A whole split in memory: ``x`` uint8 (N, H, W, C) channels-last images or (N, T) token ids,
    ``y`` int64 (N,). A data set with natural users also has ``users`` (N,) int32, each row's index
    into ``user_names``; the same user has the same name in the train and test splits."""

    x: np.ndarray
    y: np.ndarray
    info: DatasetInfo
    users: np.ndarray | None = None
    user_names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def take(self, rows: np.ndarray) -> ArrayDataset:
        """The rows ``rows`` (indices), users included."""
        return dataclasses.replace(self, x=self.x[rows], y=self.y[rows],
                                   users=None if self.users is None else self.users[rows])


DATASETS: dict[str, DatasetInfo] = {
    # Computed from the train split produced by readers.read_digits (1,438 images), pixels / 255.
    "digits": DatasetInfo("digits", 10, 1, 8, (0.3053,), (0.3759,)),
    "cifar10": DatasetInfo("cifar10", 10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "svhn": DatasetInfo("svhn", 10, 3, 32, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "stl10": DatasetInfo("stl10", 10, 3, 96, (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713)),
    # Natural federations (raysim.data.natural). FEMNIST's pixels go to the model as LEAF gives them,
    # in [0, 1] (mean 0, std 1: no normalisation); the Shakespeare sets are 80-character windows over
    # LEAF's 80-symbol vocabulary, labelled with the next character.
    "femnist": DatasetInfo("femnist", 62, 1, 28, (0.0,), (1.0,), natural_users=True),
    "shakespeare": DatasetInfo("shakespeare", 80, 0, 0, (), (), kind="tokens", seq_len=80, natural_users=True),
    "leaf_shakespeare": DatasetInfo("leaf_shakespeare", 80, 0, 0, (), (), kind="tokens", seq_len=80,
                                    natural_users=True),
}

_PRETTY = {"cifar10": "CIFAR-10", "svhn": "SVHN", "stl10": "STL-10"}
#: Data sets read by raysim.data.natural rather than the image readers.
_NATURAL = ("femnist", "shakespeare", "leaf_shakespeare")

#: Data sets registered from outside raysim: name -> loader(split, root) -> (x uint8 NHWC, y int64[, users]).
_LOADERS: dict[str, Callable[[str, str | None], tuple]] = {}


def register_dataset(info: DatasetInfo, loader: Callable[[str, str | None], tuple]) -> DatasetInfo:
    """Make ``data.name: info.name`` load ``loader(split, data.root)``: uint8 images (N, H, W, C) of
    ``info``'s shape and int64 labels in [0, num_classes), and, for a data set with natural users
    (``info.natural_users``), a third array: each row's user id (any strings or integers; the same id
    names the same user in both splits). Refuses a taken name."""
    if info.name in DATASETS:
        raise ValueError(f"dataset {info.name!r} is already registered")
    DATASETS[info.name] = info
    _LOADERS[info.name] = loader
    return info


def _load_registered(name: str, split: str, root: str | None) -> ArrayDataset:
    info = DATASETS[name]
    loaded = tuple(_LOADERS[name](split, root))
    if len(loaded) != (3 if info.natural_users else 2):
        raise ValueError(f"dataset {name!r}: the loader returned {len(loaded)} arrays, expected "
                         f"{'(x, y, users)' if info.natural_users else '(x, y)'} (DatasetInfo.natural_users="
                         f"{info.natural_users})")
    x, y = np.asarray(loaded[0]), np.asarray(loaded[1])
    if x.dtype != np.uint8 or x.shape[1:] != (info.image_size, info.image_size, info.channels):
        raise ValueError(f"dataset {name!r}: the loader returned {x.dtype} images of shape {x.shape[1:]}, expected "
                         f"uint8 ({info.image_size}, {info.image_size}, {info.channels})")
    if y.shape != (x.shape[0],) or y.min(initial=0) < 0 or y.max(initial=0) >= info.num_classes:
        raise ValueError(f"dataset {name!r}: the loader returned labels of shape {y.shape}, expected ({x.shape[0]},) "
                         f"in [0, {info.num_classes})")
    if not info.natural_users:
        return ArrayDataset(x=x, y=y.astype(np.int64), info=info)
    ids = np.asarray(loaded[2]).astype(str)
    if ids.shape != y.shape:
        raise ValueError(f"dataset {name!r}: the loader returned {ids.shape[0] if ids.ndim else 0} user ids for "
                         f"{y.shape[0]} rows")
    names, users = np.unique(ids, return_inverse=True)
    return ArrayDataset(x=x, y=y.astype(np.int64), info=info, users=users.astype(np.int32),
                        user_names=tuple(str(n) for n in names))


def dataset_names() -> list[str]:
    """Names accepted by :func:`load_dataset`, sorted."""
    return sorted(DATASETS)


def _not_found(name: str, split: str, root: Path, tried: list[str], downloaded: bool) -> DatasetNotFoundError:
    listing = "; ".join(tried)
    if downloaded:
        how = (f"The download into {root / name} (torchvision) finished but its files were not found there; "
               f"check the folder's contents")
    else:
        how = (f"To get it, set data.download: true on a machine with internet (torchvision then writes the "
               f"official files under {root / name}), or put the Hugging Face Parquet export at "
               f"{root / name}/{split}-*.parquet")
    return DatasetNotFoundError(
        f"{_PRETTY[name]} split {split!r} not found under data root {root}. Looked for: {listing}. {how}.")


def _load_files(name: str, split: str, root: str | None, download: bool,
                cache_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    info = DATASETS[name]
    if root is None:
        raise DatasetNotFoundError(
            f"dataset {name!r} is read from files, so a data root is required: pass --data-root or set "
            f"data.root to the folder that holds {name}/ (Hugging Face Parquet or the official release files)")
    root_path = Path(os.path.expanduser(root)).absolute()
    source, tried = _readers.locate(name, split, root_path)
    if source is None and download:
        _readers.download_with_torchvision(name, split, root_path / name)
        source, tried = _readers.locate(name, split, root_path)
    if source is None:
        raise _not_found(name, split, root_path, tried, downloaded=download)

    folder = Path(cache_dir).expanduser() if cache_dir is not None else _cache.default_cache_dir()
    key = _cache.cache_key(name, split, source.kind, source.files)
    hit = _cache.load_cached(folder, name, split, key)
    if hit is not None:
        return hit
    x, y = _readers.read_source(source, info.image_size, info.channels, info.num_classes)
    _cache.save_cached(folder, name, split, key, x, y)
    return x, y


def load_dataset(name: str, split: str, root: str | None, *, download: bool = False,
                 cache_dir: str | None = None) -> ArrayDataset:
    """Load one split of a dataset as uint8 images and int64 labels.

    ``digits`` comes from scikit-learn and ignores ``root``. The others are read from ``root`` (see
    :mod:`raysim.data.readers` for the layouts searched) and cached, decoded, in ``cache_dir``
    (default ``$RAYSIM_CACHE_DIR``, ``$XDG_CACHE_HOME/raysim`` or ``~/.cache/raysim``).

    Raises ``ValueError`` for an unknown name or split, and :class:`DatasetNotFoundError` (also a
    ``ValueError``) naming every path tried when the files are missing and ``download`` is false.
    """
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid names: {', '.join(dataset_names())}")
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if name in _LOADERS:
        return _load_registered(name, split, root)
    if name == "digits":
        x, y = _readers.read_digits(split)
    elif name in _NATURAL:
        x, y, users, names = _natural.load(name, split, root, cache_dir)
        return ArrayDataset(x=x, y=y, info=DATASETS[name], users=users, user_names=names)
    else:
        x, y = _load_files(name, split, root, download, cache_dir)
    return ArrayDataset(x=x, y=y, info=DATASETS[name])


def to_float_tensor(x: np.ndarray, info: DatasetInfo, *, channels_last: bool = False) -> torch.Tensor:
    """uint8 (N, H, W, C) → float32 (N, C, H, W), normalised as ``(x/255 - mean) / std``: contiguous, or
    with ``channels_last`` in the channels-last memory format (the input's own order, so no transposing
    copy is made; the values are the same bits either way). Token rows (``info.kind == "tokens"``,
    uint8 (N, T)) are not floats: they become the int64 (N, T) token ids the model embeds."""
    if info.kind == "tokens":
        if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != info.seq_len:
            raise ValueError(f"expected uint8 token rows of shape (N, {info.seq_len}), got {x.dtype} {tuple(x.shape)}")
        return torch.from_numpy(x.astype(np.int64))
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != info.channels:
        raise ValueError(f"expected uint8 images of shape (N, H, W, {info.channels}), "
                         f"got {x.dtype} {tuple(x.shape)}")
    # torch.from_numpy cannot wrap read-only arrays (np.load'ed or memory-mapped) without a warning.
    arr = x if x.flags.writeable else x.copy()
    out = torch.from_numpy(arr).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
    mean = torch.tensor(info.mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=torch.float32).view(1, -1, 1, 1)
    out = out.sub_(mean).div_(std)
    return out if channels_last else out.contiguous()
