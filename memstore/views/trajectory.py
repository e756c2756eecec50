"""The trajectory view: ``derived/trajectory.jsonl`` of a session migrated from VT Code's
trajectory logs, regenerated from its ``trajectory.record`` events."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import orjson

from ..fsio import atomic_write
from ..layout import TRAJECTORY_FILE, derived_path
from .registry import FileView, register_file_view

if TYPE_CHECKING:
    from ..session.log import SessionLog

TRAJECTORY_EVENT = "trajectory.record"


def write_trajectory_view(log: SessionLog) -> Optional[Path]:
    """Regenerate ``derived/trajectory.jsonl`` of the open session ``log`` from its
    ``trajectory.record`` events (``rebuild`` calls this): one line per record in log order, the
    record as compact JSON (or its raw text). ``None`` (and nothing written) when it has none."""
    lines = []
    for event in log.iter_events():
        if event.get("type") != TRAJECTORY_EVENT:
            continue
        record, raw = event.get("record"), event.get("raw")
        if isinstance(record, dict):
            lines.append(orjson.dumps(record))
        elif isinstance(raw, str):
            lines.append(raw.encode("utf-8", "surrogateescape"))
    if not lines:
        return None
    path = derived_path(log.directory, TRAJECTORY_FILE)
    atomic_write(path, b"\n".join(lines) + b"\n")
    return path


register_file_view(FileView("trajectory", TRAJECTORY_FILE, (TRAJECTORY_EVENT,), write_trajectory_view))
