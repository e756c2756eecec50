"""The per-session SQLite index, ``index/session.db``.

It holds the session's manifest row, one row per turn and one per event, enough to answer "which
turns failed, what did each cost, which commands ran" in SQL without reading the log, plus the
rows of derived tables (search chunks) that register here. It is a regenerable view of
``events.jsonl``: the manifest row records the log length it covers (``persisted_file_len``) and
a SHA-256 digest of the last bytes of the log up to there (``tail``; a digest, so no secret
in those bytes is kept in the index), so an open can tell whether the index still describes the
log and index only the bytes past that offset.

The schema is a set of named migrations (``schema.py``; recorded as sqlite-utils records them).
A new index is a copy of an empty one, made without sqlite-utils. An index of memstore's first
format (no migrations table) or of an unknown one is never read: it is discarded and rebuilt
from the log.

The database runs in WAL mode, so readers (the catalog, Datasette, ``read_session``) never
block the writer. ``synchronous=NORMAL`` is enough: the log is fsynced before every index
transaction, so after a power cut the index can only be behind the log.

Readers open it without creating or writing anything (see :func:`readonly_uri`). At rest (no
writer since the last clean close) a WAL database has no side files, and opening it the usual
read-only way would create them; such a database is opened ``immutable`` instead (no locks, no
side files), and a reader checks after every query that no writer changed the file meanwhile,
reopening the usual way (a writer has created the side files by then) if one did.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

import orjson

from .. import events as ev
from .. import faults
from ..errors import StoreIOError, UnsafePathError
from ..fsio import fsync_dir, remove_temp, write_all, write_temp_beside
from .manifest import Manifest
from .schema import DDL, MigrationSet, applied_migrations, template_bytes

logger = logging.getLogger("memstore")

# PRAGMA user_version of an index whose schema the migrations manage. memstore's first format
# had user_version 1 and no migrations table; that memstore reads this one as "newer" and
# rebuilds it, and this one rebuilds that.
INDEX_FORMAT = 2

TURN_OPEN = "open"
TURN_COMPLETED = "completed"
TURN_FAILED = "failed"
TURN_INTERRUPTED = "interrupted"
TURN_ABORTED = "aborted"

# The log's tables. The statements are those sqlite-utils' ``Table.create`` makes for them (a
# test checks it), so an index made here and one an older memstore made with sqlite-utils have
# the same schema, byte for byte.
_LOG_TABLES = DDL(
    (
        'CREATE TABLE "manifest" (\n'
        '   "id" INTEGER PRIMARY KEY,\n'
        '   "session_id" TEXT NOT NULL,\n'
        '   "schema_version" INTEGER,\n'
        '   "created_at" TEXT NOT NULL,\n'
        '   "updated_at" TEXT NOT NULL,\n'
        '   "turn_count" INTEGER,\n'
        '   "event_count" INTEGER,\n'
        '   "status" TEXT NOT NULL,\n'
        '   "in_turn" INTEGER,\n'
        '   "persisted_file_len" INTEGER,\n'
        '   "retained_turn_base" INTEGER,\n'
        '   "next_seq" INTEGER,\n'
        '   "generation" INTEGER,\n'
        '   "source" TEXT,\n'
        '   "tail" BLOB NOT NULL\n'
        ")",
        'CREATE TABLE "turns" (\n'
        '   "number" INTEGER PRIMARY KEY,\n'
        '   "status" TEXT NOT NULL,\n'
        '   "start_offset" INTEGER NOT NULL,\n'
        '   "end_offset" INTEGER NOT NULL,\n'
        '   "event_count" INTEGER NOT NULL,\n'
        '   "first_seq" INTEGER,\n'
        '   "last_seq" INTEGER,\n'
        '   "started_at" TEXT,\n'
        '   "ended_at" TEXT,\n'
        '   "input_tokens" INTEGER,\n'
        '   "cached_input_tokens" INTEGER,\n'
        '   "cache_creation_tokens" INTEGER,\n'
        '   "output_tokens" INTEGER,\n'
        '   "error" TEXT,\n'
        '   "model" TEXT\n'
        ")",
        # seq is the rowid: unique, and rows are stored in log order (offsets grow with seqs), so
        # a lookup by seq needs no second index and an append is an append to the b-tree. What
        # the event says (its item, tool, status) is in event_details, derived off the agent's
        # path: binding those five columns cost more than the rest of the row.
        'CREATE TABLE "events" (\n'
        '   "seq" INTEGER PRIMARY KEY,\n'
        '   "offset" INTEGER NOT NULL,\n'
        '   "length" INTEGER NOT NULL,\n'
        '   "turn" INTEGER,\n'
        '   "ts" TEXT,\n'
        '   "type" TEXT NOT NULL\n'
        ")",
        # How far the lazy derived tables have caught up: every record up to this seq is in them.
        'CREATE TABLE "derived_state" (\n   "id" INTEGER PRIMARY KEY,\n   "seq" INTEGER NOT NULL\n)',
    )
)

LOG_MIGRATIONS = MigrationSet("memstore.session.index", (("log_tables_3", _LOG_TABLES),))


@dataclass(slots=True)
class Turn:
    """One turn of a session as the index records it.

    ``status`` is ``open`` (no closing event yet), ``completed``, ``failed`` (closed by
    ``turn.failed``), ``aborted`` (closed by ``turn.aborted``) or ``interrupted`` (a new
    ``turn.started`` arrived before it closed). Offsets are UTF-8 byte offsets into
    ``events.jsonl``; ``end_offset`` is exclusive. ``model`` is the model that answered, when the
    turn's events say so.
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
    model: Optional[str] = None

    def as_row(self) -> tuple:
        return (
            self.number,
            self.status,
            self.start_offset,
            self.end_offset,
            self.event_count,
            self.first_seq,
            self.last_seq,
            self.started_at,
            self.ended_at,
            self.input_tokens,
            self.cached_input_tokens,
            self.cache_creation_tokens,
            self.output_tokens,
            self.error,
            self.model,
        )


