"""``<root>/catalog.db``: every session of the store in one database, for search and SQL.

It holds one row per session (its manifest, where it came from, its totals), every turn, every
event (the analytics columns), the files changed, and every search chunk with FTS5, plus views
for the questions people ask (tool calls and their outcome, failed commands, tokens per day and
per model). Datasette serves it; ``search_memory`` ranks its chunks.

It is a regenerable view: :func:`refresh_catalog` brings it up to date incrementally. A session
whose log, manifest and index are unchanged since the last refresh is skipped after three
``stat`` calls; one that grew gets only its new rows; one whose ``generation`` changed (its
index was rebuilt, or a cap rewrite evicted), or whose log no longer starts with the bytes the
catalog copied (VT Code's own cap rewrite, which no generation tells), is copied again; one
that is gone, or is no session any more (no log), is forgotten.
Rows are copied from the session indexes with ``ATTACH`` + ``INSERT ... SELECT`` (never
re-parsing what an index already parsed); only what a session index does not hold yet (lines a
writer has not indexed, chunks its deriver has not made) comes from the session's reader. Each
session is updated in one transaction, so Datasette, querying meanwhile, never sees half of
one; the refresh holds the store's ``catalog`` lock and reads sessions without locking them.
Deleting ``catalog.db`` and refreshing gives the same content.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import sqlite3
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from .layout import (
    catalog_path,
    DERIVED_DIR,
    EVENTS_FILE,
    INDEX_DIR,
    INDEX_FILE,
    MANIFEST_FILE,
    MEMORY_FILE,
    SESSIONS_DIR,
    sessions_root,
)
from . import events as ev
from .views.chunks import event_chunks
from .bm25 import SearchIndex
from .errors import InvalidEvent, MemstoreError, SessionNotFound, StoreIOError
from .session.index import TURN_COLUMNS, MigrationSet, Turn, _is_corruption, file_stamp, readonly_uri
from .locks import store_lock
from .session.logfile import TAIL_BYTES
from .reader import SessionReader, read_session_dir
from .redact import Redactor, redactor_for

if TYPE_CHECKING:
    import sqlite_utils

logger = logging.getLogger("memstore")

_ATTEMPTS = 3
_SQLITE_FULL = 13
_TITLE_CHARS = 200


@dataclass
class RefreshReport:
    """What a refresh changed: sessions ``added``, ``updated`` (grew), ``recopied`` (rewritten),
    ``removed`` and left ``unchanged``, and the sessions it could not read (``errors``: id and
    reason; they are tried again on the next refresh)."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    recopied: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.recopied or self.removed)



# --------------------------------------------------------------------------------------------
# Schema


def _create_tables(db: "sqlite_utils.Database") -> None:
    db["sessions"].create(
        {
            "session_id": str, "directory": str, "status": str, "created_at": str, "updated_at": str,
            "turn_count": int, "event_count": int, "retained_turn_base": int, "generation": int,
            "agent": str, "agent_version": str, "cwd": str, "git_branch": str, "source_path": str,
            "parent_session_id": str, "title": str, "model": str, "turns_failed": int,
            "input_tokens": int, "cached_input_tokens": int, "cache_creation_tokens": int, "output_tokens": int,
            "log_bytes": int,
        },
        pk="session_id",
    )
    db["sessions"].create_index(["updated_at"], index_name="sessions_updated")
    db["sessions"].create_index(["directory"], index_name="sessions_directory", unique=True)
    db["turns"].create(
        {"session_id": str, **{c: (int if c not in ("status", "started_at", "ended_at", "error", "model") else str)
                               for c in TURN_COLUMNS},
         "duration_ms": int},
        pk=("session_id", "number"),
    )
    db["turns"].create_index(["started_at"], index_name="turns_started")
    db["events"].create(
        {"session_id": str, "seq": int, "turn": int, "ts": str, "type": str, "item_type": str, "item_id": str,
         "name": str, "status": str, "exit_code": int, "offset": int, "length": int},
        pk=("session_id", "seq"),
    )
    db["events"].create_index(["session_id", "turn"], index_name="events_turn")
    db["events"].create_index(["item_type", "status"], index_name="events_item_type")
    db["file_changes"].create({"session_id": str, "seq": int, "turn": int, "path": str, "kind": str})
    db["file_changes"].create_index(["session_id", "seq"], index_name="file_changes_session")
    db["file_changes"].create_index(["path"], index_name="file_changes_path")
    db["chunks"].create(
        {"id": int, "chunk_id": str, "session_id": str, "seq": int, "turn": int, "part": int, "source": str,
         "kind": str, "path": str, "start_line": int, "end_line": int, "created_at": str, "text": str},
        pk="id",
        not_null={"chunk_id", "session_id", "source", "text"},
    )
    db["chunks"].create_index(["chunk_id"], index_name="chunks_chunk_id", unique=True)
    db["chunks"].create_index(["session_id", "seq"], index_name="chunks_session_seq")
    db["chunks"].create_index(["created_at"], index_name="chunks_created")
    db["chunks"].enable_fts(["text"], fts_version="FTS5", create_triggers=True, tokenize="unicode61")
    # Where each session stands: what the catalog copied, and the file stamps that say whether
    # anything changed since.
    db["catalog_state"].create(
        {"directory": str, "session_id": str, "generation": int, "seq": int, "last_turn": int, "stamp": str},
        pk="directory",
    )


