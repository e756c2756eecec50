"""Fixtures shared by every test file."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memstore import faults as fault_points


@pytest.fixture
def fault() -> Iterator[object]:
    """memstore's fault points (``memstore.faults``) for one test: ``fault.arm(point, action)``,
    ``fault.disarm(point)``; whatever the test armed is disarmed when it ends, pass or fail."""
    fault_points.disarm_all()
    try:
        yield fault_points
    finally:
        fault_points.disarm_all()


@pytest.fixture(autouse=True)
def _no_store_of_the_person_running_the_tests(tmp_path_factory, monkeypatch) -> None:
    """A command or ``Store()`` that falls back to the default store (see memstore.location)
    finds a per-user store in a temporary directory, never the real one of whoever runs the
    tests, and no MEMSTORE_ROOT from their shell; a `memstore serve` records itself in a
    temporary runtime directory, and no MEMSTORE_EXPLORER_URL is configured."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("xdg-runtime")))
    monkeypatch.delenv("MEMSTORE_ROOT", raising=False)
    monkeypatch.delenv("MEMSTORE_EXPLORER_URL", raising=False)
