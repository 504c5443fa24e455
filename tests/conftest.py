"""Shared fixtures. Ray starts at most once per test session (one shared ray.init)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = REPO / "tests" / "integration"


def pytest_collection_modifyitems(config, items):
    """``integration`` means one thing: a test under tests/integration/ (end to end through the simulator or
    the CLI); ``-m integration`` selects them, ``-m "not integration"`` the unit tests. A test that runs
    processes besides pytest's is a ``cluster`` test (``make test-cluster``): one that starts Ray (the
    ``ray_session`` fixture) is marked here, one that starts Python subprocesses is marked in its file."""
    for item in items:
        if INTEGRATION in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def ray_session():
    import ray
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
