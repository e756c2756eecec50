"""The catalog's file and schema: opening ``<root>/catalog.db`` safely, its tables and views, and
what SQLite's errors on it mean.

Opening never follows a symlink and never opens a FIFO: ``catalog.db`` and its ``-wal``,
``-shm`` and ``-journal`` side files must each be a regular file or absent, else
:class:`UnsafePathError` names the one that is not (a symlinked catalog would make memstore
chmod, convert and rewrite whatever it points at). A catalog SQLite cannot read, one of a
layout this memstore does not know, and one whose search tables are of another format are set
aside (kept beside it) and built again: the catalog is a view of the sessions.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import sqlite3
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..bm25 import SearchIndex
from ..bm25.segments import FORMAT as SEARCH_FORMAT
from ..errors import InvalidEvent, StoreIOError, UnsafePathError
from ..events import normalize_ts
from ..layout import catalog_path
from ..session.index import TURN_COLUMNS, MigrationSet, _is_corruption, readonly_uri

if TYPE_CHECKING:
    import sqlite_utils

logger = logging.getLogger("memstore.catalog")

SIDE_SUFFIXES = ("-wal", "-shm", "-journal")

# SQLite's primary result codes this module tells apart.
SQLITE_PERM = 3
SQLITE_READONLY = 8
SQLITE_IOERR = 10
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
# Below this much free space a write SQLite calls a "disk I/O error" is taken for a full disk.
NEARLY_FULL_BYTES = 1 << 20

TURN_COST_COLUMNS = ("cost_usd", "cost_source", "price_version")


# --------------------------------------------------------------------------------------------
# Schema


def _create_tables(db: sqlite_utils.Database) -> None:
    db.table("sessions").create(
        {
            "session_id": str,
            "directory": str,
            "status": str,
            "created_at": str,
            "updated_at": str,
            "turn_count": int,
            "event_count": int,
            "retained_turn_base": int,
            "generation": int,
            "agent": str,
            "agent_version": str,
            "cwd": str,
            "git_branch": str,
            "source_path": str,
            "parent_session_id": str,
            "title": str,
            "model": str,
            "turns_failed": int,
            "input_tokens": int,
            "cached_input_tokens": int,
            "cache_creation_tokens": int,
            "output_tokens": int,
            "log_bytes": int,
            "cost_usd": float,
            "cost_estimated": float,
            "cost_unpriced_turns": int,
            "origin_store_id": str,
            "origin_label": str,
            "origin_session_id": str,
            "origin_root": str,
        },
        pk="session_id",
    )
    db.table("sessions").create_index(["updated_at"], index_name="sessions_updated")
    db.table("sessions").create_index(["origin_store_id"], index_name="sessions_origin_store")
    db.table("sessions").create_index(["origin_label"], index_name="sessions_origin_label")
    db.table("sessions").create_index(["directory"], index_name="sessions_directory", unique=True)
    db.table("turns").create(
        {
            "session_id": str,
            **{
                c: (int if c not in ("status", "started_at", "ended_at", "error", "model") else str)
                for c in TURN_COLUMNS
            },
            "duration_ms": int,
            "cost_usd": float,
            "cost_source": str,
            "price_version": str,
        },
        pk=("session_id", "number"),
    )
    db.table("turns").create_index(["started_at"], index_name="turns_started")
    db.table("events").create(
        {
            "session_id": str,
            "seq": int,
            "turn": int,
            "ts": str,
            "type": str,
            "item_type": str,
            "item_id": str,
            "name": str,
            "status": str,
            "exit_code": int,
            "offset": int,
            "length": int,
        },
        pk=("session_id", "seq"),
    )
    db.table("events").create_index(["session_id", "turn"], index_name="events_turn")
    db.table("events").create_index(["item_type", "status"], index_name="events_item_type")
    db.table("file_changes").create({"session_id": str, "seq": int, "turn": int, "path": str, "kind": str})
    db.table("file_changes").create_index(["session_id", "seq"], index_name="file_changes_session")
    db.table("file_changes").create_index(["path"], index_name="file_changes_path")
    db.table("chunks").create(
        {
            "id": int,
            "chunk_id": str,
            "session_id": str,
            "seq": int,
            "turn": int,
            "part": int,
            "source": str,
            "kind": str,
            "path": str,
            "start_line": int,
            "end_line": int,
            "created_at": str,
            "text": str,
        },
        pk="id",
        not_null={"chunk_id", "session_id", "source", "text"},
    )
    db.table("chunks").create_index(["chunk_id"], index_name="chunks_chunk_id", unique=True)
    db.table("chunks").create_index(["session_id", "seq"], index_name="chunks_session_seq")
    db.table("chunks").create_index(["created_at"], index_name="chunks_created")
    # External content (the text is stored once, in chunks) for Datasette's ?_search= and the
    # explorer's fallback; rows reach chunks a batch at a time (one INSERT ... SELECT), so FTS5
    # writes one segment per batch, not one per row.
    db.table("chunks").enable_fts(["text"], fts_version="FTS5", create_triggers=True, tokenize="unicode61")
    # Where each session stands: what the catalog copied, the file stamps that say whether
    # anything changed since (``stamp``: every file a copy reads; ``sweep``: the ones the sweep
    # looks at), how far the log was copied and the bytes that end there, the total the agent
    # reported on thread.completed (it overrides the sum of the turns' costs), the title and
    # whether it is a prompt (a later prompt replaces one from an agent message), and the
    # first retained turn (a cap rewrite that evicts moves it).
    db.table("catalog_state").create(
        {
            "directory": str,
            "session_id": str,
            "generation": int,
            "seq": int,
            "last_turn": int,
            "stamp": str,
            "sweep": str,
            "log_bytes": int,
            "tail": bytes,
            "reported_total": float,
            "title": str,
            "title_from_user": int,
            "retained_turn_base": int,
        },
        pk="directory",
    )
    # Session directories the last refresh could not copy, and why: what searches report as missing.
    db.table("catalog_errors").create(
        {"directory": str, "session_id": str, "reason": str, "errno": int, "sweep": str, "at": str},
        pk="directory",
    )
    db.table("catalog_meta").create({"key": str, "value": str}, pk="key")


def _create_views(db: sqlite_utils.Database) -> None:
    # Token sums are total() cast back to integers: SQLite's sum() raises on overflow, and a
    # hostile (or merely huge) usage must not break a page.
    db.create_view(
        "tool_calls",
        """
        SELECT session_id, seq, turn, ts, item_type, name AS tool, status AS outcome,
               status IN ('failed', 'error', 'declined', 'permission_rejected', 'permission_cancelled',
                          'hook_denied', 'invalid_tool', 'cancelled') AS failed
        FROM events
        WHERE type = 'item.completed' AND item_type IN ('tool_invocation', 'tool_call', 'mcp_tool_call')
    """,
    )
    db.create_view(
        "commands",
        """
        SELECT session_id, seq, turn, ts, name AS command, exit_code, status,
               (coalesce(exit_code, 0) != 0 OR status = 'failed') AS failed
        FROM events
        WHERE type = 'item.completed' AND item_type = 'command_execution'
    """,
    )
    db.create_view(
        "errors",
        """
        SELECT session_id, number AS turn, ended_at AS ts, 'turn ' || status AS what, error AS message
        FROM turns WHERE status = 'failed'
        UNION ALL
        SELECT e.session_id, e.turn, e.ts, e.type, c.text
        FROM events e LEFT JOIN chunks c ON c.session_id = e.session_id AND c.seq = e.seq AND c.part = 0
        WHERE e.type = 'error' OR (e.type = 'item.completed' AND e.item_type = 'error')
    """,
    )
    db.create_view(
        "token_usage_daily",
        """
        SELECT substr(coalesce(started_at, ended_at), 1, 10) AS day, coalesce(model, '') AS model,
               count(*) AS turns, CAST(total(input_tokens) AS INTEGER) AS input_tokens, CAST(total(cached_input_tokens) AS INTEGER) AS cached_input_tokens,
               CAST(total(cache_creation_tokens) AS INTEGER) AS cache_creation_tokens, CAST(total(output_tokens) AS INTEGER) AS output_tokens
        FROM turns GROUP BY day, model
    """,
    )
    db.create_view(
        "token_usage_by_model",
        """
        SELECT coalesce(model, '') AS model, count(*) AS turns, CAST(total(input_tokens) AS INTEGER) AS input_tokens,
               CAST(total(cached_input_tokens) AS INTEGER) AS cached_input_tokens, CAST(total(cache_creation_tokens) AS INTEGER) AS cache_creation_tokens,
               CAST(total(output_tokens) AS INTEGER) AS output_tokens,
               round(total(cached_input_tokens) / nullif(total(input_tokens), 0), 4) AS cache_hit_rate
        FROM turns GROUP BY model
    """,
    )
    # Dollars per day, model and agent, each kind of figure apart: what the agents reported,
    # what memstore estimated from the price table, and how many turns have no price (their
    # dollars are unknown, not 0: a day with unpriced turns is a lower bound).
    db.create_view(
        "cost_daily",
        """
        SELECT substr(coalesce(t.started_at, t.ended_at), 1, 10) AS day, coalesce(t.model, '') AS model,
               coalesce(s.agent, '') AS agent, count(*) AS turns,
               total(CASE WHEN t.cost_source = 'reported' THEN t.cost_usd END) AS reported_usd,
               total(CASE WHEN t.cost_source = 'estimated' THEN t.cost_usd END) AS estimated_usd,
               sum(t.cost_usd IS NULL) AS unpriced_turns
        FROM turns t LEFT JOIN sessions s ON s.session_id = t.session_id
        GROUP BY day, t.model, s.agent
    """,
    )
    db.create_view(
        "cost_by_model",
        """
        SELECT coalesce(model, '') AS model, count(*) AS turns,
               total(cost_usd) AS cost_usd,
               total(CASE WHEN cost_source = 'reported' THEN cost_usd END) AS reported_usd,
               total(CASE WHEN cost_source = 'estimated' THEN cost_usd END) AS estimated_usd,
               sum(cost_usd IS NULL) AS unpriced_turns,
               group_concat(DISTINCT price_version) AS price_versions
        FROM turns GROUP BY model
    """,
    )


CATALOG_MIGRATIONS = MigrationSet("memstore.catalog", (("tables_5", _create_tables), ("views_4", _create_views)))
"""The catalog's layout. Its first step names the layout: a catalog without it (an older
memstore's) is set aside and built again, as the catalog is regenerable. ``tables_5``: each
session's origin (the store, or machine, it was born in); ``tables_4`` added cost columns, what
a refresh left out, and every text redacted (``tables_3`` was the first redacted layout;
earlier ones may hold secrets, in their rows and in their search segments, so no catalog is
ever migrated: it is made again)."""


# --------------------------------------------------------------------------------------------
# Opening


def check_catalog_files(path: Path, op: str = "open catalog") -> None:
    """Refuse a ``catalog.db`` or side file that is a symlink or anything but a regular file
    (a FIFO, a directory, a socket), naming it: SQLite would follow or block on it."""
    for candidate in (str(path), *(f"{path}{suffix}" for suffix in SIDE_SUFFIXES)):
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreIOError.from_os_error("stat", candidate, exc) from exc
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(
                op, candidate, "is a symlink; refusing to follow it (remove it: the catalog is rebuilt)"
            )
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(
                op, candidate, f"is not a regular file ({_kind(st.st_mode)}); remove it: the catalog is rebuilt"
            )


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _make_private(path: Path) -> None:
    """chmod 0600 the catalog through a no-follow descriptor (a symlink swapped in after the
    check is refused, never followed)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError("open catalog", path, f"is not a regular file ({_kind(st.st_mode)})")
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def open_catalog(root: os.PathLike | str, *, _set_aside: bool = True) -> sqlite3.Connection:
    """Open (creating and migrating) ``<root>/catalog.db`` for writing, in WAL mode; the caller
    holds the store's ``catalog`` lock. One SQLite cannot read (not a database, damaged), one of a
    layout this memstore does not know, or one whose search tables are of another format is set
    aside and a new one created: the catalog is a view of the sessions, and keeping the old one
    would fail every refresh (and search) for ever. A symlink or FIFO at the catalog or a side
    file is refused (:class:`UnsafePathError`); other failures are :class:`StoreIOError`, with
    ``errno`` (``ENOSPC`` for a full disk) where the cause can be told."""
    path = catalog_path(root)
    check_catalog_files(path)
    created = not os.path.lexists(path)
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise storage_error("open catalog", path, exc) from exc
    try:
        return _open(conn, root, path, _set_aside)
    except BaseException:
        if created:
            _remove_new(path)  # a catalog this open began and could not finish (a full disk): none
        raise