def _create_views(db: "sqlite_utils.Database") -> None:
    # Token sums are total() cast back to integers: SQLite's sum() raises on overflow, and a
    # hostile (or merely huge) usage must not break a page.
    db.create_view("tool_calls", """
        SELECT session_id, seq, turn, ts, item_type, name AS tool, status AS outcome,
               status IN ('failed', 'error', 'declined', 'permission_rejected', 'permission_cancelled',
                          'hook_denied', 'invalid_tool', 'cancelled') AS failed
        FROM events
        WHERE type = 'item.completed' AND item_type IN ('tool_invocation', 'tool_call', 'mcp_tool_call')
    """)
    db.create_view("commands", """
        SELECT session_id, seq, turn, ts, name AS command, exit_code, status,
               (coalesce(exit_code, 0) != 0 OR status = 'failed') AS failed
        FROM events
        WHERE type = 'item.completed' AND item_type = 'command_execution'
    """)
    db.create_view("errors", """
        SELECT session_id, number AS turn, ended_at AS ts, 'turn ' || status AS what, error AS message
        FROM turns WHERE status = 'failed'
        UNION ALL
        SELECT e.session_id, e.turn, e.ts, e.type, c.text
        FROM events e LEFT JOIN chunks c ON c.session_id = e.session_id AND c.seq = e.seq AND c.part = 0
        WHERE e.type = 'error' OR (e.type = 'item.completed' AND e.item_type = 'error')
    """)
    db.create_view("token_usage_daily", """
        SELECT substr(coalesce(started_at, ended_at), 1, 10) AS day, coalesce(model, '') AS model,
               count(*) AS turns, CAST(total(input_tokens) AS INTEGER) AS input_tokens, CAST(total(cached_input_tokens) AS INTEGER) AS cached_input_tokens,
               CAST(total(cache_creation_tokens) AS INTEGER) AS cache_creation_tokens, CAST(total(output_tokens) AS INTEGER) AS output_tokens
        FROM turns GROUP BY day, model
    """)
    db.create_view("token_usage_by_model", """
        SELECT coalesce(model, '') AS model, count(*) AS turns, CAST(total(input_tokens) AS INTEGER) AS input_tokens,
               CAST(total(cached_input_tokens) AS INTEGER) AS cached_input_tokens, CAST(total(cache_creation_tokens) AS INTEGER) AS cache_creation_tokens,
               CAST(total(output_tokens) AS INTEGER) AS output_tokens,
               round(total(cached_input_tokens) / nullif(total(input_tokens), 0), 4) AS cache_hit_rate
        FROM turns GROUP BY model
    """)


