"""Fixtures shared by every test file."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from memstore import faults as fault_points


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir() -> Iterator[str]:
    """memstore's cache directory (the cached empty index) for this test run only, shared with
    the subprocesses the tests start: the user's ~/.cache is never written."""
    previous = os.environ.get("MEMSTORE_CACHE_DIR")
    path = tempfile.mkdtemp(prefix="memstore-test-cache-")
    os.environ["MEMSTORE_CACHE_DIR"] = path
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop("MEMSTORE_CACHE_DIR", None)
        else:
            os.environ["MEMSTORE_CACHE_DIR"] = previous
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fault() -> Iterator[object]:
    """memstore's fault points (``memstore.faults``) for one test: ``fault.arm(point, action)``,
    ``fault.disarm(point)``; whatever the test armed is disarmed when it ends, pass or fail."""
    fault_points.disarm_all()
    try:
        yield fault_points
    finally:
        fault_points.disarm_all()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds (real subprocesses, big stores)")
