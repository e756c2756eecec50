"""memstore.sql: one read-only statement over a real catalog, within bounds of time, rows, bytes,
value size and memory, with every write refused and free text readable only redacted."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp_support import SECRETS, SECRETS_SESSION, TILECACHE, StoreInfo

import memstore
from memstore.redact import redactor_for
from memstore.sql import (
    QueryError,
    QueryErrorKind,
    QueryLimits,
    ReadPolicy,
    catalog_policy,
    catalog_uri,
    query_catalog,
    run_query,
)


@pytest.fixture(scope="module")
def catalog(store: StoreInfo) -> Path:
    memstore.Store(store.root).refresh()
    return store.root / "catalog.db"


def _catalog_query(catalog: Path, sql: str, params=(), **limits) -> memstore.sql.QueryResult:
    redactor = redactor_for(catalog.parent)
    return run_query(catalog, sql, params, limits=QueryLimits(**limits), policy=catalog_policy(redactor))


def _refused(catalog: Path, sql: str, kind: QueryErrorKind = QueryErrorKind.REFUSED, **limits) -> str:
    with pytest.raises(QueryError) as caught:
        _catalog_query(catalog, sql, **limits)
    assert caught.value.kind is kind, (sql, caught.value)
    return str(caught.value)


def _snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def test_printf_of_a_huge_width_is_stopped_quickly_with_a_clear_error(catalog: Path):
    """SQLite's printf would loop for seconds over '%.*c' and then return NULL; here it is
    refused before it runs, in well under a second, saying why."""
    for sql in [
        "SELECT printf('%.*c', 900000000, 'x')",
        "SELECT format('%900000000d', 1)",
        "SELECT printf('%s %.*c', 'a', 2000000, 'y') FROM sessions",
    ]:
        started = time.monotonic()
        message = _refused(catalog, sql, QueryErrorKind.TOO_LARGE)
        assert time.monotonic() - started < 1.0, sql
        assert "printf()/format() could produce about" in message and "1048576 bytes" in message


def test_printf_within_bounds_is_sqlites_own(catalog: Path):
    """The guarded printf gives exactly what SQLite's printf gives, for every kind of conversion."""
    formats = [
        ("%5.2f|%-8s|%d%%", 3.14159, "ledger", 42),
        ("%q and %Q", "it's", None),
        ("%x %o %e", 255, 8, 12345.678),
        ("%,d rows in %.3s", 1234567, "cursor"),
        ("%.*c%s", 3, "=", "done"),
        ("%w", 'a"b'),
    ]
    plain = sqlite3.connect(":memory:")
    for args in formats:
        placeholders = ", ".join("?" * len(args))
        expected = plain.execute(f"SELECT printf({placeholders})", args).fetchone()[0]
        assert _catalog_query(catalog, f"SELECT printf({placeholders})", args).rows == [[expected]], args
        assert _catalog_query(catalog, f"SELECT format({placeholders})", args).rows == [[expected]], args


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO sessions (session_id) VALUES ('x')",
        "UPDATE turns SET status = 'completed'",
        "DELETE FROM events",
        "REPLACE INTO file_changes (session_id) VALUES ('x')",
        "WITH doomed AS (SELECT session_id FROM sessions) DELETE FROM file_changes WHERE session_id IN doomed",
        "CREATE TABLE notes (text)",
        "CREATE TEMP TABLE notes (text)",
        "CREATE INDEX hits ON events (name)",
        "CREATE TEMP VIEW v AS SELECT 1",
        "CREATE TRIGGER t AFTER INSERT ON events BEGIN SELECT 1; END",
        "DROP TABLE turns",
        "DROP VIEW chunks",
        "ALTER TABLE sessions ADD COLUMN owner TEXT",
        "ATTACH DATABASE 'other.db' AS other",
        "ATTACH DATABASE ':memory:' AS scratch",
        "DETACH DATABASE main",
        "VACUUM",
        "VACUUM INTO 'copy.db'",
        "REINDEX",
        "ANALYZE",
        "BEGIN IMMEDIATE",
        "COMMIT",
        "SAVEPOINT s",
        "PRAGMA journal_mode = DELETE",
        "PRAGMA user_version = 5",
        "PRAGMA query_only = 0",
        "PRAGMA writable_schema = ON",
        "  /* a comment first */ -- and another\n DELETE FROM sessions",
        "SELECT load_extension('/tmp/evil.so')",
    ],
)
def test_writes_attach_and_settings_are_refused_and_change_nothing(catalog: Path, sql: str):
    """Each statement is refused with an error that says what was refused; the catalog's files
    are byte for byte what they were, and no file appears beside them."""
    before = _snapshot(catalog.parent)
    with pytest.raises(QueryError) as caught:
        _catalog_query(catalog, sql)
    assert caught.value.kind is QueryErrorKind.REFUSED, caught.value
    assert str(caught.value).startswith("refused:")
    assert _snapshot(catalog.parent) == before