TURN_COLUMNS = tuple(f.name for f in fields(Turn))
EVENT_COLUMNS = ("seq", "offset", "length", "turn", "ts", "type")
DETAIL_COLUMNS = ("seq", "item_type", "item_id", "name", "status", "exit_code")
_TURN_SELECT = f"SELECT {', '.join(TURN_COLUMNS)} FROM turns"
_TURN_UPSERT = f"INSERT OR REPLACE INTO turns ({', '.join(TURN_COLUMNS)}) VALUES ({', '.join('?' * len(TURN_COLUMNS))})"
# Raw executemany on the append path: per event it costs a fraction of what building dicts for
# sqlite-utils' insert_all would (measured in bench/bench_log.py).
_EVENT_INSERT = f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES ({', '.join('?' * len(EVENT_COLUMNS))})"
_MANIFEST_COLUMNS = tuple(f.name for f in fields(Manifest))
_MANIFEST_UPSERT = (
    f"INSERT OR REPLACE INTO manifest (id, {', '.join(_MANIFEST_COLUMNS)}, tail) "
    f"VALUES (1, {', '.join('?' * len(_MANIFEST_COLUMNS))}, ?)"
)


class IndexCorrupt(Exception):
    """The index file is not a usable SQLite database of a format this memstore reads."""


class IndexChanged(StoreIOError):
    """A read-only index changed generation (a writer rebuilt it, or a cap rewrite evicted) or
    went away while it was read: what it says no longer describes the log its reader holds."""


_REOPEN_ATTEMPTS = 3
_MAX_ROWID = 2**63 - 1


@dataclass(frozen=True)
class EvictSpec:
    """A cap rewrite as the index applies it: turns before ``first_kept_turn`` and events before
    ``truncate_offset`` go; the remaining offsets move back by ``truncate_offset`` and, from
    ``pivot`` on, by ``delta`` more (the log head the rewrite wrote); with ``grown`` the line at
    ``truncate_offset`` itself got ``delta`` bytes longer. ``next_seq`` is the session's next
    seq at the rewrite (the derived tables' watermark when nothing is left)."""

    truncate_offset: int
    first_kept_turn: int
    pivot: int
    delta: int
    grown: bool
    next_seq: int


def tail_digest(tail: bytes) -> bytes:
    """What the index keeps of the log's last bytes: their SHA-256 digest (empty for an empty
    log), enough to recognise them and nothing that could quote a secret."""
    return hashlib.sha256(tail).digest() if tail else b""


@dataclass
class SavedState:
    """What the index says about the log: its manifest row, the digest of the tail bytes it
    covers (:func:`tail_digest`), and the open turn if there is one."""

    manifest: Manifest
    tail: bytes
    open_turn: Optional[Turn]


# --------------------------------------------------------------------------------------------
# Derived tables


class BatchRecord:
    """One record of an indexed batch, as derived tables see it: its ``seq``, ``turn``, ``ts``,
    byte ``offset`` and ``length``, and its ``event``. On the append path the event is decoded
    from the line that was written (never the caller's dict, which the caller may have changed
    since), and only when a derived table asks for it."""

    __slots__ = ("seq", "turn", "ts", "offset", "length", "_event", "_line")

    def __init__(
        self,
        seq: int,
        turn: Optional[int],
        ts: Optional[str],
        offset: int,
        length: int,
        event: Optional[dict] = None,
        line: Optional[bytes] = None,
    ):
        self.seq, self.turn, self.ts, self.offset, self.length = seq, turn, ts, offset, length
        self._event, self._line = event, line

    @property
    def event(self) -> dict:
        event = self._event
        if event is None:
            if self._line is None:
                raise ValueError(f"record {self.seq} was made with neither its event nor its line")
            event = self._event = orjson.loads(self._line)["event"]
        return event


