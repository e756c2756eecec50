"""Sessions VT Code's own migration made (reference 9.3): a directory with manifest.json and
derived/memory.json and no events.jsonl. They are sessions: the catalog lists them, with the
status their manifest gives, and search finds their facts. They were invisible to search."""

from __future__ import annotations

import os

import orjson
from catalog_support import content, from_scratch, turn

import memstore
from memstore.catalog import refresh_catalog
from memstore.layout import is_legacy_session, iter_session_dirs


def migrated_session(root, sid: str, facts: list[str], *, mtime_iso: str = "2026-01-05T10:00:00Z"):
    """What VT Code's migrate_legacy writes for ``history/<sid>.json``: a completed manifest with
    no turns, the envelope's bytes as derived/memory.json, no log."""
    directory = root / "sessions" / sid
    (directory / "derived").mkdir(parents=True)
    (directory / "manifest.json").write_bytes(
        orjson.dumps(
            {
                "session_id": sid,
                "created_at": mtime_iso,
                "updated_at": mtime_iso,
                "status": "completed",
                "turn_count": 0,
                "event_count": 0,
                "in_turn": False,
                "persisted_file_len": 0,
                "retained_turn_base": 1,
            }
        )
    )
    (directory / "derived" / "memory.json").write_bytes(
        orjson.dumps(
            {
                "session_id": sid,
                "generated_at": mtime_iso,
                "grounded_facts": [{"fact": fact, "source": "user_assertion"} for fact in facts],
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    return directory


def test_a_migrated_session_is_listed_and_its_facts_are_found(tmp_path):
    with memstore.open_session(tmp_path, "native") as log:
        turn(log, 1)
    migrated_session(tmp_path, "session-foo.memory", ["the widget is blue", "deploys go through staging"])
    report = refresh_catalog(tmp_path)
    assert sorted(report.added) == ["native", "session-foo.memory"] and not report.errors
    import sqlite3

    conn = sqlite3.connect(tmp_path / "catalog.db")
    try:
        row = conn.execute(
            "SELECT session_id, directory, status, created_at, turn_count, event_count, agent "
            "FROM sessions WHERE session_id = 'session-foo.memory'"
        ).fetchone()
    finally:
        conn.close()
    assert row == ("session-foo.memory", "session-foo.memory", "completed", "2026-01-05T10:00:00Z", 0, 0, "vtcode")
    hits = memstore.search_memory(tmp_path, "staging")
    assert [(h.session_id, h.source, h.chunk_id) for h in hits] == [
        ("session-foo.memory", "session", "session-foo.memory:1")
    ]
    assert hits[0].path.endswith(os.path.join("sessions", "session-foo.memory", "derived", "memory.json"))
    assert {h.session_id for h in memstore.search_memory(tmp_path, "widget", 20)} == {"native", "session-foo.memory"}


def test_a_migrated_session_follows_its_files(tmp_path):
    """New facts replace the old; status from the manifest; a view removed, no session any more
    (as a catalog built from scratch would say at every step)."""
    directory = migrated_session(tmp_path, "m", ["alpha fact"])
    store = memstore.Store(tmp_path, sweep_interval=0)
    assert [h.session_id for h in store.search("alpha")] == ["m"]
    migrated_session_view = directory / "derived" / "memory.json"
    migrated_session_view.write_bytes(
        orjson.dumps({"session_id": "m", "grounded_facts": [{"fact": "beta fact", "source": "user_assertion"}]})
    )
    assert store.search("alpha") == [] and [h.session_id for h in store.search("beta")] == ["m"]
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)
    migrated_session_view.unlink()
    assert store.search("beta") == []
    assert content(tmp_path)["sessions"] == []
    store.close()


def test_the_catalog_lists_the_legacy_sessions_layout_lists(tmp_path):
    """The catalog's sessions are those ``iter_session_dirs(include_legacy=True)`` lists: a
    legacy session with only a trajectory is listed too (with no facts to search), a directory
    with a manifest alone is no session."""
    with memstore.open_session(tmp_path, "native") as log:
        turn(log, 1)
    migrated_session(tmp_path, "migrated", ["a fact"])
    trajectory_only = migrated_session(tmp_path, "trajectory-only", [])
    os.replace(trajectory_only / "derived" / "memory.json", trajectory_only / "derived" / "trajectory.jsonl")
    (tmp_path / "sessions" / "manifest-only").mkdir()
    (tmp_path / "sessions" / "manifest-only" / "manifest.json").write_bytes(b"{}")
    listed = {e.name for e in iter_session_dirs(tmp_path, require_log=True, include_legacy=True)}
    assert listed == {"native", "migrated", "trajectory-only"}
    assert is_legacy_session(trajectory_only) and not is_legacy_session(tmp_path / "sessions" / "manifest-only")
    report = refresh_catalog(tmp_path)
    assert report.errors == []
    assert {row[0] for row in content(tmp_path)["sessions"]} == listed
