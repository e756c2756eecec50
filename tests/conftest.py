"""Fixtures shared by every test file, and the ``slow`` marker.

A plain ``pytest`` runs the quick suite. Tests marked ``@pytest.mark.slow`` (crash loops with
SIGKILLed processes, property tests, the real browser, benchmarks at archive scale) run with
``pytest --slow``, and always in CI (``CI`` set in the environment, as ``.ci/run`` does).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from memstore import Store
from memstore import faults as fault_points
from memstore.layout import CATALOG_FILE


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow", action="store_true", default=False, help="also run the tests marked slow (always on when CI is set)"
    )


def _run_slow(config: pytest.Config) -> bool:
    return bool(config.getoption("--slow")) or os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the slow tests unless asked for (``--slow`` or CI); ``-m slow`` still selects
    them explicitly."""
    if _run_slow(config) or "slow" in (config.option.markexpr or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


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


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty store in the test's own directory (nothing on disk until something is written)."""
    return Store(tmp_path / "store")


# What ``written_session`` holds: one turn that ran a failing command and answered.
WRITTEN_SESSION_ID = "written"
WRITTEN_SESSION_EVENTS = (
    {"type": "thread.started", "thread_id": WRITTEN_SESSION_ID},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "u1", "type": "user_message", "text": "why does the parser test fail"}},
    {
        "type": "item.completed",
        "item": {
            "id": "c1",
            "type": "command_execution",
            "command": "cargo test parser",
            "aggregated_output": "test parser::nested ... FAILED",
            "exit_code": 101,
            "status": "failed",
        },
    },
    {
        "type": "item.completed",
        "item": {"id": "a1", "type": "agent_message", "text": "The nested-bracket case overflows the stack."},
    },
    {"type": "turn.completed", "usage": {"input_tokens": 1200, "cached_input_tokens": 200, "output_tokens": 80}},
)


@pytest.fixture
def written_session(store: Store) -> str:
    """A closed session of ``store`` with one complete turn (:data:`WRITTEN_SESSION_EVENTS`);
    returns its id."""
    with store.open(WRITTEN_SESSION_ID) as log:
        for event in WRITTEN_SESSION_EVENTS:
            log.append(event)
    return WRITTEN_SESSION_ID


@pytest.fixture
def catalog(store: Store, written_session: str) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``store``'s catalog, refreshed after ``written_session``."""
    store.refresh()
    conn = sqlite3.connect(f"file:{store.path / CATALOG_FILE}?mode=ro", uri=True)
    try:
        yield conn
    finally:
        conn.close()