@dataclass(frozen=True)
class DerivedTable:
    """A table derived from the log, kept current inside the index's own transactions.

    ``migrations`` create its schema (a :class:`MigrationSet`, applied with the index's).
    ``on_batch(conn, records)`` is called with every batch of records (:class:`BatchRecord`, in
    log order, seq and turn included) in an index transaction; ``on_evict(conn,
    first_kept_seq)`` when a cap rewrite dropped every record before that seq (``None``: all of
    them), in the rewrite's transaction; ``on_reset(conn)`` when the index is rebuilt from
    scratch in place, in the rebuild's first transaction (a small log's is built anew in
    memory, where there is nothing to reset). A rebuild and an incremental update must give
    the same rows: derive them from the records alone.

    An eager table (``lazy=False``) gets each batch in the transaction that inserts its event
    rows. A lazy one (the search chunks) costs too much for the agent's path: it gets its
    batches later, in transactions of their own that also advance the index's
    ``derived_state`` watermark (see ``deriver.py``); until then readers derive the missing
    rows in memory, so nothing flushed is ever invisible.
    """

    name: str
    migrations: MigrationSet
    on_batch: Callable[[sqlite3.Connection, Sequence[BatchRecord]], object]
    on_evict: Callable[[sqlite3.Connection, Optional[int]], object]
    on_reset: Callable[[sqlite3.Connection], object]
    lazy: bool = False


_derived: list[DerivedTable] = []


_EVENT_DETAILS_TABLE = DDL(
    (
        'CREATE TABLE "event_details" (\n'
        '   "seq" INTEGER PRIMARY KEY,\n'
        '   "item_type" TEXT,\n'
        '   "item_id" TEXT,\n'
        '   "name" TEXT,\n'
        '   "status" TEXT,\n'
        '   "exit_code" INTEGER\n'
        ")",
    )
)


def details_rows(records: Iterable[BatchRecord]) -> Iterator[tuple]:
    """``event_details`` rows: each record's seq and what it says (see ``events.describe``)."""
    for record in records:
        yield (record.seq, *ev.describe(record.event)[1:])


_DETAILS_INSERT = f"INSERT INTO event_details VALUES ({', '.join('?' * len(DETAIL_COLUMNS))})"

EVENT_DETAILS = DerivedTable(
    "event_details",
    MigrationSet("memstore.event_details", (("event_details", _EVENT_DETAILS_TABLE),)),
    lambda conn, records: conn.executemany(_DETAILS_INSERT, details_rows(records)),
    lambda conn, first_kept_seq: conn.execute(
        "DELETE FROM event_details" + ("" if first_kept_seq is None else " WHERE seq < ?"),
        () if first_kept_seq is None else (first_kept_seq,),
    ),
    lambda conn: conn.execute("DELETE FROM event_details"),
    lazy=True,
)


def register_derived_table(table: DerivedTable) -> None:
    """Keep ``table`` up to date in every session index opened from now on. An index that does
    not have it yet is rebuilt from the log on its next open, so no row is ever missing."""
    if any(t.name == table.name for t in _derived):
        raise ValueError(f"a derived table named {table.name!r} is already registered")
    _derived.append(table)


def unregister_derived_table(name: str) -> None:
    """Stop maintaining the derived table ``name`` (its rows stay in existing indexes)."""
    _derived[:] = [t for t in _derived if t.name != name]


register_derived_table(EVENT_DETAILS)


def derived_tables(*, lazy: Optional[bool] = None) -> tuple[DerivedTable, ...]:
    """The registered derived tables (only the lazy or eager ones, if asked)."""
    return tuple(t for t in _derived if lazy is None or t.lazy == lazy)


# --------------------------------------------------------------------------------------------
# The index


