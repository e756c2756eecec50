"""Helpers of the catalog tests: what a catalog holds, one built from scratch to compare it
with, and sessions written as memstore and as VT Code write them."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import orjson

import memstore
from memstore.catalog import refresh_catalog

# tests/support.py (shared by the whole suite), also when only this folder is run.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TABLES = {
    "sessions": "session_id, directory, status, created_at, updated_at, turn_count, event_count, retained_turn_base, "
    "agent, title, model, turns_failed, input_tokens, cached_input_tokens, output_tokens, log_bytes, "
    "cost_usd, cost_estimated, cost_unpriced_turns",
    "turns": "session_id, number, status, event_count, first_seq, last_seq, input_tokens, output_tokens, error, model, "
    "cost_usd, cost_source, price_version",
    "events": "session_id, seq, turn, ts, type, item_type, item_id, name, status, exit_code, offset, length",
    "chunks": "chunk_id, session_id, seq, turn, part, source, kind, path, start_line, end_line, created_at, text",
    "file_changes": "session_id, seq, turn, path, kind",
}


def content(root) -> dict:
    """Every row a catalog holds of its sessions (not its bookkeeping), and what its FTS5 and
    BM25 indexes find for ``widget``, in a comparable order."""
    conn = sqlite3.connect(Path(root) / "catalog.db")
    try:
        out = {t: sorted(conn.execute(f"SELECT {cols} FROM {t}").fetchall(), key=repr) for t, cols in TABLES.items()}
        out["fts"] = sorted(
            conn.execute(
                "SELECT chunks.chunk_id FROM chunks_fts JOIN chunks ON chunks.id = chunks_fts.rowid "
                "WHERE chunks_fts MATCH 'widget'"
            ).fetchall()
        )
        from memstore.bm25 import SearchIndex

        index = SearchIndex(conn)
        hits = index.search("widget", 1000, recency=False)
        ids = dict(conn.execute("SELECT id, chunk_id FROM chunks").fetchall())
        out["bm25"] = sorted((ids[doc], round(score, 9)) for doc, score in hits)
        out["bm25_docs"] = index.count()
        return out
    finally:
        conn.close()


def from_scratch(root, tmp_path) -> dict:
    """:func:`content` of a catalog built from scratch over a copy of ``root``'s sessions."""
    copy = Path(tmp_path) / "scratch"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    shutil.copytree(Path(root) / "sessions", copy / "sessions", symlinks=True)
    refresh_catalog(copy)
    return content(copy)


def turn(log, i, *, fail=False, model="gpt-5"):
    """A realistic turn: a prompt, a command with 50 lines of output, a file change, its end."""
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"id": f"u{i}", "type": "user_message", "text": f"fix widget {i}"}})
    log.append(
        {
            "type": "item.completed",
            "item": {
                "id": f"c{i}",
                "type": "command_execution",
                "command": "cargo test",
                "aggregated_output": "\n".join(f"line {n} widget" for n in range(50)),
                "exit_code": 1 if fail else 0,
                "status": "failed" if fail else "completed",
            },
        }
    )
    log.append(
        {
            "type": "item.completed",
            "item": {
                "id": f"f{i}",
                "type": "file_change",
                "status": "completed",
                "changes": [{"path": f"src/f{i % 3}.rs", "kind": "update"}],
            },
        }
    )
    if fail:
        log.append({"type": "turn.failed", "message": "tests failed", "model": model})
    else:
        log.append(
            {
                "type": "turn.completed",
                "model": model,
                "usage": {"input_tokens": 100 * i, "cached_input_tokens": 10 * i, "output_tokens": i},
            }
        )


TURN_STARTED = {"type": "turn.started"}
TURN_COMPLETED = {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}}


def message(text: str) -> dict:
    return {"type": "item.completed", "item": {"id": text, "type": "agent_message", "text": text}}


def write_turns(log, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.append(TURN_STARTED)
        log.append(message(f"widget turn {i + 1}"))
        log.append(TURN_COMPLETED)


def catalog_rows(root: Path) -> dict:
    conn = sqlite3.connect(Path(root) / "catalog.db")
    try:
        return {
            "sessions": sorted(conn.execute("SELECT session_id, directory, turn_count, event_count FROM sessions")),
            "events": sorted(conn.execute("SELECT session_id, seq, type FROM events")),
            "chunks": sorted(conn.execute("SELECT chunk_id, session_id, source, text FROM chunks")),
        }
    finally:
        conn.close()


def vt_line(event: dict) -> bytes:
    """A log line as VT Code writes it: no seq, no time."""
    return orjson.dumps({"schema_version": "0.18.0", "event": event}) + b"\n"


def vt_code_session(root, sid, log: bytes, *, turn_count: int, event_count: int, retained_turn_base: int = 1):
    """A session as VT Code itself leaves one: events.jsonl (replaced atomically, as its cap
    rewrite does) and manifest.json, no memstore index."""
    directory = Path(root) / "sessions" / sid
    directory.mkdir(parents=True, exist_ok=True)
    staged = directory / "events.jsonl.tmp"
    staged.write_bytes(log)
    os.replace(staged, directory / "events.jsonl")
    (directory / "manifest.json").write_text(
        json.dumps(
            {
                "session_id": sid,
                "created_at": "2026-01-01T00:00:00Z",
                "updated_at": "2026-01-01T00:00:00Z",
                "status": "active",
                "turn_count": turn_count,
                "event_count": event_count,
                "in_turn": False,
                "retained_turn_base": retained_turn_base,
                "persisted_file_len": len(log),
            }
        )
    )
    return directory


def one_session(root, sid="s", text="the flaky websocket test"):
    with memstore.open_session(root, sid) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": text}})
        log.append({"type": "turn.completed", "usage": {}})
