"""The per-session SQLite index, ``index/session.db``.

It holds the session's manifest row, one row per turn and one per event, enough to answer "which
turns failed, what did each cost, which commands ran" in SQL without reading the log. It is a
regenerable view of ``events.jsonl``: the manifest row records the log length it covers
(``persisted_file_len``) and the last bytes of the log up to there (``tail``), so an open can tell
whether the index still describes the log and index only the bytes past that offset.

The database runs in WAL mode so readers (Datasette, the catalog) never block the writer.
``synchronous=NORMAL`` is enough: the log is fsynced before every index transaction, so after a
power cut the index can only be behind the log, and an open catches it up.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from .errors import StoreIOError
from .manifest import Manifest

INDEX_FILE = "session.db"
INDEX_FORMAT = 1

_SCHEMA_V1 = """
CREATE TABLE manifest (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    session_id TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    turn_count INTEGER NOT NULL,
    event_count INTEGER NOT NULL,
    status TEXT NOT NULL,
    in_turn INTEGER NOT NULL,
    persisted_file_len INTEGER NOT NULL,
    retained_turn_base INTEGER NOT NULL,
    next_seq INTEGER NOT NULL,
    tail BLOB NOT NULL
);
CREATE TABLE turns (
    number INTEGER PRIMARY KEY,
    status TEXT NOT NULL,
    start_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    event_count INTEGER NOT NULL,
    first_seq INTEGER,
    last_seq INTEGER,
    started_at TEXT,
    ended_at TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    cached_input_tokens INTEGER NOT NULL DEFAULT 0,
    cache_creation_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    error TEXT
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    seq INTEGER,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    turn INTEGER,
    ts TEXT,
    type TEXT NOT NULL,
    item_type TEXT,
    item_id TEXT,
    name TEXT,
    status TEXT,
    exit_code INTEGER
);
CREATE INDEX events_turn ON events(turn);
"""

# Each entry upgrades the schema by one format version; index i brings format i to i+1.
_MIGRATIONS: list[str] = [_SCHEMA_V1]

TURN_OPEN = "open"
TURN_COMPLETED = "completed"
TURN_FAILED = "failed"
TURN_INTERRUPTED = "interrupted"
TURN_ABORTED = "aborted"


@dataclass(slots=True)
class Turn:
    """One turn of a session as the index records it.

    ``status`` is ``open`` (no closing event yet), ``completed``, ``failed`` (closed by
    ``turn.failed``) or ``interrupted`` (a new ``turn.started`` arrived before it closed).
    Offsets are UTF-8 byte offsets into ``events.jsonl``; ``end_offset`` is exclusive.
    """

    number: int
    status: str
    start_offset: int
    end_offset: int
    event_count: int
    first_seq: Optional[int] = None
    last_seq: Optional[int] = None
    started_at: Optional[str] = None
    ended_at: Optional[str] = None
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0
    output_tokens: int = 0
    error: Optional[str] = None

    def as_row(self) -> tuple:
        return (self.number, self.status, self.start_offset, self.end_offset, self.event_count,
                self.first_seq, self.last_seq, self.started_at, self.ended_at, self.input_tokens,
                self.cached_input_tokens, self.cache_creation_tokens, self.output_tokens, self.error)


_TURN_COLUMNS = tuple(f.name for f in fields(Turn))
_TURN_UPSERT = (
    f"INSERT OR REPLACE INTO turns ({', '.join(_TURN_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_TURN_COLUMNS))})"
)
_EVENT_COLUMNS = ("seq", "offset", "length", "turn", "ts", "type", "item_type", "item_id", "name", "status", "exit_code")
_EVENT_INSERT = f"INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) VALUES ({', '.join('?' * len(_EVENT_COLUMNS))})"
_MANIFEST_COLUMNS = tuple(f.name for f in fields(Manifest))
_MANIFEST_UPSERT = (
    f"INSERT OR REPLACE INTO manifest (id, {', '.join(_MANIFEST_COLUMNS)}, tail) "
    f"VALUES (1, {', '.join('?' * len(_MANIFEST_COLUMNS))}, ?)"
)


class IndexCorrupt(Exception):
    """The index file is not a usable SQLite database of a known format."""


@dataclass
class SavedState:
    """What the index says about the log: its manifest row, the tail bytes it covers, and the
    open turn if there is one."""

    manifest: Manifest
    tail: bytes
    open_turn: Optional[Turn]


class SessionIndex:
    """A connection to one session's ``index/session.db``."""

    def __init__(self, path: os.PathLike | str, conn: sqlite3.Connection):
        self.path = Path(path)
        self.conn = conn

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: os.PathLike | str) -> "SessionIndex":
        """Open (creating and migrating as needed) the index at ``path``.

        Raises :class:`IndexCorrupt` when the file is not a database or has an unknown format,
        and :class:`StoreIOError` for other failures.
        """
        path = Path(path)
        if path.is_symlink():
            raise StoreIOError("open index", path, "is a symlink; refusing to follow it")
        existed = path.exists()
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreIOError("open index", path, str(exc)) from exc
        try:
            if not existed:
                os.chmod(path, 0o600)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(_MIGRATIONS):
                raise IndexCorrupt(f"index format {version} is newer than this memstore ({len(_MIGRATIONS)})")
            if version < len(_MIGRATIONS):
                conn.execute("BEGIN IMMEDIATE")
                for step in range(version, len(_MIGRATIONS)):
                    _run_script(conn, _MIGRATIONS[step])
                conn.execute(f"PRAGMA user_version={len(_MIGRATIONS)}")
                conn.execute("COMMIT")
            # A quick structural probe: a damaged file usually fails here rather than later.
            conn.execute("SELECT count(*) FROM manifest").fetchone()
        except sqlite3.DatabaseError as exc:
            conn.close()
            if _is_corruption(exc):
                raise IndexCorrupt(f"{path}: {exc}") from exc
            raise StoreIOError("open index", path, str(exc)) from exc
        except BaseException:
            conn.close()
            raise
        for suffix in ("-wal", "-shm"):
            side = f"{path}{suffix}"
            try:
                if stat.S_ISREG(os.lstat(side).st_mode):  # never chmod through a symlink
                    os.chmod(side, 0o600)
            except OSError:
                pass
        return cls(path, conn)

    @staticmethod
    def discard(path: os.PathLike | str) -> None:
        """Delete an index file and its WAL side files (used when it is corrupt)."""
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.unlink(f"{path}{suffix}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreIOError.from_os_error("remove", f"{path}{suffix}", exc) from exc

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:
            pass

    # -- reading -----------------------------------------------------------------------------

    def load(self) -> Optional[SavedState]:
        """The saved state, or ``None`` when the index is empty."""
        try:
            row = self.conn.execute(
                f"SELECT {', '.join(_MANIFEST_COLUMNS)}, tail FROM manifest WHERE id = 1"
            ).fetchone()
            if row is None:
                return None
            values = dict(zip(_MANIFEST_COLUMNS, row[:-1]))
            values["in_turn"] = bool(values["in_turn"])
            manifest = Manifest(**values)
            open_turn = None
            if manifest.in_turn:
                open_turn = self.turn(manifest.turn_count + 1)
        except sqlite3.DatabaseError as exc:
            if _is_corruption(exc):
                raise IndexCorrupt(f"{self.path}: {exc}") from exc
            raise StoreIOError("read index", self.path, str(exc)) from exc
        return SavedState(manifest, bytes(row[-1]), open_turn)

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreIOError("read index", self.path, str(exc)) from exc

    def turn(self, number: int) -> Optional[Turn]:
        rows = self._read(f"SELECT {', '.join(_TURN_COLUMNS)} FROM turns WHERE number = ?", (number,))
        return Turn(*rows[0]) if rows else None

    def turns(self) -> list[Turn]:
        return [Turn(*row) for row in self._read(f"SELECT {', '.join(_TURN_COLUMNS)} FROM turns ORDER BY number")]

    def turn_spans(self) -> list[tuple[int, int, int, int]]:
        """``(number, start_offset, end_offset, event_count)`` of every turn, oldest first."""
        return self._read("SELECT number, start_offset, end_offset, event_count FROM turns ORDER BY number")

    def count_events_before(self, offset: int) -> int:
        """How many records lie before byte ``offset`` (what a cap rewrite cut there evicts)."""
        return self._read("SELECT count(*) FROM events WHERE offset < ?", (offset,))[0][0]

    def offsets_of(self, seq: Optional[int], candidates: tuple[int, int], length: int, kind: str) -> set[int]:
        """Where the index has a record: the one with ``seq``, or (for a line without one) a record
        of ``length`` bytes and type ``kind`` at one of the ``candidates`` offsets. Empty when the
        index cannot tell (it failed, or the seq is not unique)."""
        try:
            if seq is not None:
                rows = self.conn.execute("SELECT offset FROM events WHERE seq = ?", (seq,)).fetchall()
                return {row[0] for row in rows} if len(rows) == 1 else set()
            rows = self.conn.execute(
                "SELECT offset FROM events WHERE offset IN (?, ?) AND length = ? AND type = ?",
                (*candidates, length, kind),
            ).fetchall()
        except sqlite3.Error:
            return set()
        return {row[0] for row in rows}

    def is_consistent(self, manifest: Manifest) -> bool:
        """Whether the turn and event rows agree with the manifest row.

        Turn numbers must run contiguously from ``retained_turn_base`` to ``turn_count`` (plus the
        open turn), the first and last turns must be non-empty byte ranges inside the covered log,
        the last two must not overlap, and the event rows (ids are assigned contiguously) must
        number ``event_count`` and end inside the covered log. Index lookups and one count over
        the turns, so reopening a million-event session stays cheap; the interior rows are kept
        consistent by the transactions that write them.
        """
        covered = manifest.persisted_file_len
        try:
            conn = self.conn
            count = conn.execute("SELECT count(*) FROM turns").fetchone()[0]
            edges = conn.execute(
                "SELECT * FROM (SELECT number, start_offset, end_offset, event_count FROM turns ORDER BY number LIMIT 1) "
                "UNION ALL SELECT * FROM (SELECT number, start_offset, end_offset, event_count FROM turns "
                "ORDER BY number DESC LIMIT 2)"
            ).fetchall()
            first_id = conn.execute("SELECT id FROM events ORDER BY id LIMIT 1").fetchone()
            last_event = conn.execute("SELECT id, offset + length FROM events ORDER BY id DESC LIMIT 1").fetchone()
        except sqlite3.DatabaseError:
            return False
        events = 0 if last_event is None else last_event[0] - first_id[0] + 1
        if events != manifest.event_count or (last_event is not None and last_event[1] > covered):
            return False
        expected_last = manifest.turn_count + (1 if manifest.in_turn else 0)
        if count == 0:
            return expected_last == 0 or manifest.retained_turn_base > expected_last
        first, last = edges[0], edges[1]
        if first[0] != manifest.retained_turn_base or last[0] != expected_last or count != last[0] - first[0] + 1:
            return False
        for _number, start, end, n_events in edges:
            if n_events <= 0 or start > end or end > covered:
                return False
        return len(edges) < 3 or edges[2][2] <= last[1]


    # -- writing -----------------------------------------------------------------------------

    def commit(
        self,
        events: Sequence[tuple],
        turns: Iterable[Turn],
        manifest: Manifest,
        tail: bytes,
        *,
        reset: bool = False,
    ) -> None:
        """Record new event rows, changed turns and the manifest row in one transaction.

        With ``reset`` every existing row is dropped first, in the same transaction. A rebuild
        commits in batches (so an interrupted one resumes where it stopped), so a concurrent
        reader may see a partly rebuilt index until it finishes.
        """
        with self._transaction() as conn:
            if reset:
                conn.execute("DELETE FROM events")
                conn.execute("DELETE FROM turns")
                conn.execute("DELETE FROM manifest")
            if events:
                conn.executemany(_EVENT_INSERT, events)
            turn_rows = [t.as_row() for t in turns]
            if turn_rows:
                conn.executemany(_TURN_UPSERT, turn_rows)
            conn.execute(_MANIFEST_UPSERT, (*_manifest_row(manifest), tail))

    def evict(
        self, truncate_offset: int, first_kept_turn: int, manifest: Manifest, tail: bytes,
        *, pivot: int, delta: int, grown: bool,
    ) -> None:
        """Apply a cap rewrite: drop turns before ``first_kept_turn`` and events before
        ``truncate_offset``, move the remaining offsets back by ``truncate_offset`` and, from
        ``pivot`` on, by ``delta`` more (the log head the rewrite wrote); with ``grown`` the
        line at ``truncate_offset`` itself got ``delta`` bytes longer. Stores the new manifest
        row, all in one transaction."""
        params = {"cut": truncate_offset, "pivot": pivot, "delta": delta,
                  "grown": truncate_offset if grown else -1}
        with self._transaction() as conn:
            conn.execute("DELETE FROM turns WHERE number < ?", (first_kept_turn,))
            conn.execute("DELETE FROM events WHERE offset < ?", (truncate_offset,))
            conn.execute(
                "UPDATE turns SET "
                "start_offset = start_offset - :cut + (CASE WHEN start_offset >= :pivot THEN :delta ELSE 0 END), "
                "end_offset = end_offset - :cut + (CASE WHEN end_offset >= :pivot THEN :delta ELSE 0 END)",
                params,
            )
            conn.execute(
                "UPDATE events SET "
                "offset = offset - :cut + (CASE WHEN offset >= :pivot THEN :delta ELSE 0 END), "
                "length = length + (CASE WHEN offset = :grown THEN :delta ELSE 0 END)",
                params,
            )
            conn.execute(_MANIFEST_UPSERT, (*_manifest_row(manifest), tail))

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; any failure rolls back and surfaces as a StoreIOError."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # SQLite may already have rolled back (a full disk does); the first error is the
                # one to report.
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise
        except (sqlite3.Error, OverflowError) as exc:
            raise StoreIOError("update index", self.path, str(exc)) from exc


_CORRUPTION_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the file is damaged or not a database (rebuild it), as opposed to an
    I/O failure such as a full disk (report it; deleting the index would not help)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPTION_CODES
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


def _manifest_row(m: Manifest) -> tuple:
    return (m.session_id, m.schema_version, m.created_at, m.updated_at, m.turn_count, m.event_count,
            m.status, m.in_turn, m.persisted_file_len, m.retained_turn_base, m.next_seq)


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT the surrounding transaction; run statement by statement.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def read_turns(path: os.PathLike | str) -> list[Turn]:
    """The turns of an index opened read-only (for a session another process is writing)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise StoreIOError("open index", path, str(exc)) from exc
    try:
        return SessionIndex(path, conn).turns()
    except sqlite3.Error as exc:
        raise StoreIOError("read index", path, str(exc)) from exc
    finally:
        conn.close()
