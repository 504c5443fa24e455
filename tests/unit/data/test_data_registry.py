"""Dataset registry: names, digits, normalisation, and the real CIFAR-10 copy when it is present."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.data import DATASETS, DatasetInfo, dataset_names, load_dataset, to_float_tensor


def _real_data_root() -> Path:
    env = os.environ.get("RAYSIM_TEST_DATA_ROOT")
    return Path(env) if env else (Path(__file__).resolve().parents[3] / ".." / "shared" / "data").resolve()


def test_names_and_infos() -> None:
    assert dataset_names() == ["cifar10", "digits", "femnist", "leaf_shakespeare", "shakespeare", "stl10", "svhn"]
    for name, info in DATASETS.items():
        assert info.name == name
        assert len(info.mean) == len(info.std) == info.channels
        assert info.num_classes == {"femnist": 62, "shakespeare": 80, "leaf_shakespeare": 80}.get(name, 10)
        assert info.natural_users == (name in ("femnist", "shakespeare", "leaf_shakespeare"))
    assert (DATASETS["stl10"].image_size, DATASETS["digits"].channels) == (96, 1)
    assert (DATASETS["shakespeare"].kind, DATASETS["shakespeare"].seq_len) == ("tokens", 80)


def test_unknown_name_or_split_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="cifar10, digits, femnist, leaf_shakespeare, shakespeare, stl10, svhn"):
        load_dataset("mnist", "train", None)
    with pytest.raises(ValueError, match="train, test"):
        load_dataset("digits", "validation", None)


def test_digits_split_is_fixed_stratified_and_stats_match() -> None:
    from sklearn.datasets import load_digits

    train, test = load_dataset("digits", "train", None), load_dataset("digits", "test", None)
    assert train.x.shape == (1438, 8, 8, 1) and test.x.shape == (359, 8, 8, 1)
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64 and train.x.max() == 255
    per_class = np.bincount(load_digits().target)
    assert np.array_equal(np.bincount(train.y) + np.bincount(test.y), per_class)
    assert np.all(np.abs(np.bincount(test.y) - 0.2 * per_class) <= 0.5)  # stratified 80/20
    again = load_dataset("digits", "test", "/ignored")
    assert np.array_equal(again.x, test.x) and np.array_equal(again.y, test.y)
    # Train and test are disjoint: together they are exactly the 1,797 bundled images.
    everything = np.concatenate([train.x, test.x]).reshape(1797, -1)
    expected = np.rint(load_digits().images.reshape(1797, -1) * 255 / 16).astype(np.uint8)
    assert sorted(map(bytes, everything)) == sorted(map(bytes, expected))
    pixels = train.x / 255.0
    assert DATASETS["digits"].mean[0] == pytest.approx(pixels.mean(), abs=1e-4)
    assert DATASETS["digits"].std[0] == pytest.approx(pixels.std(), abs=1e-4)


def test_to_float_tensor_layout_and_values() -> None:
    info = DatasetInfo("t", 10, 3, 2, (0.5, 0.25, 0.0), (0.5, 0.25, 2.0))
    x = np.arange(2 * 2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 2, 3) * 10
    out = to_float_tensor(x, info)
    assert out.dtype == torch.float32 and tuple(out.shape) == (2, 3, 2, 2) and out.is_contiguous()
    n, h, w, c = 1, 0, 1, 2
    assert out[n, c, h, w].item() == pytest.approx((x[n, h, w, c] / 255 - 0.0) / 2.0)
    assert out[0, 0, 0, 0].item() == pytest.approx((0 - 0.5) / 0.5)
    readonly = x.copy()
    readonly.setflags(write=False)
    assert torch.equal(to_float_tensor(readonly, info), out)
    with pytest.raises(ValueError, match="uint8"):
        to_float_tensor(x.astype(np.float32), info)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\)"):
        to_float_tensor(x[..., :1], info)


def _cifar10_root() -> Path:
    root = _real_data_root()
    if not sorted((root / "cifar10").glob("*train*.parquet")):
        pytest.skip(f"real CIFAR-10 Parquet files not found under {root / 'cifar10'} "
                    f"(set RAYSIM_TEST_DATA_ROOT to a folder holding cifar10/train-*.parquet)")
    return root


def test_real_cifar10_test_split_and_its_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _cifar10_root()
    test = load_dataset("cifar10", "test", str(root), cache_dir=str(tmp_path))
    assert test.x.shape == (10_000, 32, 32, 3) and test.x.dtype == np.uint8
    assert np.array_equal(np.bincount(test.y), [1000] * 10)
    import raysim.data.readers as readers

    def no_decode(*args, **kwargs):
        raise AssertionError("the second load must come from the .npy cache, not decode again")

    monkeypatch.setattr(readers, "read_source", no_decode)
    cached = load_dataset("cifar10", "test", str(root), cache_dir=str(tmp_path))
    assert np.array_equal(cached.x, test.x) and np.array_equal(cached.y, test.y)


@pytest.mark.slow   # decodes all 50,000 training images (about 11 s here)
def test_real_cifar10_train_split(tmp_path: Path) -> None:
    root = _cifar10_root()
    train = load_dataset("cifar10", "train", str(root), cache_dir=str(tmp_path))
    assert train.x.shape == (50_000, 32, 32, 3) and train.x.dtype == np.uint8
    assert np.array_equal(np.bincount(train.y), [5000] * 10)
    # The JPEG copy is close to the official pixels (README: channel means 125.27/122.93/113.86).
    assert np.allclose(train.x.mean(axis=(0, 1, 2)), [125.27, 122.93, 113.86], atol=0.02)
