"""Helpers shared by several test files (pytest puts this directory on sys.path)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

import memstore

MANIFEST_COUNTERS = (
    "turn_count",
    "event_count",
    "in_turn",
    "retained_turn_base",
    "next_seq",
    "persisted_file_len",
    "status",
)
EVENT_COLUMNS = "seq, offset, length, turn, ts, type"
TURN_COLUMNS = (
    "number, status, start_offset, end_offset, event_count, first_seq, last_seq, started_at, ended_at, "
    "input_tokens, cached_input_tokens, cache_creation_tokens, output_tokens, error"
)
# The two events of the shortest turn.
TURN_STARTED = {"type": "turn.started"}
TURN_COMPLETED = {"type": "turn.completed", "usage": {}}

ONE_EVENT = b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n'


def write_session_files(
    root: Path, session_id: str = "s1", *, status: str = "completed", events: bytes = ONE_EVENT
) -> Path:
    """A session directory written by hand, as the event log leaves one: manifest.json,
    events.jsonl and derived/. For tests of code that only reads sessions."""
    session_dir = root / "sessions" / session_id
    (session_dir / "derived").mkdir(parents=True)
    manifest = {
        "session_id": session_id,
        "schema_version": 1,
        "created_at": "2026-11-30T08:00:00.000Z",
        "updated_at": "2026-11-30T08:30:29.123Z",
        "turn_count": 1,
        "event_count": 2,
        "status": status,
    }
    (session_dir / "manifest.json").write_bytes(orjson.dumps(manifest))
    (session_dir / "events.jsonl").write_bytes(events)
    return session_dir


def read_index(session_dir: Path) -> dict:
    """The rows of a session's SQLite index, read through a separate read-only connection: the
    manifest row's counters, every turn row, and every event row (log order)."""
    db = session_dir / "index" / "session.db"
    assert db.exists(), f"index missing: {db}"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute(f"SELECT {', '.join(MANIFEST_COUNTERS)} FROM manifest WHERE id = 1").fetchone()
        assert row is not None, f"no manifest row in {db}"
        manifest = dict(zip(MANIFEST_COUNTERS, row))
        manifest["in_turn"] = bool(manifest["in_turn"])
        turns = conn.execute(f"SELECT {TURN_COLUMNS} FROM turns ORDER BY number").fetchall()
        events = conn.execute(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()
    return {"manifest": manifest, "turns": turns, "events": events}


def wait_until_derived(session_dir: Path, seq: int, timeout: float = 10.0) -> None:
    """Wait until the session's deriver (which runs when the agent is idle: tests make that
    instant by setting ``TUNING.derive_idle_seconds``, see ``memstore.session.tuning``) has derived every
    record up to ``seq``."""
    import time

    db = session_dir / "index" / "session.db"
    deadline = time.monotonic() + timeout
    while True:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT seq FROM derived_state WHERE id = 1").fetchone()
        except sqlite3.OperationalError:
            row = None
        finally:
            conn.close()
        if row is not None and row[0] >= seq:
            return
        assert time.monotonic() < deadline, f"the deriver did not reach seq {seq} in {session_dir}"
        time.sleep(0.01)


@contextmanager
def tmpfs(path: Path, size: str = "16m") -> Iterator[Path]:
    """A real tmpfs mounted at ``path`` (created) for the test's duration; skips the test where
    mounting is not allowed. :func:`remount_read_only` makes it read-only."""
    path.mkdir(exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if result.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount_read_only(path: Path) -> None:
    result = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def interrupt_the_next_rescan_after_its_first_batch(monkeypatch, fault, path: Path) -> None:
    """Make the next rescan commit one batch of two events, then fail as a kill would leave it
    (the StoreIOError names ``path``), at the ``recovery.batch`` fault point; the test disarms
    that point (``fault.disarm("recovery.batch")``) to let rescans work again."""
    import memstore
    from memstore.session.tuning import TUNING

    monkeypatch.setattr(TUNING, "scan_batch_events", 2)
    # A rescan in place: one in memory leaves the old index as it was until it is done.
    monkeypatch.setattr(TUNING, "memory_scan_bytes", 0)
    commits = []

    def killed_after_the_first_batch(**context):
        if commits:
            raise memstore.StoreIOError("update index", path, "killed")
        commits.append(1)

    fault.arm("recovery.batch", killed_after_the_first_batch)


def writer_env() -> dict:
    """The writer imports the same memstore as this test process, wherever pytest runs from."""
    package_parent = str(Path(memstore.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env
