"""Shared fixtures. Ray starts at most once per test session (STYLE: one shared ray.init)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

REPO = Path(__file__).resolve().parents[1]


def shared_data_root() -> Path | None:
    """../shared/data next to the checkout (or $RAYSIM_TEST_DATA_ROOT), if it exists."""
    env = os.environ.get("RAYSIM_TEST_DATA_ROOT")
    root = Path(env) if env else REPO.parent / "shared" / "data"
    return root if (root / "cifar10").is_dir() else None


@pytest.fixture(scope="session")
def cifar_root() -> Path:
    root = shared_data_root()
    if root is None:
        pytest.skip("CIFAR-10 Parquet not found at ../shared/data/cifar10 (set RAYSIM_TEST_DATA_ROOT to run this test)")
    return root


@pytest.fixture(scope="session")
def ray_session():
    import ray
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture()
def tmp_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("RAYSIM_CACHE_DIR", str(cache))
    return cache