def _remove_new(path: Path) -> None:
    for candidate in (str(path), *(f"{path}{suffix}" for suffix in SIDE_SUFFIXES)):
        try:
            if stat.S_ISREG(os.lstat(candidate).st_mode):
                os.unlink(candidate)
        except OSError:
            pass


def _open(conn: sqlite3.Connection, root: os.PathLike | str, path: Path, _set_aside: bool) -> sqlite3.Connection:
    try:
        _make_private(path)
        conn.create_function("memstore_ts", 1, normal_ts, deterministic=True)
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA temp_store=MEMORY")
        check_catalog_files(path)  # the side files SQLite has just made or opened
        problem = layout_problem(conn)
        if problem is not None and _has_tables(conn):
            raise _Outdated(problem)
        if CATALOG_MIGRATIONS.pending(conn):
            CATALOG_MIGRATIONS.apply(conn)
        SearchIndex(conn).ensure_schema()
    except _Outdated as outdated:
        conn.close()
        if not _set_aside:
            raise StoreIOError("open catalog", path, f"a new catalog is still unusable: {outdated}") from None
        aside = set_aside_catalog(path)
        logger.warning("catalog %s: %s; kept as %s, and a new catalog is built", path, outdated, aside)
        return open_catalog(root, _set_aside=False)
    except (sqlite3.Error, OSError) as exc:
        conn.close()
        # Once only: a new file that SQLite still cannot read is not the old file's fault.
        if _set_aside and isinstance(exc, sqlite3.DatabaseError) and _is_corruption(exc):
            aside = set_aside_catalog(path)
            logger.warning(
                "catalog %s could not be read (%s); kept as %s, and a new catalog is built", path, exc, aside
            )
            return open_catalog(root, _set_aside=False)
        if isinstance(exc, OSError):
            raise StoreIOError.from_os_error("open catalog", path, exc) from exc
        raise storage_error("open catalog", path, exc) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def open_catalog_readonly(root: os.PathLike | str, *, immutable: bool = False) -> sqlite3.Connection:
    """A read-only connection to ``<root>/catalog.db`` that creates and writes nothing (a store
    this process cannot write: a read-only copy, a read-only mount). ``immutable`` reads the
    file alone, without its WAL (what is committed there and not yet checkpointed is not seen):
    the way to read a catalog on a disk too full for SQLite's shared memory file.
    :class:`StoreIOError` when there is no catalog, or it cannot be read so, or it holds no
    search index (never built)."""
    path = catalog_path(root)
    check_catalog_files(path, "read catalog")
    if not path.is_file():
        raise StoreIOError(
            "read catalog",
            path,
            "no catalog; it is built by the first search or refresh with write access to the store",
            errno.ENOENT,
        )
    uri = f"{path.absolute().as_uri()}?mode=ro&immutable=1" if immutable else readonly_uri(path)
    if uri is None:
        raise StoreIOError(
            "read catalog", path, "only one of its WAL side files exists (a writer is opening or closing it): try again"
        )
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise storage_error("read catalog", path, exc) from exc
    try:
        conn.execute("PRAGMA query_only=1")
        problem = layout_problem(conn)
        if (
            problem is None
            and conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('search_segments', 'catalog_state')"
            ).fetchone()[0]
            < 2
        ):
            problem = "it was never built"
    except sqlite3.Error as exc:
        conn.close()
        raise storage_error("read catalog", path, exc) from exc
    if problem is not None:
        conn.close()
        raise StoreIOError("read catalog", path, f"it cannot be searched as it is: {problem}")
    return conn