def _fact_ids_by_directory(db: "sqlite_utils.Database") -> None:
    # Facts of sessions with hashed ids were named <session>:<index>: such sessions are read
    # again at the next refresh, which names them <directory>:<index>.
    db.execute("UPDATE catalog_state SET stamp = '' WHERE directory != session_id")


def _normal_chunk_times(db: "sqlite_utils.Database") -> None:
    db.execute(f"UPDATE chunks SET created_at = memstore_ts(created_at) WHERE NOT {_IS_MEMSTORE_TS.format('created_at')}")


def _log_tails(db: "sqlite_utils.Database") -> None:
    # How far the catalog copied each log and the bytes that end there: a log that no longer
    # has them was rewritten (VT Code's cap rewrite gives no generation). NULL: recopied, unless
    # the session has a generation (see _still_prefix).
    db["catalog_state"].add_column("log_bytes", int)
    db["catalog_state"].add_column("tail", bytes)


def _fact_times(db: "sqlite_utils.Database") -> None:
    # Facts were copied without their memory view's time: sessions with facts are read again
    # at the next refresh, which dates them.
    db.execute("UPDATE catalog_state SET stamp = '' WHERE session_id IN "
               "(SELECT session_id FROM chunks WHERE source = 'session')")


# The first step's name is the catalog's layout: a catalog without it is recreated from scratch
# (tables_3: every text is redacted; a catalog of an earlier layout may hold secrets, in its rows
# and in its search indexes' segments, so it is not migrated but made again).
CATALOG_MIGRATIONS = MigrationSet("memstore.catalog", (("tables_3", _create_tables), ("views", _create_views),
                                                       ("fact_ids_by_directory", _fact_ids_by_directory),
                                                       ("log_tails", _log_tails),
                                                       ("normal_chunk_times", _normal_chunk_times),
                                                       ("fact_times", _fact_times)))


def open_catalog(root: os.PathLike | str, *, _set_aside: bool = True) -> sqlite3.Connection:
    """Open (creating and migrating) ``<root>/catalog.db`` for writing, in WAL mode; the caller
    holds the store's ``catalog`` lock. One SQLite cannot read (not a database, damaged) is set
    aside and a new one created: the catalog is a view of the sessions, and keeping the old one
    would fail every refresh (and search) until someone ran ``memstore doctor --fix``."""
    path = catalog_path(root)
    try:
        # uri=True: the session indexes are attached read-only, by URI.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, uri=True)
    except sqlite3.Error as exc:
        raise StoreIOError("open catalog", path, str(exc)) from exc
    try:
        os.chmod(path, 0o600)
        conn.create_function("memstore_ts", 1, _normal_ts, deterministic=True)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=10000")
        pending = CATALOG_MIGRATIONS.pending(conn)
        if pending and pending[0] == CATALOG_MIGRATIONS.steps[0][0] and _has_tables(conn):
            # A catalog of a layout this memstore does not know: it is a view, start it again.
            conn.close()
            logger.warning("catalog %s has an older layout: recreating it", path)
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(f"{path}{suffix}")
                except FileNotFoundError:
                    pass
            return open_catalog(root)
        if pending:
            CATALOG_MIGRATIONS.apply(conn)
        SearchIndex(conn).ensure_schema()
    except (sqlite3.Error, OSError) as exc:
        conn.close()
        # Once only: a new file that SQLite still cannot read is not the old file's fault.
        if _set_aside and isinstance(exc, sqlite3.DatabaseError) and _is_corruption(exc):
            aside = set_aside_catalog(path)
            logger.warning("catalog %s could not be read (%s); kept as %s, and a new catalog is built",
                           path, exc, aside)
            return open_catalog(root, _set_aside=False)
        raise StoreIOError("open catalog", path, str(exc)) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def set_aside_catalog(path: Path) -> Path:
    """Move a catalog SQLite cannot read out of the way, beside it (as torn tails are kept), with
    its WAL side files gone, so the next open builds a new one; return where it went. The caller
    holds the store's ``catalog`` lock."""
    import time

    aside = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
    try:
        os.replace(path, aside)
        for suffix in ("-wal", "-shm"):
            try:
                os.unlink(f"{path}{suffix}")
            except FileNotFoundError:
                pass
    except OSError as exc:
        raise StoreIOError.from_os_error("set aside", path, exc) from exc
    return aside


