"""Readers of the official and Hugging Face formats, on small files written here in those formats."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.io
from PIL import Image

from raysim.data import DatasetNotFoundError, load_dataset
from raysim.data import readers


def _images(n: int, size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


def _write_parquet(path: Path, x: np.ndarray, y: np.ndarray, image_col: str = "img",
                   label_col: str = "label") -> None:
    blobs = []
    for img in x:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")  # lossless, so pixels must round-trip exactly
        blobs.append(buf.getvalue())
    images = pa.StructArray.from_arrays([pa.array(blobs, pa.binary()), pa.array([None] * len(blobs), pa.string())],
                                        names=["bytes", "path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({image_col: images, label_col: pa.array(y, pa.int64())}), path)


def _write_cifar(folder: Path, x: np.ndarray, y: np.ndarray, name: str) -> None:
    # Official layout: each row holds the 1024 red values, then green, then blue, each plane row-major.
    rows = np.stack([np.concatenate([img[:, :, c].ravel() for c in range(3)]) for img in x])
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "wb") as fh:
        pickle.dump({b"batch_label": name.encode(), b"data": rows, b"labels": [int(v) for v in y]}, fh, protocol=2)


def _write_stl10(folder: Path, split: str, x: np.ndarray, y_on_disk: np.ndarray) -> None:
    # Official layout: per image, per channel, the 96x96 plane in column-major (Fortran) order.
    payload = b"".join(x[n, :, :, c].flatten(order="F").tobytes() for n in range(len(x)) for c in range(3))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}_X.bin").write_bytes(payload)
    (folder / f"{split}_y.bin").write_bytes(y_on_disk.astype(np.uint8).tobytes())


def test_parquet_round_trip_and_label_column_variants(tmp_path: Path) -> None:
    x, y = _images(12, 32, 0), np.arange(12) % 10
    _write_parquet(tmp_path / "data" / "cifar10" / "train-00000-of-00002.parquet", x[:7], y[:7])
    _write_parquet(tmp_path / "data" / "cifar10" / "train-00001-of-00002.parquet", x[7:], y[7:])
    _write_parquet(tmp_path / "data" / "svhn" / "cropped_digits" / "test-00000-of-00001.parquet", x, y,
                   image_col="image", label_col="labels")
    ds = load_dataset("cifar10", "train", str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    assert ds.x.dtype == np.uint8 and ds.y.dtype == np.int64
    assert np.array_equal(ds.x, x) and np.array_equal(ds.y, y)
    ds = load_dataset("svhn", "test", str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    assert np.array_equal(ds.x, x) and np.array_equal(ds.y, y)


def test_parquet_wrong_schema_or_size_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    pq.write_table(pa.table({"pixels": [b"x"], "label": [1]}), tmp_path / "c" / "train.parquet")
    with pytest.raises(ValueError, match="struct<bytes"):
        readers.read_source(readers.Source("parquet", (tmp_path / "c" / "train.parquet",)), 32, 3, 10)
    _write_parquet(tmp_path / "d" / "train.parquet", _images(2, 16, 1), np.array([0, 1]))
    with pytest.raises(ValueError, match="16x16 image, expected 32x32"):
        readers.read_source(readers.Source("parquet", (tmp_path / "d" / "train.parquet",)), 32, 3, 10)


@pytest.mark.parametrize("nested", [True, False])
def test_cifar_pickle_round_trip(tmp_path: Path, nested: bool) -> None:
    x, y = _images(15, 32, 2), np.arange(15) % 10
    folder = (tmp_path / "cifar10" if nested else tmp_path) / "cifar-10-batches-py"
    for i in range(5):
        _write_cifar(folder, x[3 * i:3 * i + 3], y[3 * i:3 * i + 3], f"data_batch_{i + 1}")
    _write_cifar(folder, x[:4], y[:4], "test_batch")
    train = load_dataset("cifar10", "train", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    test = load_dataset("cifar10", "test", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert np.array_equal(train.x, x) and np.array_equal(train.y, y)
    assert np.array_equal(test.x, x[:4]) and np.array_equal(test.y, y[:4])


def test_svhn_mat_round_trip_maps_label_10_to_0(tmp_path: Path) -> None:
    x = _images(6, 32, 3)
    y_on_disk = np.array([10, 1, 2, 10, 9, 5], dtype=np.uint8)
    (tmp_path / "svhn").mkdir()
    scipy.io.savemat(tmp_path / "svhn" / "train_32x32.mat",
                     {"X": np.ascontiguousarray(x.transpose(1, 2, 3, 0)), "y": y_on_disk.reshape(-1, 1)})
    ds = load_dataset("svhn", "train", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert ds.x.shape == (6, 32, 32, 3)
    assert np.array_equal(ds.x, x)
    assert ds.y.tolist() == [0, 1, 2, 0, 9, 5]


def test_stl10_bin_column_major_round_trip_and_labels(tmp_path: Path) -> None:
    x = _images(3, 96, 4)
    x[0, :, :, 0] = 0
    x[0, 1, 0, 0] = 77  # row 1, column 0: byte 1 of the first plane in column-major order
    _write_stl10(tmp_path / "stl10" / "stl10_binary", "test", x, np.array([1, 10, 4]))
    assert (tmp_path / "stl10" / "stl10_binary" / "test_X.bin").read_bytes()[:3] == bytes([0, 77, 0])
    ds = load_dataset("stl10", "test", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert ds.x.shape == (3, 96, 96, 3)
    assert np.array_equal(ds.x, x)
    assert ds.y.tolist() == [0, 9, 3]


def test_parquet_is_preferred_over_official_files(tmp_path: Path) -> None:
    x = _images(4, 32, 5)
    _write_parquet(tmp_path / "svhn" / "train-0.parquet", x, np.array([1, 2, 3, 4]))
    scipy.io.savemat(tmp_path / "svhn" / "train_32x32.mat",
                     {"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.ones((2, 1), np.uint8)})
    source, _ = readers.locate("svhn", "train", tmp_path)
    assert source is not None and source.kind == "parquet"


def test_cache_hit_then_invalidated_by_changing_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    x = _images(5, 32, 6)
    mat = root / "svhn" / "test_32x32.mat"
    mat.parent.mkdir(parents=True)
    scipy.io.savemat(mat, {"X": np.ascontiguousarray(x.transpose(1, 2, 3, 0)), "y": np.ones((5, 1), np.uint8)})
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    first = load_dataset("svhn", "test", str(root), cache_dir=str(cache))
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before, "nothing may be written to the data root"
    assert len(list(cache.glob("svhn-test-*.npy"))) == 2

    calls = []
    real_read = readers.read_source
    monkeypatch.setattr(readers, "read_source", lambda *a, **k: calls.append(a) or real_read(*a, **k))
    second = load_dataset("svhn", "test", str(root), cache_dir=str(cache))
    assert calls == [], "second load must come from the cache"
    assert np.array_equal(second.x, first.x) and np.array_equal(second.y, first.y)

    x2 = _images(5, 32, 7)
    scipy.io.savemat(mat, {"X": np.ascontiguousarray(x2.transpose(1, 2, 3, 0)), "y": np.full((5, 1), 3, np.uint8)})
    st = mat.stat()
    os.utime(mat, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same size, so make sure mtime moves
    third = load_dataset("svhn", "test", str(root), cache_dir=str(cache))
    assert len(calls) == 1
    assert np.array_equal(third.x, x2) and third.y.tolist() == [3] * 5


def test_damaged_cache_entry_is_a_miss(tmp_path: Path) -> None:
    x = _images(3, 32, 8)
    (tmp_path / "svhn").mkdir()
    scipy.io.savemat(tmp_path / "svhn" / "train_32x32.mat",
                     {"X": np.ascontiguousarray(x.transpose(1, 2, 3, 0)), "y": np.ones((3, 1), np.uint8)})
    load_dataset("svhn", "train", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    for f in (tmp_path / "cache").glob("*.x.npy"):
        f.write_bytes(b"not an npy file")
    ds = load_dataset("svhn", "train", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert np.array_equal(ds.x, x)


def test_default_cache_dir_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raysim.data.cache import default_cache_dir

    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("RAYSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "raysim"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "raysim"


def test_not_found_lists_every_path_tried(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("cifar10", "train", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    msg = str(info.value)
    for expected in (tmp_path / "cifar10" / "*train*.parquet", tmp_path / "cifar10" / "plain_text" / "*train*.parquet",
                     tmp_path / "cifar10" / "cifar-10-batches-py", tmp_path / "cifar-10-batches-py"):
        assert str(expected) in msg
    assert "data.download: true" in msg and f"{tmp_path / 'cifar10'}/train-*.parquet" in msg
    with pytest.raises(DatasetNotFoundError, match=r"stl10_binary/test_X\.bin"):
        load_dataset("stl10", "test", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DatasetNotFoundError, match=r"svhn/train_32x32\.mat"):
        load_dataset("svhn", "train", str(tmp_path), cache_dir=str(tmp_path / "cache"))


def test_no_root_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"--data-root.*data\.root"):
        load_dataset("svhn", "train", None, cache_dir=str(tmp_path))
    assert issubclass(DatasetNotFoundError, ValueError)


def test_download_only_when_asked_then_reads_the_official_files(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    x = _images(2, 96, 9)
    calls: list[tuple[str, str, Path]] = []

    def fake_download(name: str, split: str, target: Path) -> None:  # what torchvision would leave behind
        calls.append((name, split, target))
        _write_stl10(target / "stl10_binary", split, x, np.array([2, 3]))

    monkeypatch.setattr(readers, "download_with_torchvision", fake_download)
    with pytest.raises(DatasetNotFoundError):
        load_dataset("stl10", "train", str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert calls == []
    ds = load_dataset("stl10", "train", str(tmp_path), download=True, cache_dir=str(tmp_path / "cache"))
    assert calls == [("stl10", "train", tmp_path / "stl10")]
    assert np.array_equal(ds.x, x) and ds.y.tolist() == [1, 2]


def test_bad_labels_are_rejected(tmp_path: Path) -> None:
    _write_parquet(tmp_path / "cifar10" / "test.parquet", _images(2, 32, 10), np.array([0, 10]))
    with pytest.raises(ValueError, match="labels span 0..10"):
        load_dataset("cifar10", "test", str(tmp_path), cache_dir=str(tmp_path / "cache"))
