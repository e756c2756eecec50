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
        conn.executemany(
            "INSERT INTO late VALUES (?, ?)", [(r.seq, (r.event.get("item") or {}).get("text")) for r in records]
        )

    register_derived_table(
        DerivedTable("late", migrations, on_batch, lambda c, s: None, lambda c: c.execute("DELETE FROM late"))
    )
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


# --------------------------------------------------------------------------------------------
# The schema without sqlite-utils: DDL steps and the cached empty index


def _schema(conn: sqlite3.Connection) -> list[tuple]:
    return conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()


def test_the_ddl_of_the_session_tables_is_what_sqlite_utils_creates():
    """The session's own tables (and the migrations record) are created with plain SQL: the
    schema must be the one sqlite-utils' Table.create made for the same definitions, statement
    for statement, so old and new indexes are the same database."""
    import sqlite_utils

    from memstore.session.index import EVENT_DETAILS, LOG_MIGRATIONS

    def with_sqlite_utils(db) -> None:
        db["manifest"].create(
            {
                "id": int,
                "session_id": str,
                "schema_version": int,
                "created_at": str,
                "updated_at": str,
                "turn_count": int,
                "event_count": int,
                "status": str,
                "in_turn": int,
                "persisted_file_len": int,
                "retained_turn_base": int,
                "next_seq": int,
                "generation": int,
                "source": str,
                "tail": bytes,
            },
            pk="id",
            not_null={"session_id", "created_at", "updated_at", "status", "tail"},
        )
        db["turns"].create(
            {
                "number": int,
                "status": str,
                "start_offset": int,
                "end_offset": int,
                "event_count": int,
                "first_seq": int,
                "last_seq": int,
                "started_at": str,
                "ended_at": str,
                "input_tokens": int,
                "cached_input_tokens": int,
                "cache_creation_tokens": int,
                "output_tokens": int,
                "error": str,
                "model": str,
            },
            pk="number",
            not_null={"status", "start_offset", "end_offset", "event_count"},
        )
        db["events"].create(
            {"seq": int, "offset": int, "length": int, "turn": int, "ts": str, "type": str},
            pk="seq",
            not_null={"offset", "length", "type"},
        )
        db["derived_state"].create({"id": int, "seq": int}, pk="id", not_null={"seq"})

    def details_with_sqlite_utils(db) -> None:
        db["event_details"].create(
            {"seq": int, "item_type": str, "item_id": str, "name": str, "status": str, "exit_code": int}, pk="seq"
        )

    plain = sqlite3.connect(":memory:", isolation_level=None)
    LOG_MIGRATIONS.apply(plain)
    EVENT_DETAILS.migrations.apply(plain)
    reference = sqlite3.connect(":memory:", isolation_level=None)
    MigrationSet(LOG_MIGRATIONS.name, (("log_tables_3", with_sqlite_utils),)).apply(reference)
    MigrationSet(EVENT_DETAILS.migrations.name, (("event_details", details_with_sqlite_utils),)).apply(reference)
    assert sqlite_utils.Database(reference)["_sqlite_migrations"].exists()
    assert _schema(plain) == _schema(reference)
    recorded = "SELECT migration_set, name FROM _sqlite_migrations ORDER BY id"
    assert plain.execute(recorded).fetchall() == reference.execute(recorded).fetchall()


def test_ddl_and_sqlite_utils_steps_migrate_an_old_index_in_order(tmp_path):
    """A database some of whose migrations are pending gets exactly the pending ones, in order,
    whichever way each is written, and a failing DDL step stays pending (nothing half-applied)."""
    from memstore.session.index import DDL

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    first = MigrationSet("test.old", (("one", DDL(('CREATE TABLE "one" ("x" INTEGER)',))),))
    first.apply(conn)
    both = MigrationSet(
        "test.old",
        (
            ("one", DDL(('CREATE TABLE "one" ("x" INTEGER)',))),
            ("two", lambda db: db["two"].create({"y": str})),
            ("three", DDL(('CREATE TABLE "three" ("z" INTEGER)', 'CREATE INDEX "three_z" ON "three" ("z")'))),
        ),
    )
    assert both.pending(conn) == ["two", "three"]
    both.apply(conn)
    assert both.pending(conn) == []
    assert conn.execute(
        "SELECT name FROM _sqlite_migrations WHERE migration_set = 'test.old' ORDER BY id"
    ).fetchall() == [("one",), ("two",), ("three",)]
    broken = MigrationSet("test.old", (("four", DDL(('CREATE TABLE "four" ("a")', 'CREATE TABLE "one" ("x")'))),))
    with pytest.raises(sqlite3.OperationalError):
        broken.apply(conn)
    assert broken.pending(conn) == ["four"]
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'four'").fetchone()[0] == 0


def test_the_empty_index_is_cached_and_a_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    """With a step written for sqlite-utils registered, the empty index is built once and kept in
    the cache directory; a cache file that is damaged, of another schema, or not private is not
    used (and is replaced); a cache directory that cannot be written only costs the build."""
    import os

    from memstore.session import schema
    from memstore.session.index import INDEX_FORMAT, LOG_MIGRATIONS

    sets = (LOG_MIGRATIONS, MigrationSet("test.cached", (("words", lambda db: db["words"].create({"w": str})),)))
    monkeypatch.setenv("MEMSTORE_CACHE_DIR", str(tmp_path / "cache"))
    built = schema.template_bytes(sets, INDEX_FORMAT)
    (cached,) = (tmp_path / "cache").glob("index-template-*.db")
    assert cached.read_bytes() == built
    assert stat_mode(cached) == 0o600 and stat_mode(tmp_path / "cache") == 0o700
    assert schema.template_bytes(sets, INDEX_FORMAT) == built  # read back, not built again

    other = (LOG_MIGRATIONS, MigrationSet("test.cached", (("words", lambda db: db["words"].create({"w": int})),)))
    schema.template_bytes(other, INDEX_FORMAT)
    assert len(list((tmp_path / "cache").glob("index-template-*.db"))) == 2, "another schema shared a cache file"

    for damage in (b"", b"not a database" * 100, built[: len(built) // 2]):
        cached.write_bytes(damage)
        data = schema.template_bytes(sets, INDEX_FORMAT)
        probe = sqlite3.connect(":memory:")
        probe.deserialize(data)
        assert probe.execute("SELECT count(*) FROM sqlite_master WHERE name = 'words'").fetchone()[0] == 1
        assert cached.read_bytes() == data, "the damaged cache file was not replaced"
    os.chmod(cached, 0o666)  # writable by others: not trusted, built again and replaced
    assert _schema_of(schema.template_bytes(sets, INDEX_FORMAT)) == _schema_of(built)
    assert stat_mode(cached) == 0o600

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("MEMSTORE_CACHE_DIR", str(blocked))
    probe = sqlite3.connect(":memory:")
    probe.deserialize(schema.template_bytes(sets, INDEX_FORMAT))
    assert probe.execute("SELECT count(*) FROM sqlite_master WHERE name = 'words'").fetchone()[0] == 1


def _schema_of(data: bytes) -> list[tuple]:
    conn = sqlite3.connect(":memory:")
    conn.deserialize(data)
    return _schema(conn)


def stat_mode(path) -> int:
    import os
    import stat

    return stat.S_IMODE(os.stat(path).st_mode)