# --------------------------------------------------------------------------------------------
# Refresh


def _has_tables(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0


def refresh_catalog(root: os.PathLike | str, *, progress=None) -> RefreshReport:
    """Bring ``<root>/catalog.db`` up to date with the sessions under ``root``; return what
    changed. ``progress(done, total)`` is called as sessions are looked at."""
    root = Path(root)
    report = RefreshReport()
    if not root.is_dir():
        raise StoreIOError("refresh catalog", root, "no such store directory")
    redactor = redactor_for(root)  # a malformed config.toml refuses before anything is copied
    with store_lock(root, "catalog"):
        conn = open_catalog(root)
        try:
            conn.create_function(_REDACT_SQL, 1, _sql_redactor(redactor), deterministic=True)
            _refresh(conn, SearchIndex(conn), root, report, progress, redactor)
        finally:
            conn.close()
    return report


def _session_dirs(root: Path) -> dict[str, Path]:
    base = sessions_root(root)
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    found = {}
    for e in entries:
        if e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
            continue
        try:
            e.name.encode("utf-8")
        except UnicodeEncodeError:
            # Bytes that are not UTF-8: no session id names such a directory (and SQLite could
            # store neither its name nor the id a log there claims).
            logger.warning("catalog: %r under %s is not a session directory (its name is not UTF-8)", e.name, base)
            continue
        found[e.name] = Path(e.path)
    return found


def _stamp(directory: Path) -> Optional[str]:
    """What changes when a session does: its log, its manifest and its index files. ``None``
    when it is no session (no log that is a regular file); any other file that is not one
    (a symlink, say) the reader refuses, or reads the log instead of."""
    parts = []
    for name in (EVENTS_FILE, MANIFEST_FILE, f"{INDEX_DIR}/{INDEX_FILE}", f"{INDEX_DIR}/{INDEX_FILE}-wal", f"{DERIVED_DIR}/{MEMORY_FILE}"):
        try:
            st = os.stat(directory / name, follow_symlinks=False)
        except FileNotFoundError:
            if name == EVENTS_FILE:
                return None
            parts.append("-")
            continue
        if not stat.S_ISREG(st.st_mode) and name == EVENTS_FILE:
            return None
        parts.append(f"{st.st_mode:o}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _sql_redactor(redactor: Redactor):
    """The SQL function that redacts one text value (anything else passes as it is)."""
    redact = redactor.redact_text

    def redact_sql(value):
        return redact(value) if isinstance(value, str) else value

    return redact_sql


def _refresh(conn: sqlite3.Connection, search: SearchIndex, root: Path, report: RefreshReport, progress,
             redactor: Redactor) -> None:
    directories = _session_dirs(root)
    state = {row[0]: row for row in conn.execute(
        "SELECT directory, session_id, generation, seq, last_turn, stamp, log_bytes, tail FROM catalog_state")}
    for name in sorted(set(state) - set(directories)):
        _forget_directory(conn, search, name, state[name][1], report)
    total = len(directories)
    for done, name in enumerate(sorted(directories), start=1):
        if progress is not None:
            progress(done, total)
        directory = directories[name]
        stamp = _stamp(directory)
        previous = state.get(name)
        if stamp is None:
            # No log (yet, or any more): not a session, as a refresh from scratch would say.
            if previous is not None:
                _forget_directory(conn, search, name, previous[1], report)
            continue
        if previous is not None and previous[5] == stamp:
            report.unchanged += 1
            continue
        try:
            outcome = _refresh_session(conn, search, name, directory, previous, stamp, redactor)
        except SessionNotFound:
            if previous is not None:  # its log went away after the stat
                _forget_directory(conn, search, name, previous[1], report)
            continue
        except (MemstoreError, sqlite3.Error, OSError) as exc:
            if isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL:
                # Only the catalog is written (session indexes are attached read-only): say so,
                # or the session looks at fault.
                exc = StoreIOError("write", catalog_path(root), str(exc), errno.ENOSPC)
            logger.warning("catalog: skipping session directory %s this time: %s", directory, exc)
            report.errors.append((name, str(exc)))
            continue
        if outcome is not None:
            kind, session_id = outcome
            getattr(report, kind).append(session_id)


def _forget_directory(conn: sqlite3.Connection, search: SearchIndex, name: str, session_id: str,
                      report: RefreshReport) -> None:
    with _transaction(conn):
        _forget(conn, search, session_id)
        conn.execute("DELETE FROM catalog_state WHERE directory = ?", (name,))
    report.removed.append(session_id)


def _refresh_session(conn: sqlite3.Connection, search: SearchIndex, name: str, directory: Path,
                     previous: Optional[tuple], stamp: str, redactor: Redactor) -> Optional[tuple[str, str]]:
    for _attempt in range(_ATTEMPTS):
        with read_session_dir(directory) as reader:
            outcome = _copy_session(conn, search, name, reader, previous, stamp, redactor)
        if outcome is not None:
            return outcome
    raise StoreIOError("refresh catalog", directory, "the session kept being rewritten while it was read")


def _copy_session(conn: sqlite3.Connection, search: SearchIndex, name: str, reader: SessionReader,
                  previous: Optional[tuple], stamp: str, redactor: Redactor) -> Optional[tuple[str, str]]:
    """Copy what the catalog lacks of one session, in one transaction; ``None`` when the session's
    index changed generation under the reader (the caller reads it again). Every text is copied
    through ``redactor``: events are redacted whole before they are chunked (a private key
    spanning two windows is found), and what comes from the session index (redacted there by
    the same rules, unless an older memstore or another config derived it) again."""
    manifest = reader.manifest
    session_id = reader.session_id
    full = (previous is None or previous[1] != session_id or previous[2] != manifest.generation
            or previous[3] > max(reader.indexed_seq, reader.tail_rows.last_seq)
            or _turn_base_moved(conn, session_id, manifest.retained_turn_base)
            or not _still_prefix(reader, *previous[6:8], trusted=previous[2] != 0))
    events_seq = 0 if full else previous[3]
    last_turn = 0 if full else previous[4]
    uri = _attach(conn, reader.index_path) if reader.index is not None else None
    attached = uri is not None
    attached_stamp = file_stamp(reader.index_path) if attached else None
    try:
        with _transaction(conn):
            if attached:
                try:
                    row = conn.execute("SELECT generation FROM src.manifest WHERE id = 1").fetchone()
                except sqlite3.Error:
                    raise _Rewritten() from None  # a new index, not written yet
                if row is None or row[0] != manifest.generation:
                    raise _Rewritten()
            if full and previous is not None:
                _forget(conn, search, previous[1])
            if full:
                _forget(conn, search, session_id)  # a directory renamed to another id's, say
            # Events, chunks and changed files: copied from the index as far as it derived them,
            # the rest derived here from the records (the reader parses what the index lacks).
            new_ids, new_events_seq = _copy_records(conn, reader, session_id, name, events_seq, attached, redactor)
            new_ids += _copy_facts(conn, search, session_id, name, reader.dir, redactor)
            search.add(conn.execute("SELECT id, text, created_at FROM chunks WHERE id IN (SELECT value FROM json_each(?))",
                                    (_json_list(new_ids),)))
            # Turns: from the first that may have changed (the last one copied could have been open).
            turns = reader.turns(since=last_turn)
            conn.execute("DELETE FROM turns WHERE session_id = ? AND number >= ?", (session_id, last_turn))
            conn.executemany(
                f"INSERT INTO turns (session_id, {', '.join(TURN_COLUMNS)}, duration_ms) "
                f"VALUES (?, {', '.join('?' * len(TURN_COLUMNS))}, ?)",
                [(session_id, *_redacted_turn(t, redactor).as_row(), _duration_ms(t.started_at, t.ended_at))
                 for t in turns])
            # Chunks and changed files: what the index derived, then what the reader derives.
            _upsert_session(conn, session_id, name, manifest, reader)
            conn.execute(
                "INSERT OR REPLACE INTO catalog_state (directory, session_id, generation, seq, last_turn, stamp, "
                "log_bytes, tail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (name, session_id, manifest.generation, new_events_seq,
                 max([last_turn] + [t.number for t in turns]), stamp, reader.end, _log_tail(reader, reader.end)))
            if attached and "immutable=1" in uri and file_stamp(reader.index_path) != attached_stamp:
                raise _Rewritten()  # a writer touched the index under an immutable read
    except _Rewritten:
        return None
    except sqlite3.DatabaseError:
        if attached and "immutable=1" in uri and file_stamp(reader.index_path) != attached_stamp:
            return None  # what a writer changed under the immutable read was torn: read it again
        raise
    finally:
        if attached:
            conn.execute("DETACH DATABASE src")
    kind = "added" if previous is None else "recopied" if full else "updated"
    return kind, session_id


def _redacted_turn(turn: Turn, redactor: Redactor) -> Turn:
    """``turn`` with its error message redacted (a failed command's message may quote a key)."""
    if not turn.error:
        return turn
    error = redactor.redact_text(turn.error)
    return turn if error is turn.error else replace(turn, error=error)


def _log_tail(reader: SessionReader, length: int) -> bytes:
    """The sha256 of the log's last bytes up to ``length``: what says the log is still the one
    copied, without keeping its bytes (which may hold a secret) in the catalog."""
    return hashlib.sha256(reader.log.pread(max(0, length - TAIL_BYTES), min(TAIL_BYTES, length))).digest()


def _still_prefix(reader: SessionReader, length: Optional[int], tail: Optional[bytes], *, trusted: bool) -> bool:
    """Whether the log the catalog copied (``length`` bytes ending in the bytes ``tail`` digests) is still the
    start of the one the reader holds: if not, it was rewritten (the generation cannot say so
    for a session without an index). Unknown (a catalog of the previous layout): ``trusted``,
    which a session copied with a generation is."""
    if length is None or tail is None:
        return trusted
    return length <= reader.end and _log_tail(reader, length) == tail


def _turn_base_moved(conn: sqlite3.Connection, session_id: str, retained_turn_base: int) -> bool:
    """Whether the session's first retained turn is not the one the catalog copied: a cap
    rewrite evicted turns. Every rewrite that evicts moves it (whole turns go), which the
    log's bytes may not show: VT Code writes no seqs or times, so a log of like turns that grew
    back past the length copied can end there in the very bytes it ended in before."""
    row = conn.execute("SELECT retained_turn_base FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return row is not None and row[0] != retained_turn_base


class _Rewritten(Exception):
    """The session's index changed generation between the reader's snapshot and the copy."""


_REDACT_SQL = "memstore_redact"  # the catalog connection's redaction function (see _sql_redactor)
_EVENT_INSERT = ("INSERT INTO events (session_id, seq, turn, ts, type, item_type, item_id, name, status, exit_code, "
                 "offset, length) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_CHUNK_INSERT = ("INSERT INTO chunks (chunk_id, session_id, seq, turn, part, source, kind, path, start_line, end_line, "
                 "created_at, text) VALUES (?, ?, ?, ?, ?, 'event', ?, ?, ?, ?, ?, ?) RETURNING id")


def _copy_records(conn: sqlite3.Connection, reader: SessionReader, session_id: str, name: str, after: int,
                  attached: bool, redactor: Redactor) -> tuple[list[int], int]:
    """Copy the session's records past seq ``after``: their events rows, chunks and changed
    files. From the attached index as far as its deriver went (and the reader's snapshot of
    it), then made here from the records themselves (all of them, when the index could not be
    attached). Returns the new chunk ids and the last seq copied."""
    path = f"{SESSIONS_DIR}/{name}/{EVENTS_FILE}"
    ids: list[int] = []
    copied = after
    if attached:
        derived = conn.execute("SELECT coalesce((SELECT seq FROM src.derived_state WHERE id = 1), 0)").fetchone()[0]
        copied = max(after, min(derived, reader.indexed_seq))
        if copied > after:
            bounds = (session_id, after, copied)
            conn.execute(
                "INSERT INTO events (session_id, seq, turn, ts, type, item_type, item_id, name, status, exit_code, "
                f"offset, length) SELECT ?, e.seq, e.turn, e.ts, e.type, d.item_type, d.item_id, {_REDACT_SQL}(d.name), d.status, "
                "d.exit_code, e.offset, e.length FROM src.events e LEFT JOIN src.event_details d ON d.seq = e.seq "
                "WHERE e.seq > ? AND e.seq <= ?", bounds)
            cursor = conn.execute(
                "INSERT INTO chunks (chunk_id, session_id, seq, turn, part, source, kind, path, start_line, end_line, "
                "created_at, text) SELECT ?1 || ':' || seq || ':' || part, ?1, seq, turn, part, 'event', kind, ?4, "
                f"start_line, end_line, CASE WHEN {_IS_MEMSTORE_TS.format('ts')} THEN ts ELSE memstore_ts(ts) END, "
                f"{_REDACT_SQL}(text) FROM src.chunks WHERE seq > ?2 AND seq <= ?3 ORDER BY seq, part RETURNING id",
                (*bounds, path))
            ids.extend(row[0] for row in cursor)
            conn.execute(
                f"INSERT INTO file_changes (session_id, seq, turn, path, kind) SELECT ?, seq, turn, {_REDACT_SQL}(path), kind "
                "FROM src.file_changes WHERE seq > ? AND seq <= ?", bounds)
    last = copied
    for record in reader.records_from(copied):
        event = redactor.redact_value(record.event)
        conn.execute(_EVENT_INSERT, (session_id, record.seq, record.turn, record.ts, *ev.describe(event),
                                     record.offset, record.length))
        for chunk in event_chunks(record.seq, record.turn, record.ts, event):
            cursor = conn.execute(_CHUNK_INSERT, (
                f"{session_id}:{chunk.seq}:{chunk.part}", session_id, chunk.seq, chunk.turn, chunk.part, chunk.kind,
                path, chunk.start_line, chunk.end_line, _normal_ts(chunk.ts), chunk.text))
            ids.append(cursor.fetchone()[0])
        for file_path, kind in ev.changed_files(event):
            conn.execute("INSERT INTO file_changes (session_id, seq, turn, path, kind) VALUES (?, ?, ?, ?, ?)",
                         (session_id, record.seq, record.turn, file_path, kind))
        last = record.seq
    return ids, max(last, copied)


def _copy_facts(conn: sqlite3.Connection, search: SearchIndex, session_id: str, name: str,
                directory: Path, redactor: Redactor) -> list[int]:
    """Replace the session's memory facts (``derived/memory.json``) as search chunks
    (``source = 'session'``, chunk id ``<directory>:<index>``, as the reference names them: a
    directory name has no ``:``, so no fact can take the id of an event's chunk,
    ``<session>:<seq>:<part>``, as ``x:5:0``, fact 0 of session ``x:5``, would take session
    ``x``'s event 5)."""
    from .views.memory_view import memory_facts_of, memory_view_time

    old = [row[0] for row in conn.execute("SELECT id FROM chunks WHERE session_id = ? AND source = 'session'",
                                          (session_id,))]
    if old:
        search.remove(old)
        conn.execute("DELETE FROM chunks WHERE session_id = ? AND source = 'session'", (session_id,))
    ids = []
    facts = memory_facts_of(directory)
    # The view's own time (reference 5.5): what recency and search_memory's since weigh facts by.
    created_at = memory_view_time(directory) if facts else None
    for fact in facts:
        cursor = conn.execute(
            "INSERT INTO chunks (chunk_id, session_id, source, kind, path, start_line, end_line, created_at, text) "
            "VALUES (?, ?, 'session', ?, ?, 0, 0, ?, ?) RETURNING id",
            (f"{name}:{fact['index']}", session_id, fact.get("source") or "fact", f"{SESSIONS_DIR}/{name}/{DERIVED_DIR}/{MEMORY_FILE}",
             created_at, redactor.redact_text(fact["fact"])))
        ids.append(cursor.fetchone()[0])
    return ids


def _upsert_session(conn: sqlite3.Connection, session_id: str, name: str, manifest, reader: SessionReader) -> None:
    source = manifest.source or {}
    totals = conn.execute(
        "SELECT CAST(total(input_tokens) AS INTEGER), CAST(total(cached_input_tokens) AS INTEGER), "
        "CAST(total(cache_creation_tokens) AS INTEGER), CAST(total(output_tokens) AS INTEGER), "
        "sum(status = 'failed'), (SELECT model FROM turns WHERE session_id = ? AND model IS NOT NULL "
        "ORDER BY number DESC LIMIT 1) FROM turns WHERE session_id = ?", (session_id, session_id)).fetchone()
    title = conn.execute(
        "SELECT text FROM chunks WHERE session_id = ? AND part = 0 AND kind IN ('user_message', 'agent_message') "
        "ORDER BY kind = 'user_message' DESC, seq LIMIT 1", (session_id,)).fetchone()
    conn.execute(
        "INSERT OR REPLACE INTO sessions (session_id, directory, status, created_at, updated_at, turn_count, "
        "event_count, retained_turn_base, generation, agent, agent_version, cwd, git_branch, source_path, "
        "parent_session_id, title, model, turns_failed, input_tokens, cached_input_tokens, cache_creation_tokens, "
        "output_tokens, log_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, name, manifest.status, manifest.created_at, manifest.updated_at, manifest.turn_count,
         manifest.event_count, manifest.retained_turn_base, manifest.generation,
         _str(source.get("agent")) or "memstore", _str(source.get("agent_version")), _str(source.get("cwd")),
         _str(source.get("git_branch")), _str(source.get("path")), _str(source.get("parent_session_id")),
         " ".join(title[0].split())[:_TITLE_CHARS] if title else None, totals[5], totals[4] or 0,
         totals[0], totals[1], totals[2], totals[3], reader.end))


def _forget(conn: sqlite3.Connection, search: SearchIndex, session_id: str) -> None:
    search.remove([row[0] for row in conn.execute("SELECT id FROM chunks WHERE session_id = ?", (session_id,))])
    for table in ("chunks", "file_changes", "events", "turns", "sessions"):
        conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))


