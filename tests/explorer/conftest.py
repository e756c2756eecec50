"""Helpers of the explorer's tests: small stores, and `memstore serve` as a real server process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from explorer_support import Served, start_server, stop_server


@pytest.fixture
def serve_store() -> Iterator:
    """``serve_store(root, *args)`` starts `memstore serve` on ``root``; each is stopped at the end."""
    started: list[Served] = []

    def start(root: Path, *args: str) -> Served:
        served = start_server(root, *args)
        started.append(served)
        return served

    yield start
    for served in started:
        stop_server(served)
