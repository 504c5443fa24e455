"""Readers for the on-disk formats raysim accepts, and the search for them under a data root.

Two layouts are read, in this order of preference:

1. the Hugging Face Hub Parquet export (one struct column holding the encoded image bytes, one label
   column), found as ``<root>/<name>/[<subdir>/]*<split>*.parquet``;
2. the official release files that torchvision also downloads: CIFAR-10 ``cifar-10-batches-py/``
   pickle batches, SVHN ``{split}_32x32.mat``, STL-10 ``stl10_binary/{split}_[XY].bin``, found under
   ``<root>/<name>/`` or ``<root>/`` itself.

The readers parse these formats directly (no torchvision import), so reading is fast and the exact
layout is visible and tested. Only :func:`download_with_torchvision` writes anything, and only when the
user asked for a download.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from raysim.config import ConfigError

__all__ = ["Source", "locate", "read_source", "download_with_torchvision", "read_digits"]

# Sub-folders the Hub uses for dataset configurations (e.g. ``plain_text/`` for CIFAR-10,
# ``cropped_digits/`` for SVHN: its ``full_numbers`` config is a different task and must not match).
_PARQUET_SUBDIRS: dict[str, tuple[str, ...]] = {
    "cifar10": ("", "plain_text", "data"),
    "svhn": ("", "cropped_digits", "data"),
    "stl10": ("", "data"),
}


@dataclass(frozen=True)
class Source:
    """The files one (dataset, split) will be read from, and in which format."""

    kind: str  # "parquet" | "cifar-pickle" | "svhn-mat" | "stl10-bin"
    files: tuple[Path, ...]


def _official_candidates(name: str, split: str, base: Path) -> tuple[str, list[Path]]:
    """Format name and the exact files the official release has for ``split`` under ``base``."""
    if name == "cifar10":
        folder = base / "cifar-10-batches-py"
        names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        return "cifar-pickle", [folder / n for n in names]
    if name == "svhn":
        return "svhn-mat", [base / f"{split}_32x32.mat"]
    if name == "stl10":
        folder = base / "stl10_binary"
        return "stl10-bin", [folder / f"{split}_X.bin", folder / f"{split}_y.bin"]
    raise ConfigError(f"no official file format known for dataset {name!r}")


def locate(name: str, split: str, root: Path) -> tuple[Source | None, list[str]]:
    """Find the files for ``name``/``split`` under ``root``.

    Returns the first layout found (or ``None``) and every path or glob that was tried, in order, so
    that a miss can be reported precisely.
    """
    tried: list[str] = []
    for sub in _PARQUET_SUBDIRS[name]:
        folder = root / name / sub if sub else root / name
        pattern = f"*{split}*.parquet"
        tried.append(str(folder / pattern))
        matches = sorted(p for p in folder.glob(pattern) if p.is_file()) if folder.is_dir() else []
        if matches:
            return Source("parquet", tuple(matches)), tried
    for base in (root / name, root):
        kind, files = _official_candidates(name, split, base)
        if len(files) > 2:  # CIFAR's five batches: print one glob-like entry instead of five lines
            tried.append(str(files[0].parent / "data_batch_{1..5}"))
        else:
            tried.extend(str(f) for f in files)
        if all(f.is_file() for f in files):
            return Source(kind, tuple(files)), tried
    return None, tried


# --------------------------------------------------------------------------------------------- readers


def _read_parquet(files: tuple[Path, ...], image_size: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode Hugging Face Parquet files: one ``struct<bytes, ...>`` image column plus ``label(s)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    mode = "RGB" if channels == 3 else "L"
    xs, ys = [], []
    for path in files:
        table = pq.read_table(path)
        image_cols = [f.name for f in table.schema
                      if pa.types.is_struct(f.type) and f.type.get_field_index("bytes") >= 0]
        label_cols = [c for c in ("label", "labels") if c in table.column_names]
        if len(image_cols) != 1 or not label_cols:
            raise ConfigError(
                f"{path}: expected one image column of type struct<bytes: binary, ...> and a 'label' column "
                f"(the Hugging Face Parquet layout), found columns {table.schema.names}")
        blobs = table.column(image_cols[0]).combine_chunks().field("bytes").to_pylist()
        x = np.empty((len(blobs), image_size, image_size, channels), dtype=np.uint8)
        # A plain loop: decoding is ~0.15 ms per 32x32 image, so process pools would cost more to start
        # than they save, and this runs once per file before the result is cached.
        for i, blob in enumerate(blobs):
            if blob is None:
                raise ConfigError(f"{path}: row {i} has no image bytes")
            with Image.open(io.BytesIO(blob)) as im:
                arr = np.asarray(im if im.mode == mode else im.convert(mode))
            if arr.shape[:2] != (image_size, image_size):
                raise ConfigError(f"{path}: row {i} is a {arr.shape[1]}x{arr.shape[0]} image, "
                                 f"expected {image_size}x{image_size}")
            x[i] = arr.reshape(image_size, image_size, channels)
        xs.append(x)
        ys.append(np.asarray(table.column(label_cols[0]).to_numpy(zero_copy_only=False), dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def _read_cifar_pickle(files: tuple[Path, ...]) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 python batches: ``data`` is (N, 3072) uint8, each row R then G then B planes of 32x32."""
    xs, ys = [], []
    for path in files:
        with open(path, "rb") as fh:
            # The official batches are Python-2 pickles of plain dicts (what torchvision also loads).
            batch = pickle.load(fh, encoding="bytes")
        data = batch.get(b"data", batch.get("data"))
        labels = batch.get(b"labels", batch.get("labels"))
        if data is None or labels is None:
            raise ConfigError(f"{path}: not a CIFAR-10 python batch (no 'data'/'labels' entries)")
        xs.append(np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        ys.append(np.asarray(labels, dtype=np.int64))
    return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)