class _Outdated(Exception):
    """The catalog is of a layout (or its search tables of a format) this memstore does not read."""


def layout_problem(conn: sqlite3.Connection) -> Optional[str]:
    """Why the catalog behind ``conn`` cannot be used as it is (a layout this memstore does not
    know, search tables of another format), or ``None``. An empty database has none."""
    pending = CATALOG_MIGRATIONS.pending(conn)
    if pending and pending[0] == CATALOG_MIGRATIONS.steps[0][0] and _has_tables(conn):
        return "it has an older layout"
    try:
        row = conn.execute("SELECT value FROM search_meta WHERE key = 'format'").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    if row is not None and row[0] != str(SEARCH_FORMAT):
        return f"its search tables are of format {row[0]}, not {SEARCH_FORMAT}"
    return None


def _has_tables(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0


def set_aside_catalog(path: Path) -> Path:
    """Move a catalog that cannot be used out of the way, beside it (as torn tails are kept),
    with its side files gone, so the next open builds a new one; return where it went. The
    caller holds the store's ``catalog`` lock."""
    aside = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
    try:
        os.replace(path, aside)
        for suffix in SIDE_SUFFIXES:
            try:
                os.unlink(f"{path}{suffix}")
            except FileNotFoundError:
                pass
    except OSError as exc:
        raise StoreIOError.from_os_error("set aside", path, exc) from exc
    return aside


# --------------------------------------------------------------------------------------------
# Errors


def storage_error(op: str, path: os.PathLike | str, exc: sqlite3.Error) -> StoreIOError:
    """A :class:`StoreIOError` for SQLite's ``exc`` on the database ``path`` that says what is
    wrong and where: SQLite reports a full disk as "database or disk is full" or, when growing
    a side file fails, as a bare "disk I/O error", a file-size limit as a "disk I/O error", and
    a side file it may not open as "unable to open database file". Each is told apart by looking
    at the file system, and given its ``errno`` (``ENOSPC``, ``EFBIG``, ``EACCES``, ``EROFS``)."""
    path = os.fspath(path)
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc)
    if primary is None:
        lowered = text.lower()
        primary = (
            SQLITE_FULL
            if "disk is full" in lowered
            else SQLITE_IOERR
            if "disk i/o error" in lowered
            else SQLITE_CANTOPEN
            if "unable to open" in lowered
            else SQLITE_READONLY
            if "readonly" in lowered
            else None
        )
    if primary in (SQLITE_FULL, SQLITE_IOERR):
        if primary == SQLITE_FULL or _nearly_full(path):
            return StoreIOError(op, path, f"no space left on device ({text})", errno.ENOSPC)
        if _at_size_limit(path):
            return StoreIOError(op, path, f"the file size limit (RLIMIT_FSIZE) is reached ({text})", errno.EFBIG)
        return StoreIOError(op, path, text, errno.EIO)
    if primary in (SQLITE_CANTOPEN, SQLITE_READONLY, SQLITE_PERM):
        try:
            check_catalog_files(Path(path), op)
        except StoreIOError as unsafe:
            return unsafe
        problem = _access_problem(path)
        if problem is not None:
            detail, number = problem
            return StoreIOError(op, path, f"{detail} ({text})", number)
    return StoreIOError(op, path, text)


