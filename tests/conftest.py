"""Fixtures shared by every test file."""

from __future__ import annotations

from typing import Iterator

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