def test_a_runaway_query_is_stopped_at_the_time_limit(catalog: Path):
    started = time.monotonic()
    message = _refused(
        catalog,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        QueryErrorKind.TIME_LIMIT,
        max_seconds=0.3,
    )
    assert time.monotonic() - started < 3 and "longer than 0.3 s" in message


def test_rows_and_bytes_are_bounded(catalog: Path):
    """A huge LIMIT is cut at max_rows; wide rows are cut at max_result_bytes; either way the
    result says which bound cut it, and holds only whole rows."""
    limited = _catalog_query(catalog, "SELECT seq FROM events LIMIT 1000000000", max_rows=7)
    assert len(limited.rows) == 7 and limited.truncated == "rows"
    everything = _catalog_query(catalog, "SELECT count(*) FROM events").rows[0][0]
    whole = _catalog_query(catalog, "SELECT seq FROM events", max_rows=1000)
    assert len(whole.rows) == everything and whole.truncated is None
    wide = _catalog_query(catalog, "SELECT text FROM chunks", max_rows=1000, max_result_bytes=3_000)
    assert wide.truncated == "bytes" and 0 < wide.result_bytes <= 3_000
    assert wide.result_bytes == sum(len(r[0].encode()) for r in wide.rows)
    assert _refused(catalog, "SELECT length(zeroblob(5000000))", QueryErrorKind.TOO_LARGE)


