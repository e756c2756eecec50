"""The per-session index: migrations, derived tables kept in its transactions, generations."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from support import TURN_COMPLETED, TURN_STARTED

import memstore
from memstore.session.index import DerivedTable, MigrationSet, register_derived_table, unregister_derived_table
from memstore.session.tuning import TUNING


def message(text: str) -> dict:
    return {"type": "item.completed", "item": {"id": text, "type": "agent_message", "text": text}}


@pytest.fixture
def word_table():
    """A derived table of the words of agent messages, registered for the test."""
    calls = {"batch": 0, "evict": [], "reset": 0}
    def create(db) -> None:
        db["words"].create({"seq": int, "turn": int, "word": str})

    words_migrations = MigrationSet("test.words", (("create_words", create),))

    def on_batch(conn, records):
        calls["batch"] += 1
        rows = []
        for record in records:
            item = record.event.get("item") or {}
            for word in str(item.get("text", "")).split():
                rows.append((record.seq, record.turn, word))
        conn.executemany("INSERT INTO words VALUES (?, ?, ?)", rows)

    def on_evict(conn, first_kept_seq):
        calls["evict"].append(first_kept_seq)
        if first_kept_seq is None:
            conn.execute("DELETE FROM words")
        else:
            conn.execute("DELETE FROM words WHERE seq < ?", (first_kept_seq,))

    def on_reset(conn):
        calls["reset"] += 1
        conn.execute("DELETE FROM words")

    register_derived_table(DerivedTable("words", words_migrations, on_batch, on_evict, on_reset))
    yield calls
    unregister_derived_table("words")


def words(root, sid="s"):
    conn = sqlite3.connect(memstore.session_directory(root, sid) / "index" / "session.db")
    try:
        return conn.execute("SELECT seq, turn, word FROM words ORDER BY seq, rowid").fetchall()
    finally:
        conn.close()


def test_a_derived_table_is_kept_current_and_equals_a_rebuild(tmp_path, word_table, monkeypatch):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        event = message("hello brave world")
        log.append(event)
        event["item"]["text"] = "changed after append"  # the derived rows follow the log, not the dict
        log.append(TURN_COMPLETED)
        log.append(TURN_STARTED)
        log.append(message("second turn"))
    assert word_table["batch"] >= 1
    incremental = words(tmp_path)
    assert incremental == [(2, 1, "hello"), (2, 1, "brave"), (2, 1, "world"), (5, 2, "second"), (5, 2, "turn")]
    memstore.rebuild(tmp_path, "s")  # a small log: a new index, built in memory
    assert words(tmp_path) == incremental
    # A log too big for that is rebuilt in place: the table is reset first.
    monkeypatch.setattr(TUNING, "memory_scan_bytes", 0)
    resets = word_table["reset"]
    memstore.rebuild(tmp_path, "s")
    assert word_table["reset"] == resets + 1
    assert words(tmp_path) == incremental


def test_a_derived_table_follows_cap_evictions(tmp_path, word_table):
    with memstore.open_session(tmp_path, "s", max_events=6) as log:
        for i in range(4):
            log.append(TURN_STARTED)
            log.append(message(f"w{i}"))
            log.append(TURN_COMPLETED)
        retained = [r.seq for r in log.iter_records()]
    assert word_table["evict"], "the cap rewrite did not tell the derived table"
    assert [row[0] for row in words(tmp_path)] == [s for s in retained if s % 3 == 2]
    incremental = words(tmp_path)
    memstore.rebuild(tmp_path, "s")
    assert words(tmp_path) == incremental


def test_an_index_without_a_new_derived_table_is_rebuilt(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(message("written before the table existed"))
        log.append(TURN_COMPLETED)
    def create(db):
        db["late"].create({"seq": int, "text": str})

    migrations = MigrationSet("test.late", (("create_late", create),))

    def on_batch(conn, records):
        conn.executemany("INSERT INTO late VALUES (?, ?)",
                         [(r.seq, (r.event.get("item") or {}).get("text")) for r in records])

    register_derived_table(DerivedTable("late", migrations, on_batch, lambda c, s: None,
                                        lambda c: c.execute("DELETE FROM late")))
    try:
        with memstore.open_session(tmp_path, "s") as log:
            assert log.turn_count == 1
        conn = sqlite3.connect(memstore.session_directory(tmp_path, "s") / "index" / "session.db")
        rows = conn.execute("SELECT seq, text FROM late ORDER BY seq").fetchall()
        conn.close()
        assert rows == [(1, None), (2, "written before the table existed"), (3, None)]
    finally:
        unregister_derived_table("late")


def test_generation_changes_on_rebuild_and_cap_rewrite_but_not_on_growth(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=8) as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
        first = log.manifest.generation
        assert first > 0
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
        assert log.manifest.generation == first  # grew: same generation
    with memstore.open_session(tmp_path, "s", max_events=8) as log:
        assert log.manifest.generation == first  # a clean reopen keeps it
        for _ in range(3):
            log.append(TURN_STARTED)
            log.append(TURN_COMPLETED)  # 10 > 8: a cap rewrite
        rewritten = log.manifest.generation
        assert rewritten != first
    assert memstore.rebuild(tmp_path, "s").generation not in (first, rewritten)


def test_duplicate_derived_table_names_are_refused(word_table):
    with pytest.raises(ValueError):
        register_derived_table(DerivedTable("words", MigrationSet("x", ()), None, None, None))


def test_a_new_index_is_private_from_its_first_byte_and_never_a_symlink(tmp_path):
    import os
    import stat

    target = tmp_path / "elsewhere.db"
    directory = memstore.session_directory(tmp_path, "s")
    (directory / "index").mkdir(parents=True)
    (directory / "index" / "session.db").symlink_to(target)
    with pytest.raises(memstore.StoreIOError, match="symlink"):
        memstore.open_session(tmp_path, "s")
    assert not target.exists()
    os.unlink(directory / "index" / "session.db")
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        assert stat.S_IMODE(os.stat(log.index_path).st_mode) == 0o600
    shutil.rmtree(tmp_path / "sessions")
