"""docs/python-api.md's table of lifecycle events names every event and every field the event
contract (memstore.events.LIFECYCLE_FIELDS) checks, so the documented contract cannot lose a
field the code enforces."""

from __future__ import annotations

import re
from pathlib import Path

from memstore.events import LIFECYCLE_FIELDS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def _rows() -> dict[str, str]:
    section = PAGE.read_text(encoding="utf-8").split("## The event contract", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| `([a-z_.]+)`[^|]*\| (.*) \|$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_every_lifecycle_event_and_field_is_documented():
    """Each lifecycle event has a row, and each field its rule checks is named in that row."""
    rows = _rows()
    assert set(rows) == set(LIFECYCLE_FIELDS)
    for event, fields in LIFECYCLE_FIELDS.items():
        for name, _rule in fields:
            assert f"`{name}`" in rows[event], f"{event}: field {name} is not in docs/python-api.md"