def _free_bytes(path: str) -> Optional[int]:
    try:
        st = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return None
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def _nearly_full(path: str) -> bool:
    free = _free_bytes(path)
    return free is not None and free < NEARLY_FULL_BYTES


def _at_size_limit(path: str) -> bool:
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return False
    for candidate in (path, f"{path}-wal", f"{path}-journal"):
        try:
            if os.stat(candidate).st_size + (64 << 10) >= soft:
                return True
        except OSError:
            continue
    return soft < (1 << 20)  # too small for any catalog


def _access_problem(path: str) -> Optional[tuple[str, int]]:
    directory = os.path.dirname(path) or "."
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return f"{directory} is on a read-only file system", errno.EROFS
    except OSError:
        pass
    for candidate, mode in (
        (directory, os.W_OK | os.X_OK),
        *((f"{path}{s}", os.R_OK | os.W_OK) for s in ("",) + SIDE_SUFFIXES),
    ):
        if os.path.lexists(candidate) and not os.access(
            candidate, mode, effective_ids=os.access in os.supports_effective_ids
        ):
            return f"{candidate} cannot be written by this user", errno.EACCES
    return None


# --------------------------------------------------------------------------------------------
# Values


def normal_ts(value: object) -> Optional[str]:
    """A time in memstore's format (what ``since`` compares with as a string), or ``None`` when
    ``value`` is no time."""
    if value is None:
        return None
    try:
        return normalize_ts(value)
    except (InvalidEvent, TypeError, ValueError):
        return None


def str_or_none(value: object) -> Optional[str]:
    return value if isinstance(value, str) else None
