"""Stores and exports shared by the exporter tests: the realistic demo store (about thirty
sessions of three agents over three weeks), written once per test session and copied for the
tests that change it."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import memstore
from memstore.pricing import register_sql_functions


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds (real subprocesses, big stores)")


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo store, untouched by tests (copy it with ``store_copy`` to change it)."""
    root = tmp_path_factory.mktemp("demo") / "store"
    memstore.write_demo_store(root)
    memstore.Store(root).refresh()
    return root


@pytest.fixture
def store_copy(demo_store: Path, tmp_path: Path) -> Path:
    """A private copy of the demo store (no writer is open on the original)."""
    root = tmp_path / "store"
    shutil.copytree(demo_store, root)
    return root


@pytest.fixture(scope="session")
def demo_export(demo_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo store exported as Parquet (read only)."""
    from memstore.exporters.parquet import export_parquet

    dest = tmp_path_factory.mktemp("export") / "lake"
    export_parquet(demo_store, dest)
    return dest


@pytest.fixture
def catalog(demo_store: Path) -> Iterator[sqlite3.Connection]:
    """The demo store's catalog, read-only, with memstore's cost functions."""
    conn = sqlite3.connect(f"file:{demo_store / 'catalog.db'}?mode=ro", uri=True)
    register_sql_functions(conn)
    yield conn
    conn.close()
