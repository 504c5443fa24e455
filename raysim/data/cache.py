"""On-disk cache of decoded datasets.

Decoding 50,000 JPEGs takes seconds; reading two ``.npy`` files takes milliseconds. The cache lives
outside the data root (which may be read-only) and is keyed by the identity of the source files
(absolute path, size, mtime), so replacing a file invalidates its entry without any bookkeeping.
There is deliberately no in-memory cache: a module-level dict would make results depend on what a
process happened to load before, and would pin hundreds of MB per Ray worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["default_cache_dir", "cache_key", "load_cached", "save_cached", "load_natural", "save_natural",
           "CACHE_FORMAT_VERSION"]

#: Bump when the decoded layout changes so stale entries are ignored rather than misread.
CACHE_FORMAT_VERSION = 1


def default_cache_dir() -> Path:
    """Cache folder: ``$RAYSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/raysim``, else ``~/.cache/raysim``."""
    explicit = os.environ.get("RAYSIM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "raysim"


def cache_key(dataset: str, split: str, kind: str, files: Sequence[Path]) -> str:
    """Hex digest identifying one decoded (dataset, split) from exactly these source files.

    The files' absolute paths, sizes and modification times enter the key, so editing, replacing or
    moving a source file yields a new key; the old entry is simply never read again.
    """
    sources = []
    for f in files:
        st = Path(f).stat()
        sources.append([str(Path(f).resolve()), st.st_size, st.st_mtime_ns])
    payload = json.dumps(
        {"version": CACHE_FORMAT_VERSION, "dataset": dataset, "split": split, "kind": kind, "sources": sources},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:24]


def _paths(cache_dir: Path, dataset: str, split: str, key: str) -> tuple[Path, Path]:
    stem = f"{dataset}-{split}-{key}"
    return cache_dir / f"{stem}.x.npy", cache_dir / f"{stem}.y.npy"


def load_cached(cache_dir: Path, dataset: str, split: str, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Return ``(x, y)`` for ``key`` if a complete, readable entry exists, else ``None``.

    A damaged entry (truncated by a crash before atomic writes existed, or edited by hand) counts as
    a miss: the caller decodes again and overwrites it.
    """
    x_path, y_path = _paths(cache_dir, dataset, split, key)
    if not (x_path.is_file() and y_path.is_file()):
        return None
    try:
        x = np.load(x_path, allow_pickle=False)
        y = np.load(y_path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if x.dtype != np.uint8 or y.dtype != np.int64 or x.ndim != 4 or y.shape != (x.shape[0],):
        return None
    return x, y


def _atomic_save(path: Path, array: np.ndarray) -> None:
    # Write next to the target and rename: readers (other Ray workers, a parallel sweep) see either
    # no file or a complete one, never a half-written array.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, array, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_cached(cache_dir: Path, dataset: str, split: str, key: str, x: np.ndarray, y: np.ndarray) -> bool:
    """Store ``(x, y)`` under ``key``; return whether it was written.

    A cache that cannot be written (read-only home, full disk) only costs speed, so it warns instead
    of failing the run.
    """
    x_path, y_path = _paths(cache_dir, dataset, split, key)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # y last: load_cached needs both, so a crash between the two leaves a miss, not a wrong hit.
        _atomic_save(x_path, np.ascontiguousarray(x, dtype=np.uint8))
        _atomic_save(y_path, np.ascontiguousarray(y, dtype=np.int64))
    except OSError as exc:
        warnings.warn(f"could not write the dataset cache in {cache_dir} ({exc}); decoding again next time",
                      RuntimeWarning, stacklevel=3)
        return False
    return True


def _natural_paths(cache_dir: Path, dataset: str, split: str, key: str) -> dict[str, Path]:
    stem = cache_dir / f"{dataset}-{split}-{key}"
    return {part: Path(f"{stem}.{part}.npy") for part in ("x", "y", "users")} | {"names": Path(f"{stem}.users.json")}


def load_natural(cache_dir: Path, dataset: str, split: str, key: str
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]] | None:
    """``(x, y, users, user names)`` of a natural data set's split, or ``None`` on a miss (a damaged
    entry is a miss too)."""
    paths = _natural_paths(cache_dir, dataset, split, key)
    if not all(p.is_file() for p in paths.values()):
        return None
    try:
        x, y, users = (np.load(paths[k], allow_pickle=False) for k in ("x", "y", "users"))
        names = json.loads(paths["names"].read_text())
    except (OSError, ValueError):
        return None
    if x.dtype != np.uint8 or y.dtype != np.int64 or y.shape != (x.shape[0],) or users.shape != y.shape:
        return None
    if not isinstance(names, list) or (len(users) and (users.min() < 0 or users.max() >= len(names))):
        return None
    return x, y, users, names


def save_natural(cache_dir: Path, dataset: str, split: str, key: str, x: np.ndarray, y: np.ndarray,
                 users: np.ndarray, names: Sequence[str]) -> bool:
    """Store a natural data set's split; like :func:`save_cached`, a cache that cannot be written warns."""
    paths = _natural_paths(cache_dir, dataset, split, key)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        _atomic_save(paths["x"], np.ascontiguousarray(x, dtype=np.uint8))
        _atomic_save(paths["users"], np.ascontiguousarray(users, dtype=np.int32))
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".names.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(list(names), fh)
        os.replace(tmp, paths["names"])
        _atomic_save(paths["y"], np.ascontiguousarray(y, dtype=np.int64))   # last: a complete entry has y
    except OSError as exc:
        warnings.warn(f"could not write the dataset cache in {cache_dir} ({exc}); building again next time",
                      RuntimeWarning, stacklevel=3)
        return False
    return True