class SessionIndex:
    """A connection to one session's ``index/session.db``."""

    def __init__(self, path: os.PathLike | str, conn: Optional[sqlite3.Connection], *, readonly: bool = False):
        self.path = Path(path)
        self._conn = conn
        # The file's (st_dev, st_ino) when the connection is made on first use (see persist).
        self._deferred: Optional[tuple[int, int]] = None
        self._connect_lock = threading.Lock()
        self.readonly = readonly
        self.immutable = False  # opened read-only without locks (see readonly_uri)
        self.stamp: Optional[tuple] = None
        # The generation :meth:`load` read: a read-only index reopened after a writer touched it
        # must still be that generation (else :class:`IndexChanged`).
        self.generation: Optional[int] = None
        # True when opening added tables (a newly registered derived table) to an index that
        # already had rows: those tables are empty, so the index must be rebuilt.
        self.needs_rebuild = False
        self.memory_only = False  # built by in_memory(), not yet written by persist()
        # Every lazy derived table was filled as the rows went in (see commit's derive_lazy).
        self.fully_derived = False
        self.lazy_failure: Optional[BaseException] = None  # why that stopped

    @property
    def conn(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            # The publisher's and the deriver's threads may both be first.
            with self._connect_lock:
                if self._conn is None:
                    if self._deferred is None:
                        raise StoreIOError("read index", self.path, "the index is closed")
                    self._conn = self._open_written(self.path, self._deferred)
                    self._deferred = None
                conn = self._conn
        return conn

    @conn.setter
    def conn(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: os.PathLike | str) -> SessionIndex:
        """Open (creating and migrating as needed) the index at ``path`` for writing.

        Raises :class:`IndexCorrupt` when the file is not a database or has a format this
        memstore does not read, and :class:`StoreIOError` for other failures.
        """
        path = Path(path)
        identity = _create_private(path)
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreIOError("open index", path, str(exc)) from exc
        index = cls(path, conn)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # What SQLite opened must be the file checked above, not a symlink swapped in since.
            _check_identity(path, identity)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            index._migrate()
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
        return index

    @classmethod
    def in_memory(cls, path: os.PathLike | str) -> SessionIndex:
        """A new, empty index held in memory, to be written to ``path`` whole by
        :meth:`persist` (a rescan of a small log: nothing touches the disk until it is done,
        and then one write and one fdatasync replace what was there)."""
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            conn.deserialize(_template(wal=False))
        except sqlite3.Error as exc:
            conn.close()
            raise StoreIOError("build index", path, f"in memory: {exc}") from exc
        index = cls(path, conn)
        index.memory_only = True
        return index

    def persist(self) -> SessionIndex:
        """Write an index built by :meth:`in_memory` to its path and return it opened there
        (connecting on first use: a rebuild that closes the session at once never does).

        The bytes go to a private temp file beside it, synced, then renamed over the old
        index: a crash leaves the old index or the whole new one, and a reader sees one or the
        other. Only when the old index has side files (its writer crashed) is it removed
        first, and they with it, lest its WAL or journal be played back into the new file: a
        crash between leaves no index, and the log is scanned again (the caller saved the old
        index's metadata in ``manifest.json`` where it was missing)."""
        path = self.path
        try:
            data = bytearray(self.conn.serialize())
        except sqlite3.Error as exc:
            raise StoreIOError("build index", path, f"serializing it: {exc}") from exc
        data[18:20] = _WAL_FORMAT
        tmp, st = write_temp_beside(path, data, sync=True, create_op="create index", write_op="write index")
        try:
            if any(os.path.lexists(f"{path}{suffix}") for suffix in _SIDE_FILES):
                SessionIndex.discard(path)
            try:
                os.rename(tmp, path)
            except OSError as exc:
                raise StoreIOError.from_os_error("rename", path, exc) from exc
        except BaseException:
            # Interrupted after the old index went (Ctrl-C, a failed unlink of a side file):
            # the new one, whole and synced, is better than none.
            if not os.path.lexists(path) and not any(os.path.lexists(f"{path}{s}") for s in _SIDE_FILES):
                try:
                    os.rename(tmp, path)
                except OSError as exc:
                    logger.warning("could not put the rebuilt index %s in place: %s", tmp, exc)
            remove_temp(tmp)
            raise
        self.close()
        written = SessionIndex(path, None)
        written._deferred = (st.st_dev, st.st_ino)
        written.fully_derived = self.fully_derived
        return written

    @staticmethod
    def _open_written(path: Path, identity: tuple[int, int]) -> sqlite3.Connection:
        """Connect for writing to an index :meth:`persist` wrote (its schema is this
        memstore's: no migration to check), refusing a file that is not the one it wrote."""
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreIOError("open index", path, str(exc)) from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            _check_identity(path, identity)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreIOError("open index", path, str(exc)) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    @classmethod
    def open_readonly(cls, path: os.PathLike | str) -> Optional[SessionIndex]:
        """Open the index read-only, creating and writing nothing; ``None`` when it does not
        exist or is not of this memstore's format (the caller then reads the log instead)."""
        path = Path(path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreIOError.from_os_error("stat", path, exc) from exc
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError("open index", path, "is a symlink or not a regular file")
        for _attempt in range(3):
            stamp = file_stamp(path)
            uri = readonly_uri(path)
            if uri is None:
                logger.debug("not reading index %s: it has only one of its WAL side files", path)
                return None
            try:
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as exc:
                raise StoreIOError("open index", path, str(exc)) from exc
            try:
                conn.execute("PRAGMA busy_timeout=5000")
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                applied = applied_migrations(conn) if version == INDEX_FORMAT else set()
                usable = version == INDEX_FORMAT and not LOG_MIGRATIONS.pending(conn, applied)
                needs_rebuild = usable and any(t.migrations.pending(conn, applied) for t in _derived)
            except sqlite3.DatabaseError as exc:
                conn.close()
                if file_stamp(path) != stamp:
                    continue  # a writer changed it under an immutable read: look again
                logger.debug("not reading index %s: %s", path, exc)
                return None
            if not usable:
                conn.close()
                return None
            index = cls(path, conn, readonly=True)
            index.needs_rebuild = needs_rebuild
            index.immutable = "immutable=1" in uri
            index.stamp = stamp
            if not index.changed():
                return index
            index.close()
        return None

    def _migrate(self) -> None:
        conn = self.conn
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version not in (0, INDEX_FORMAT) or (version == 0 and tables):
            raise IndexCorrupt(f"{self.path}: index format {version} is not this memstore's ({INDEX_FORMAT})")
        applied = applied_migrations(conn)
        pending = LOG_MIGRATIONS.pending(conn, applied)
        if pending and pending[0] == LOG_MIGRATIONS.steps[0][0] and "manifest" in tables:
            raise IndexCorrupt(f"{self.path}: an index layout this memstore does not know")
        derived_pending = [t for t in _derived if t.migrations.pending(conn, applied)]
        if not pending and not derived_pending:
            return
        had_rows = "manifest" in tables and conn.execute("SELECT count(*) FROM manifest").fetchone()[0] > 0
        LOG_MIGRATIONS.apply(conn)
        for table in derived_pending:
            table.migrations.apply(conn)
        conn.execute(f"PRAGMA user_version={INDEX_FORMAT}")
        self.needs_rebuild = had_rows

    @staticmethod
    def discard(path: os.PathLike | str) -> None:
        """Delete an index file and its WAL side files (used when it is corrupt or outdated)."""
        for suffix in ("", *_SIDE_FILES):
            try:
                os.unlink(f"{path}{suffix}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreIOError.from_os_error("remove", f"{path}{suffix}", exc) from exc

    def close(self) -> None:
        self._deferred = None
        if self._conn is None:
            return
        try:
            self._conn.close()
        except sqlite3.Error as exc:
            logger.debug("closing index %s: %s", self.path, exc)

    # -- reading -----------------------------------------------------------------------------

    def changed(self) -> bool:
        """For an index read ``immutable``: whether a writer has touched the file since it was
        opened (what was read may then be torn)."""
        return self.immutable and file_stamp(self.path) != self.stamp

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Run a query. On an index read ``immutable`` that a writer touched meanwhile (what was
        read may be torn), reopen it read-only (creating nothing: see :func:`readonly_uri`) and
        run the query again; :class:`IndexChanged` if it is no longer the generation
        :meth:`load` read. Rows the writer added since are visible then: callers that keep a
        snapshot bound their queries by what it held."""
        for _attempt in range(_REOPEN_ATTEMPTS):
            try:
                rows = self.conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                if not self.changed():
                    raise StoreIOError("read index", self.path, str(exc)) from exc
                rows = None  # torn pages under an immutable read
            if rows is not None and not self.changed():
                return rows
            self._reopen()
        raise StoreIOError("read index", self.path, "it kept changing while it was read")

    def _reopen(self) -> None:
        self.close()
        stamp = file_stamp(self.path)
        uri = readonly_uri(self.path)
        if uri is None:
            raise IndexChanged("read index", self.path, "it is being opened or closed by a writer")
        try:
            self.conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA busy_timeout=5000")
            # One read transaction from here on: the generation checked is the one read later
            # (a writer may rewrite the index again while the reader is open).
            self.conn.execute("BEGIN")
            row = self.conn.execute("SELECT generation FROM manifest WHERE id = 1").fetchone()
        except sqlite3.Error as exc:
            # Gone (a rebuild discards the file before it makes a new one) or mid-rewrite.
            raise IndexChanged("read index", self.path, f"it changed while it was read ({exc})") from exc
        self.immutable = "immutable=1" in uri
        self.stamp = stamp
        if self.generation is not None and (row is None or row[0] != self.generation):
            raise IndexChanged("read index", self.path, "it was rebuilt or rewritten while it was read")

    def load(self) -> Optional[SavedState]:
        """The saved state, or ``None`` when the index is empty (or must be rebuilt)."""
        if self.needs_rebuild:
            return None
        try:
            row = self.conn.execute(
                f"SELECT {', '.join(_MANIFEST_COLUMNS)}, tail FROM manifest WHERE id = 1"
            ).fetchone()
            if row is None:
                return None
            manifest = _manifest_from_row(row[:-1])
            if manifest is None:
                return None
            self.generation = manifest.generation
            open_turn = self.turn(manifest.turn_count + 1) if manifest.in_turn else None
        except sqlite3.DatabaseError as exc:
            if _is_corruption(exc):
                raise IndexCorrupt(f"{self.path}: {exc}") from exc
            raise StoreIOError("read index", self.path, str(exc)) from exc
        return SavedState(manifest, bytes(row[-1]), open_turn)

    def turn(self, number: int) -> Optional[Turn]:
        if type(number) is not int or not 0 < number < 2**63:
            return None  # SQLite's integers end at 2^63 - 1: no such turn, not an OverflowError
        rows = self._read(f"{_TURN_SELECT} WHERE number = ?", (number,))
        return Turn(*rows[0]) if rows else None

    def turns(self, since: int = 0) -> list[Turn]:
        """The turns numbered ``since`` or later, oldest first."""
        return [Turn(*row) for row in self._read(f"{_TURN_SELECT} WHERE number >= ? ORDER BY number", (since,))]

    def max_seq(self) -> int:
        """The largest seq indexed (0: none)."""
        return self._read("SELECT coalesce(max(seq), 0) FROM events")[0][0]

    def turn_spans(self) -> list[tuple[int, int, int, int]]:
        """``(number, start_offset, end_offset, event_count)`` of every turn, oldest first."""
        return self._read("SELECT number, start_offset, end_offset, event_count FROM turns ORDER BY number")

    def event_position(self, seq: int) -> Optional[tuple[int, int, Optional[int]]]:
        """``(offset, length, turn)`` of the record with ``seq``, or ``None``."""
        if type(seq) is not int or not 0 < seq < 2**63:
            return None
        rows = self._read("SELECT offset, length, turn FROM events WHERE seq = ?", (seq,))
        return rows[0] if rows else None

    def make_durable(self) -> None:
        """Make every committed transaction survive a power cut: the WAL is synced (a passive
        checkpoint syncs it before it copies anything back), and so is the index's directory
        entry (an index written whole by :meth:`persist` was synced before its rename)."""
        if self._conn is not None and not self.memory_only:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:
                raise StoreIOError("sync index", self.path, str(exc)) from exc
        fsync_dir(self.path.parent)

    def committed_generation(self) -> Optional[int]:
        """The generation the index's manifest row holds (``None``: no row yet)."""
        rows = self._read("SELECT generation FROM manifest WHERE id = 1")
        return rows[0][0] if rows else None

    def derived_watermark(self) -> int:
        """The seq up to which the lazy derived tables hold every record (0: none)."""
        rows = self._read("SELECT seq FROM derived_state WHERE id = 1")
        return rows[0][0] if rows else 0

    def underived(
        self,
        after: int,
        limit: int,
        upto: Optional[int] = None,
    ) -> list[tuple[int, int, int, Optional[int], Optional[str]]]:
        """``(seq, offset, length, turn, ts)`` of up to ``limit`` records past seq ``after``
        (and not past ``upto``, when given)."""
        return self._read(
            "SELECT seq, offset, length, turn, ts FROM events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (after, _MAX_ROWID if upto is None else upto, limit),
        )

    def commit_derived(self, records: Sequence[BatchRecord], watermark: int) -> None:
        """Give ``records`` to the lazy derived tables and advance the watermark, in one
        transaction."""
        with self._transaction() as conn:
            for table in _derived:
                if table.lazy:
                    table.on_batch(conn, records)
            conn.execute("INSERT OR REPLACE INTO derived_state (id, seq) VALUES (1, ?)", (watermark,))

    def types_before(self, offset: int) -> dict[str, int]:
        """How many records of each type lie before byte ``offset`` (what a cap rewrite cut
        there evicts, for its summary)."""
        # offset grows with seq (the rowid), so the scan stops at the first record past it.
        first = self._read("SELECT seq FROM events WHERE offset >= ? ORDER BY seq LIMIT 1", (offset,))
        bound = first[0][0] if first else _MAX_ROWID
        rows = self._read("SELECT type, count(*) FROM events WHERE seq < ? GROUP BY type", (bound,))
        return {kind: count for kind, count in rows}

    def first_seq_from(self, offset: int) -> Optional[int]:
        """The seq of the first record at or after byte ``offset``."""
        rows = self._read("SELECT seq FROM events WHERE offset >= ? ORDER BY seq LIMIT 1", (offset,))
        return rows[0][0] if rows else None

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
        the last two must not overlap, and the event rows must number ``event_count``, end inside
        the covered log, and have seqs below ``next_seq``. Index lookups and two counts (SQLite
        counts a table's rows without reading them), so reopening a million-event session stays
        cheap; the interior rows are kept consistent by the transactions that write them.
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
            events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            last_event = conn.execute("SELECT seq, offset + length FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        except sqlite3.DatabaseError:
            return False
        if events != manifest.event_count or (last_event is not None and last_event[1] > covered):
            return False
        if last_event is not None and last_event[0] >= manifest.next_seq:
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
        records: Optional[Sequence[BatchRecord]] = None,
        derive_lazy: bool = False,
    ) -> None:
        """Record new event rows, changed turns and the manifest row in one transaction, and
        hand ``records`` (the same events, for derived tables) to every eager derived table;
        with ``derive_lazy`` to the lazy ones too, advancing their watermark (a rebuild, which
        derives everything anyway, saves reading the log a second time).

        With ``reset`` every existing row is dropped first, in the same transaction. A rebuild
        commits in batches (so an interrupted one resumes where it stopped), so a concurrent
        reader may see a partly rebuilt index until it finishes.
        """
        self.commit_rows(
            events,
            [t.as_row() for t in turns],
            manifest_row(manifest),
            tail,
            reset=reset,
            records=records,
            derive_lazy=derive_lazy,
        )

    def commit_rows(
        self,
        events: Sequence[tuple],
        turn_rows: Sequence[tuple],
        manifest_values: tuple,
        tail: bytes,
        *,
        reset: bool = False,
        records: Optional[Sequence[BatchRecord]] = None,
        lines: Optional[Sequence[bytes]] = None,
        derive_lazy: bool = False,
        evict: Optional[EvictSpec] = None,
        durable: bool = False,
    ) -> None:
        """:meth:`commit` with the turn and manifest rows already made (the publisher builds
        them on the writer's thread, which goes on changing the live objects); ``lines`` are
        the events' lines, from which the records for eager derived tables are made.

        With ``evict`` a cap rewrite is applied first, in the same transaction (the rows are of
        the rewritten log). With ``durable`` the commit syncs the WAL (``synchronous=FULL`` for
        this transaction), so it and every commit before it survive a power cut."""
        faults.check("index.commit", path=self.path)
        if durable:
            faults.check("index.sync", path=self.path)
        if records is None and lines is not None and any(not t.lazy for t in _derived):
            records = [
                BatchRecord(row[0], row[3], row[4], row[1], row[2], line=line) for row, line in zip(events, lines)
            ]
        with self._transaction(durable=durable) as conn:
            if evict is not None:
                self._apply_evict(conn, evict)
            if reset and not self.memory_only:  # (a new index built in memory has nothing to drop)
                conn.execute("DELETE FROM events")
                conn.execute("DELETE FROM turns")
                conn.execute("DELETE FROM manifest")
                conn.execute("DELETE FROM derived_state")
                for table in _derived:
                    table.on_reset(conn)
            derive_lazy = derive_lazy and self.lazy_failure is None
            if events:
                conn.executemany(_EVENT_INSERT, events)
                if records:
                    for table in _derived:
                        if not table.lazy:
                            table.on_batch(conn, records)
                    if derive_lazy:
                        derive_lazy = self._derive_lazy(conn, records)
            if turn_rows:
                conn.executemany(_TURN_UPSERT, turn_rows)
            conn.execute(_MANIFEST_UPSERT, (*manifest_values, tail_digest(tail)))
        self.fully_derived = derive_lazy and (reset or self.fully_derived)

    def _derive_lazy(self, conn: sqlite3.Connection, records: Sequence[BatchRecord]) -> bool:
        """Give ``records`` to the lazy derived tables and advance their watermark, in a
        savepoint: a failing table costs its rows (derived later, as on the agent's path), not
        the batch. After a failure no later batch is derived here, which would leave a gap
        below the watermark."""
        conn.execute("SAVEPOINT derive_lazy")
        try:
            for table in _derived:
                if table.lazy:
                    table.on_batch(conn, records)
            conn.execute("INSERT OR REPLACE INTO derived_state (id, seq) VALUES (1, ?)", (records[-1].seq,))
        except (sqlite3.Error, OverflowError) as exc:
            conn.execute("ROLLBACK TO derive_lazy")
            conn.execute("RELEASE derive_lazy")
            self.lazy_failure = exc
            logger.warning(
                "%s: the derived tables were not filled with the index (they are derived later): %s", self.path, exc
            )
            return False
        conn.execute("RELEASE derive_lazy")
        return True

    def _apply_evict(self, conn: sqlite3.Connection, spec: EvictSpec) -> None:
        faults.check("index.evict", path=self.path)
        cut = spec.truncate_offset
        params = {"cut": cut, "pivot": spec.pivot, "delta": spec.delta, "grown": cut if spec.grown else -1}
        first_kept_seq = conn.execute(
            "SELECT seq FROM events WHERE offset >= ? ORDER BY seq LIMIT 1", (cut,)
        ).fetchone()
        conn.execute("DELETE FROM turns WHERE number < ?", (spec.first_kept_turn,))
        conn.execute("DELETE FROM events WHERE offset < ?", (cut,))
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
        for table in _derived:
            table.on_evict(conn, first_kept_seq[0] if first_kept_seq else None)
        # What was evicted needs no deriving any more.
        conn.execute(
            "UPDATE derived_state SET seq = max(seq, coalesce((SELECT min(seq) FROM events), ?) - 1) WHERE id = 1",
            (spec.next_seq,),
        )

    @contextmanager
    def _transaction(self, *, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction; any failure rolls back and surfaces as a StoreIOError. With
        ``durable`` its commit syncs the WAL."""
        conn = self.conn
        if durable:
            try:
                conn.execute("PRAGMA synchronous=FULL")
            except sqlite3.Error as exc:
                raise StoreIOError("update index", self.path, str(exc)) from exc
            try:
                with self._transaction() as conn:
                    yield conn
            finally:
                try:
                    conn.execute("PRAGMA synchronous=NORMAL")
                except sqlite3.Error as exc:
                    logger.warning("%s: could not go back to synchronous=NORMAL: %s", self.path, exc)
            return
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
                    except sqlite3.Error as exc:
                        logger.debug("rollback on %s: %s", self.path, exc)
                raise
        except (sqlite3.Error, OverflowError) as exc:
            raise StoreIOError("update index", self.path, str(exc)) from exc


def file_stamp(path: Path) -> tuple:
    """What changes when a writer touches an index: the file's identity, size and time, and
    whether its WAL side files exist."""
    try:
        st = os.stat(path)
        main = (st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        main = None
    return main, os.path.exists(f"{path}-wal"), os.path.exists(f"{path}-shm")


def readonly_uri(path: os.PathLike | str) -> Optional[str]:
    """The URI that opens an index for reading without creating or writing any file, or
    ``None`` when there is none.

    With a writer about (its ``-wal`` and ``-shm`` files exist) that is the usual read-only
    open. At rest those files do not exist and a read-only open would create them, so the
    database is opened ``immutable`` (no locks, no side files); callers must check
    :func:`file_stamp` after reading and read again if a writer arrived meanwhile. With only
    one of them (a writer between creating or deleting the two, a killed one, a partial copy)
    a read-only open creates the other, and an immutable one would ignore a WAL that may hold
    what the file lacks: ``None``, read the log instead.
    """
    path = Path(path)
    wal, shm = os.path.exists(f"{path}-wal"), os.path.exists(f"{path}-shm")
    if wal and shm:
        return f"{path.absolute().as_uri()}?mode=ro"
    if wal or shm:
        return None
    # mode=ro too: immutable alone opens read-write, and creates a missing file.
    return f"{path.absolute().as_uri()}?mode=ro&immutable=1"


_SIDE_FILES = ("-wal", "-shm", "-journal")

_templates: dict[tuple, bytes] = {}
# File format versions 2/2 (header bytes 18 and 19) mark a database in WAL mode, as every index
# on disk is: a new index then starts in WAL instead of being converted from a rollback journal
# on its first open (a journal file and two fdatasyncs per index). An index built in memory
# starts as 1/1 (memory databases have no WAL) and is marked when it is written out.
_WAL_FORMAT = b"\x02\x02"


def _template(*, wal: bool = True) -> bytes:
    """The bytes of an empty index with every migration applied (the log's and the registered
    derived tables'), made once per process (see ``schema.template_bytes``: without sqlite-utils
    on the agent's path). A new index starts as a copy of it: writing 60 KB costs a fraction of
    creating a dozen tables and an FTS5 index."""
    sets = (LOG_MIGRATIONS, *(t.migrations for t in _derived))
    key = (wal, sets)
    data = _templates.get(key)
    if data is None:
        built = bytearray(template_bytes(sets, INDEX_FORMAT))
        if wal:
            built[18:20] = _WAL_FORMAT
        data = _templates[key] = bytes(built)
    return data


def _create_private(path: Path) -> tuple[int, int]:
    """Make sure ``path`` is a regular file, creating it 0600 (from its first byte) as a copy of
    the empty index (see :func:`_template`) when missing or empty; never through a symlink.
    Returns its ``(st_dev, st_ino)``."""
    flags = (
        os.O_RDWR
        | os.O_CREAT
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
        | getattr(os, "O_NONBLOCK", 0)
    )
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise StoreIOError.from_os_error("open index", path, exc) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError("open index", path, "is not a regular file")
        os.fchmod(fd, 0o600)
        if st.st_size == 0 and not os.path.exists(f"{path}-wal"):
            write_all(fd, _template(), path)
    except OSError as exc:
        raise StoreIOError.from_os_error("create index", path, exc) from exc
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino


def _check_identity(path: Path, identity: tuple[int, int]) -> None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", path, exc) from exc
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != identity:
        raise UnsafePathError("open index", path, "was replaced while it was opened")
    for suffix in ("-wal", "-shm"):
        side = f"{path}{suffix}"
        try:
            if stat.S_ISREG(os.lstat(side).st_mode):  # never chmod through a symlink
                os.chmod(side, 0o600)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("could not make %s private: %s", side, exc)


_CORRUPTION_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the file is damaged or not a database (rebuild it), as opposed to an
    I/O failure such as a full disk (report it; deleting the index would not help)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPTION_CODES
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


def manifest_row(m: Manifest) -> tuple:
    """The manifest table's values for ``m`` (``tail`` not included)."""
    values = []
    for name in _MANIFEST_COLUMNS:
        value = getattr(m, name)
        if name == "source":
            value = orjson.dumps(value).decode() if value is not None else None
        values.append(value)
    return tuple(values)


def _manifest_from_row(row: Sequence) -> Optional[Manifest]:
    values = dict(zip(_MANIFEST_COLUMNS, row))
    values["in_turn"] = bool(values["in_turn"])
    source = values.get("source")
    try:
        values["source"] = orjson.loads(source) if source else None
    except orjson.JSONDecodeError:
        return None
    return Manifest.from_dict(values)


def read_turns(path: os.PathLike | str) -> list[Turn]:
    """The turns of an index opened read-only; [] when there is no usable index."""
    index = SessionIndex.open_readonly(path)
    if index is None:
        return []
    try:
        return index.turns()
    finally:
        index.close()