def _attach(conn: sqlite3.Connection, index_path: Path) -> Optional[str]:
    """Attach a session index read-only as ``src``, creating and writing nothing in the
    session (see ``index.readonly_uri``); return the URI used, or ``None`` if it cannot be."""
    uri = readonly_uri(index_path)
    if uri is None:
        return None  # it cannot be read without creating a file: the reader read the log
    try:
        conn.execute("ATTACH DATABASE ? AS src", (uri,))
        return uri
    except sqlite3.Error as exc:
        logger.info("catalog: reading %s through its reader (%s)", index_path, exc)
        return None


class _transaction:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        return False


def _duration_ms(started: Optional[str], ended: Optional[str]) -> Optional[int]:
    from .events import parse_ts

    a, b = parse_ts(started), parse_ts(ended)
    if a is None or b is None:
        return None
    return max(0, int((b - a).total_seconds() * 1000))


# Chunk times are compared with search_memory's since as strings: each is stored in memstore's
# own format (what memstore writes; a line another tool wrote may say the time another way),
# or NULL when it is not a time.
_IS_MEMSTORE_TS = ("coalesce({0} GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]"
                   ".[0-9][0-9][0-9]Z', 1)")


def _normal_ts(value) -> Optional[str]:
    if value is None:
        return None
    try:
        return ev.normalize_ts(value)
    except InvalidEvent:
        return None


def _str(value) -> Optional[str]:
    return value if isinstance(value, str) else None


def _json_list(values: Sequence[int]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"