def test_memory_is_bounded(tmp_path: Path, catalog: Path):
    """A query that needs more memory than heap_limit_bytes stops with a clear error. (In a
    child process: SQLite's heap limit is the process's, and is only ever lowered.)"""
    code = (
        "import sys\n"
        "from memstore.sql import QueryError, QueryLimits, run_query\n"
        "sql = 'WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 2000000) "
        "SELECT length(group_concat(hex(x * 1000003))) FROM c'\n"
        "limits = QueryLimits(max_value_bytes=500_000_000, heap_limit_bytes=16 << 20, max_seconds=60)\n"
        "try:\n"
        "    print(run_query(sys.argv[1], sql, limits=limits).rows)\n"
        "except QueryError as exc:\n"
        "    print(exc.kind.value, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(catalog)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("memory the query needed more memory than the 16 MiB"), done.stdout


def test_free_text_is_readable_only_redacted(catalog: Path):
    """Free-text columns come back redacted, and expressions over them (LIKE, instr, substr)
    see only the redacted text, so SQL cannot even test for a secret; reading them any other
    way is refused, as is every table that holds raw words."""
    for secret in SECRETS[:12]:
        assert _catalog_query(catalog, "SELECT count(*) FROM chunks WHERE instr(text, ?) > 0", [secret]).rows == [[0]]
        assert _catalog_query(
            catalog, "SELECT count(*) FROM events WHERE name LIKE '%' || ? || '%'", [secret[:20]]
        ).rows == [[0]]
    texts = _catalog_query(
        catalog,
        "SELECT text, substr(text, 1, 40), hex(text) FROM chunks WHERE session_id = ?",
        [SECRETS_SESSION],
        max_rows=1000,
        max_result_bytes=10_000_000,
    )
    shown = "\n".join(str(v) for row in texts.rows for v in row)
    assert not [s for s in SECRETS if s in shown] and "[REDACTED:" in shown
    assert "readable only as redacted" in _refused(catalog, "SELECT text FROM main.chunks")
    assert "readable only as redacted" in _refused(catalog, "SELECT command FROM main.commands")
    for table in ("search_postings", "search_docs", "chunks_fts", "chunks_fts_data", "catalog_state"):
        assert "not readable through SQL" in _refused(catalog, f"SELECT * FROM {table}")
    failed = _catalog_query(catalog, "SELECT message FROM errors WHERE session_id = ?", [TILECACHE])
    assert failed.rows == [["cargo test failed: 1 test failed"]]


def test_introspection_is_allowed(catalog: Path):
    """The schema can be read: table_info, pragma functions, sqlite_master."""
    columns = [row[1] for row in _catalog_query(catalog, "PRAGMA table_info(sessions)").rows]
    assert {"session_id", "agent", "cwd", "title"} <= set(columns)
    assert _catalog_query(catalog, "SELECT name FROM pragma_table_info('turns') WHERE name = 'model'").rows == [
        ["model"]
    ]
    views = _catalog_query(catalog, "SELECT name FROM sqlite_master WHERE type = 'view' ORDER BY name").rows
    assert ["commands"] in views and ["token_usage_daily"] in views


def test_one_statement_and_checked_parameters(catalog: Path):
    assert "only one statement" in _refused(catalog, "SELECT 1; SELECT 2", QueryErrorKind.INVALID)
    assert run_query(catalog, "SELECT :a || :b", {"a": "led", "b": "ger"}).rows == [["ledger"]]
    assert run_query(catalog, "SELECT ? * 2", [21]).rows == [[42]]
    for params, words in [
        ([{"x": 1}], "must be a string"),
        ([2**70], "64 bits"),
        (list(range(101)), "at most 100"),
        ("SELECT", "must be a list or an object"),
    ]:
        with pytest.raises(QueryError, match=words) as caught:
            run_query(catalog, "SELECT 1", params)
        assert caught.value.kind is QueryErrorKind.INVALID
    assert "no such column" in _refused(catalog, "SELECT nope FROM sessions", QueryErrorKind.INVALID)
    assert "20000" in _refused(catalog, "SELECT 1 -- " + "x" * 20_000, QueryErrorKind.TOO_LARGE)
    assert "empty" in _refused(catalog, "  ", QueryErrorKind.INVALID)


def test_limits_are_checked():
    for bad in ({"max_rows": 0}, {"max_seconds": -1}, {"max_result_bytes": 1.5}, {"heap_limit_bytes": 0}):
        with pytest.raises(ValueError):
            QueryLimits(**bad)


def test_a_policy_hides_tables_of_any_database(tmp_path: Path):
    """run_query works on any SQLite file; hidden tables are refused, the rest read."""
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE public (x); INSERT INTO public VALUES (1); CREATE TABLE private_keys (k);")
    conn.close()
    policy = ReadPolicy(hidden_tables=("private_*",))
    assert run_query(path, "SELECT x FROM public", policy=policy).rows == [[1]]
    with pytest.raises(QueryError, match="private_keys is not readable") as caught:
        run_query(path, "SELECT * FROM private_keys", policy=policy)
    assert caught.value.kind is QueryErrorKind.REFUSED
    with pytest.raises(QueryError) as missing:
        run_query(tmp_path / "missing.db", "SELECT 1")
    assert missing.value.kind is QueryErrorKind.UNAVAILABLE


def test_query_catalog_refreshes_first_and_prices_tokens(tmp_path: Path):
    """query_catalog sees a session appended a moment ago, and memstore_cost_usd prices tokens."""
    with memstore.open_session(tmp_path, "late-arrival") as log:
        log.append({"type": "turn.started"})
        log.append(
            {"type": "turn.completed", "usage": {"input_tokens": 1000, "output_tokens": 100}, "model": "gpt-5-codex"}
        )
    rows = query_catalog(
        tmp_path,
        "SELECT session_id, memstore_cost_usd(model, 'codex', input_tokens, "
        "cached_input_tokens, cache_creation_tokens, output_tokens, started_at) > 0 "
        "FROM turns WHERE session_id = ?",
        ["late-arrival"],
    ).rows
    assert rows == [["late-arrival", 1]]


def test_no_catalog_without_refresh_is_unavailable(tmp_path: Path):
    with pytest.raises(QueryError, match="no catalog at") as caught:
        catalog_uri(tmp_path, refresh=False)
    assert caught.value.kind is QueryErrorKind.UNAVAILABLE
