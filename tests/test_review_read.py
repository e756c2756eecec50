"""Adversarial review of the read side: the reader, the index as read, the catalog refresh and
search_memory. Each test is a bug found by attacking one of their promises."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from memstore.index import readonly_uri

TURN_STARTED = {"type": "turn.started"}
TURN_COMPLETED = {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}}


def message(text: str) -> dict:
    return {"type": "item.completed", "item": {"id": text, "type": "agent_message", "text": text}}


def write_turns(log, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.append(TURN_STARTED)
        log.append(message(f"widget turn {i + 1}"))
        log.append(TURN_COMPLETED)


def files(directory: Path) -> dict:
    """Every file under ``directory`` with its bytes and mtime."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(directory))] = (path.read_bytes(), st.st_mtime_ns)
    return out


def catalog_rows(root: Path) -> dict:
    conn = sqlite3.connect(root / "catalog.db")
    try:
        return {
            "sessions": sorted(conn.execute("SELECT session_id, directory, turn_count, event_count FROM sessions")),
            "events": sorted(conn.execute("SELECT session_id, seq, type FROM events")),
            "chunks": sorted(conn.execute("SELECT chunk_id, session_id, source, text FROM chunks")),
        }
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# Read-only opens create nothing


def test_a_read_only_uri_never_creates_a_missing_index(tmp_path):
    """A rebuild deletes the index file before it makes a new one: a reader (or the catalog's
    ATTACH) opening it in that moment must fail, not create an empty database."""
    missing = tmp_path / "index" / "session.db"
    missing.parent.mkdir()
    with pytest.raises(sqlite3.Error):
        sqlite3.connect(readonly_uri(missing), uri=True).execute("SELECT 1").fetchall()
    assert os.listdir(missing.parent) == []
