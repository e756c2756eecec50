"""Writing sessions' rows into the catalog, a batch of sessions per transaction.

A batch is one ``BEGIN IMMEDIATE ... COMMIT``: Datasette and searches, reading meanwhile, see
every session of it or none (never half of one), and the costs a transaction has whatever its
size (the commit, the search index's segment, FTS5's segment) are paid once per batch, not once
per session. Inside it:

- each session's rows (events, changed files, turns, its ``sessions`` and ``catalog_state``
  rows) are written with ``executemany`` in a SAVEPOINT of its own, so a session whose rows
  SQLite refuses is left out alone;
- the chunks of the whole batch reach ``chunks`` in one ``INSERT ... SELECT`` from a staging
  table: the FTS5 trigger then writes one FTS5 segment for the batch (row by row, an
  ``executemany`` makes one per row, which FTS5's automerge rewrites again and again);
- the search index removes the replaced chunks and indexes the new ones in one call each (one
  segment per batch).

A failure of the catalog itself (a full disk, a file-size limit, a read-only file) aborts the
batch, rolled back whole, and is raised as :class:`StoreIOError` naming ``catalog.db``.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Optional

from ..bm25 import SearchIndex
from ..session.index import TURN_COLUMNS
from .copy import CHUNK_COLUMNS, EVENT_COLUMNS, FILE_CHANGE_COLUMNS, SESSION_COLUMNS, STATE_ROW_COLUMNS, SessionCopy
from .schema import SQLITE_CANTOPEN, SQLITE_FULL, SQLITE_IOERR, SQLITE_PERM, SQLITE_READONLY, storage_error

logger = logging.getLogger("memstore.catalog")

_STAGE = "chunks_stage"
_N_CHUNK_COLUMNS = 1 + CHUNK_COLUMNS.count(",") + 1  # id, then the copy's columns


def _values(columns: str) -> str:
    return ", ".join("?" * (columns.count(",") + 1))


_EVENT_INSERT = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ({_values(EVENT_COLUMNS)})"
_FILE_CHANGE_INSERT = f"INSERT INTO file_changes ({FILE_CHANGE_COLUMNS}) VALUES ({_values(FILE_CHANGE_COLUMNS)})"
_STATE_UPSERT = f"INSERT OR REPLACE INTO catalog_state ({STATE_ROW_COLUMNS}) VALUES ({_values(STATE_ROW_COLUMNS)})"
_SESSION_UPSERT = (
    f"INSERT OR REPLACE INTO sessions ({SESSION_COLUMNS}, model, turns_failed, input_tokens, "
    "cached_input_tokens, cache_creation_tokens, output_tokens, cost_usd, cost_estimated, "
    f"cost_unpriced_turns) VALUES ({_values(SESSION_COLUMNS)}, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_TOTALS = (
    "SELECT (SELECT model FROM turns WHERE session_id = ?1 AND model IS NOT NULL ORDER BY number DESC LIMIT 1), "
    "coalesce(sum(status = 'failed'), 0), CAST(total(input_tokens) AS INTEGER), "
    "CAST(total(cached_input_tokens) AS INTEGER), CAST(total(cache_creation_tokens) AS INTEGER), "
    "CAST(total(output_tokens) AS INTEGER), count(cost_usd), total(cost_usd), "
    "total(CASE WHEN cost_source = 'estimated' THEN cost_usd END), coalesce(sum(cost_usd IS NULL), 0) "
    "FROM turns WHERE session_id = ?1"
)
_FATAL = {
    SQLITE_FULL,
    SQLITE_IOERR,
    SQLITE_READONLY,
    SQLITE_CANTOPEN,
    SQLITE_PERM,
    7,
    11,
    26,
}  # + NOMEM, CORRUPT, NOTADB
_ROW_TABLES = ("file_changes", "events", "turns", "sessions")


_ORIGIN_AT = SESSION_COLUMNS.split(", ").index("origin_store_id")
_OWN_ORIGIN_STALE = (
    "SELECT 1 FROM sessions WHERE origin_session_id IS NULL "
    "AND (origin_store_id IS NOT ?1 OR origin_label IS NOT ?2) LIMIT 1"
)
_OWN_ORIGIN_UPDATE = (
    "UPDATE sessions SET origin_store_id = ?1, origin_label = ?2 WHERE origin_session_id IS NULL "
    "AND (origin_store_id IS NOT ?1 OR origin_label IS NOT ?2)"
)


_TURN_INSERT = (
    f"INSERT OR REPLACE INTO turns (session_id, {', '.join(TURN_COLUMNS)}, duration_ms, cost_usd, "
    f"cost_source, price_version) VALUES ({', '.join('?' * (len(TURN_COLUMNS) + 5))})"
)


@dataclass
class BatchResult:
    """What a batch wrote: the copies written, and those left out with why (``errors``:
    directory name -> reason)."""

    written: list[SessionCopy] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def is_fatal(exc: BaseException) -> bool:
    """Whether ``exc`` says the catalog itself cannot be written (as opposed to one session's
    rows being refused)."""
    if not isinstance(exc, sqlite3.Error):
        return False
    if isinstance(exc, (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.ProgrammingError)):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    return code is None or (code & 0xFF) in _FATAL


class CatalogWriter:
    """Writes batches into the catalog behind ``conn`` (which the caller holds the store's
    ``catalog`` lock for), indexing their chunks in ``search``. ``own_origin`` (this store's
    id and label) is what a session born in this store records as its origin."""

    def __init__(self, conn: sqlite3.Connection, search: SearchIndex, path: str):
        self.conn = conn
        self.search = search
        self.path = path
        self.own_origin: Optional[tuple[str, str]] = None

    def update_own_origin(self) -> int:
        """Give every session born in this store (no ``origin_session_id``) this store's id and
        label as its origin, where it records others (the label was changed, or the identity
        could not be read when the session was copied); return how many rows changed. Nothing
        is written, and no write lock taken, when every row is current."""
        own = self.own_origin
        if own is None or self.conn.execute(_OWN_ORIGIN_STALE, own).fetchone() is None:
            return 0
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            changed = self.conn.execute(_OWN_ORIGIN_UPDATE, own).rowcount
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise storage_error("write", self.path, exc) from exc
        return changed

    def write(self, copies: list[SessionCopy], forget: Iterable[tuple[str, str]] = ()) -> BatchResult:
        """Write ``copies`` and forget the directories ``forget`` (``(name, session id)``) in one
        transaction. A session whose rows are refused is left out (in ``errors``) and the others
        written; a failure of the catalog itself raises :class:`StoreIOError` and writes nothing."""
        forget = list(forget)
        try:
            return self._write(copies, forget)
        except sqlite3.Error as exc:
            self._rollback()
            if is_fatal(exc):
                raise storage_error("write", self.path, exc) from exc
            if len(copies) <= 1 and not forget:
                result = BatchResult()
                for copy in copies:
                    result.errors[copy.name] = f"the catalog refused its rows: {exc}"
                return result
            # One session's rows broke the batch's one statement: write each alone to find it.
            logger.info("catalog: a batch of %d sessions failed (%s); writing them one by one", len(copies), exc)
            result = self.write([], forget) if forget else BatchResult()
            for copy in copies:
                one = self.write([copy])
                result.written += one.written
                result.errors.update(one.errors)
            return result
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                logger.warning("catalog: rollback failed: %s", exc)

    def _write(self, copies: list[SessionCopy], forget: list[tuple[str, str]]) -> BatchResult:
        conn = self.conn
        result = BatchResult()
        conn.execute("BEGIN IMMEDIATE")
        removed: list[int] = []
        for name, session_id in forget:
            removed += self._forget(session_id)
            conn.execute("DELETE FROM catalog_state WHERE directory = ?", (name,))
        next_id = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM chunks").fetchone()[0]
        known = self._known({session_id for copy in copies if copy.full for session_id in copy.forget})
        staged: list[tuple] = []
        for copy in copies:
            conn.execute("SAVEPOINT memstore_session")
            try:
                gone = self._session_rows(copy, known)
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO memstore_session")
                conn.execute("RELEASE memstore_session")
                if is_fatal(exc):
                    raise
                logger.warning(
                    "catalog: leaving out session directory %s: the catalog refused its rows: %s", copy.name, exc
                )
                result.errors[copy.name] = f"the catalog refused its rows: {exc}"
                continue
            conn.execute("RELEASE memstore_session")
            known.add(copy.session_id)  # it has rows now
            removed += gone
            for row in copy.chunks:
                staged.append((next_id, *row))
                next_id += 1
            for row in copy.facts or ():
                staged.append((next_id, *row))
                next_id += 1
            result.written.append(copy)
        if removed:
            self.search.remove(removed)
        if staged:
            self._insert_chunks(staged)
            self.search.add((row[0], row[12], row[11]) for row in staged)
        conn.execute("COMMIT")
        return result

    def _known(self, session_ids: set[str]) -> set[str]:
        """Which of ``session_ids`` the catalog has rows of: a session's rows are written
        together with its ``sessions`` row, in one savepoint, so that row says. A build from
        scratch then spends nothing forgetting sessions the catalog never had."""
        if not session_ids:
            return set()
        rows = self.conn.execute(
            "SELECT session_id FROM sessions WHERE session_id IN (SELECT value FROM json_each(?))",
            (json.dumps(sorted(session_ids)),),
        )
        return {row[0] for row in rows}

    def _session_rows(self, copy: SessionCopy, known: set[str]) -> list[int]:
        """Write one session's rows (not its chunks: the batch stages those); return the ids of
        the chunks it replaced (removed from the search index by the caller). ``known``: the
        session ids of the batch's full copies the catalog has rows of."""
        conn = self.conn
        removed: list[int] = []
        if copy.full:
            for session_id in copy.forget:
                if session_id in known:
                    removed += self._forget(session_id)
        elif copy.facts is not None:
            removed += [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM chunks WHERE session_id = ? AND source = 'session'", (copy.session_id,)
                )
            ]
            if removed:
                conn.execute("DELETE FROM chunks WHERE session_id = ? AND source = 'session'", (copy.session_id,))
        if not copy.full:
            conn.execute("DELETE FROM turns WHERE session_id = ? AND number >= ?", (copy.session_id, copy.turns_from))
        if copy.events:
            conn.executemany(_EVENT_INSERT, copy.events)
        if copy.file_changes:
            conn.executemany(_FILE_CHANGE_INSERT, copy.file_changes)
        if copy.turns:
            conn.executemany(_TURN_INSERT, copy.turns)
        totals = conn.execute(_TOTALS, (copy.session_id,)).fetchone()
        model, failed, tokens_in, cached, created, tokens_out, priced, usd, estimated, unpriced = totals
        reported = copy.state[9]
        cost: tuple[Optional[float], Optional[float], int]
        if reported is not None:
            cost = (reported, 0.0, 0)
        elif priced:
            cost = (usd, estimated, unpriced)
        else:
            cost = (None, None, unpriced)
        session = copy.session
        if self.own_origin is not None and session[_ORIGIN_AT + 2] is None:
            session = (*session[:_ORIGIN_AT], *self.own_origin, *session[_ORIGIN_AT + 2 :])
        conn.execute(_SESSION_UPSERT, (*session, model, failed, tokens_in, cached, created, tokens_out, *cost))
        conn.execute(_STATE_UPSERT, copy.state)
        return removed

    def _forget(self, session_id: str) -> list[int]:
        conn = self.conn
        ids = [row[0] for row in conn.execute("SELECT id FROM chunks WHERE session_id = ?", (session_id,))]
        if ids:
            conn.execute("DELETE FROM chunks WHERE session_id = ?", (session_id,))
        for table in _ROW_TABLES:
            conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
        return ids

    def _insert_chunks(self, rows: list[tuple]) -> None:
        conn = self.conn
        # In the transaction: a rolled back batch takes the table with it, and the next makes it again.
        conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} AS SELECT * FROM main.chunks WHERE 0")
        conn.execute(f"DELETE FROM temp.{_STAGE}")
        conn.executemany(f"INSERT INTO temp.{_STAGE} VALUES ({', '.join('?' * _N_CHUNK_COLUMNS)})", rows)
        conn.execute(f"INSERT INTO main.chunks SELECT * FROM temp.{_STAGE}")
        conn.execute(f"DELETE FROM temp.{_STAGE}")