def _read_svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """SVHN cropped digits: ``X`` is (32, 32, 3, N) uint8, ``y`` is (N, 1) with 10 standing for digit 0."""
    import scipy.io

    mat = scipy.io.loadmat(str(path))
    if "X" not in mat or "y" not in mat:
        raise ConfigError(f"{path}: not an SVHN cropped-digits .mat file (needs variables 'X' and 'y')")
    x = np.ascontiguousarray(np.asarray(mat["X"], dtype=np.uint8).transpose(3, 0, 1, 2))
    y = np.asarray(mat["y"], dtype=np.int64).reshape(-1)
    y[y == 10] = 0  # the release labels digit 0 as 10; torchvision maps it the same way
    return x, y


def _read_stl10_bin(x_path: Path, y_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """STL-10 binaries: each image is 3x96x96 uint8 stored column-major (per channel, columns first)."""
    raw = np.fromfile(x_path, dtype=np.uint8)
    if raw.size % (3 * 96 * 96):
        raise ConfigError(f"{x_path}: size {raw.size} bytes is not a multiple of one 3x96x96 image")
    # Column-major within a channel means the fastest index is the row: reshape gives (N, C, W, H).
    x = np.ascontiguousarray(raw.reshape(-1, 3, 96, 96).transpose(0, 3, 2, 1))
    y = np.fromfile(y_path, dtype=np.uint8).astype(np.int64) - 1  # labels are 1..10 on disk
    return x, y


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_source(source: Source, image_size: int, channels: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode ``source`` to ``(x uint8 (N, H, W, C), y int64 (N,))`` and check the result is sane."""
    where = ", ".join(str(f) for f in source.files)
    try:
        if source.kind == "parquet":
            x, y = _read_parquet(source.files, image_size, channels)
        elif source.kind == "cifar-pickle":
            x, y = _read_cifar_pickle(source.files)
        elif source.kind == "svhn-mat":
            x, y = _read_svhn_mat(source.files[0])
        elif source.kind == "stl10-bin":
            x, y = _read_stl10_bin(*source.files)
        else:
            raise ConfigError(f"unknown source kind {source.kind!r}")
    except ValueError as exc:
        if any(str(f) in str(exc) for f in source.files):
            raise ConfigError(_first_line(exc)) from None
        raise ConfigError(f"{where}: unreadable {source.kind} data: {_first_line(exc)}") from None
    except Exception as exc:  # truncated or corrupt files: OSError, EOFError, UnpicklingError, KeyError, ...
        raise ConfigError(f"{where}: unreadable {source.kind} data ({type(exc).__name__}: {_first_line(exc)})") from None
    if x.shape[1:] != (image_size, image_size, channels):
        raise ConfigError(f"{where}: images have shape {x.shape[1:]}, expected {(image_size, image_size, channels)}")
    if y.shape != (x.shape[0],):
        raise ConfigError(f"{where}: {x.shape[0]} images but {y.shape[0]} labels")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ConfigError(f"{where}: labels span {y.min()}..{y.max()}, expected 0..{num_classes - 1}")
    return x, y


def download_with_torchvision(name: str, split: str, target: Path) -> None:
    """Fetch the official release into ``target`` with torchvision (needs internet; only on request)."""
    import torchvision.datasets as tvd

    target.mkdir(parents=True, exist_ok=True)
    if name == "cifar10":
        tvd.CIFAR10(root=str(target), train=(split == "train"), download=True)
    elif name == "svhn":
        tvd.SVHN(root=str(target), split=split, download=True)
    elif name == "stl10":
        tvd.STL10(root=str(target), split=split, download=True)
    else:
        raise ConfigError(f"dataset {name!r} cannot be downloaded")


def read_digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits as uint8 (N, 8, 8, 1) with a fixed stratified 80/20 split.

    The split comes from the fixed stream ``(seed 0, "digits-split")``, not from the run's seed, so
    every run and every user sees the same train and test sets.
    """
    from sklearn.datasets import load_digits

    from raysim.rng import np_generator

    digits = load_digits()
    # Pixel values are integers 0..16; map them onto the usual 0..255 range.
    x = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    y = digits.target.astype(np.int64)
    rng = np_generator(0, "digits-split")
    is_test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        n_test = int(np.floor(0.2 * len(members) + 0.5))
        is_test[rng.permutation(members)[:n_test]] = True
    keep = is_test if split == "test" else ~is_test
    return np.ascontiguousarray(x[keep]), y[keep]
