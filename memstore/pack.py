"""Audit packs: a SHA-256 inventory of a session, and its verification.

A pack records the path (relative, ``/``-joined), size and SHA-256 of every regular file under
the session directory (``entries``), plus the manifest's status and counts. Verifying it later
reports files whose content changed (``mismatches``), files that are gone (``missing``) and, for
information only, files added since (``unaccounted``).

**The SQLite index is inventoried by what it holds, not by its bytes.** ``index/session.db``
changes on disk while nothing the user cares about changes: its ``-wal``/``-shm`` side files
move while the session idles, a checkpoint rewrites the file at close, and the deriver fills the
lazily derived tables (search chunks, event details, file changes) once the agent is idle. So
the pack lists it under ``databases`` instead of ``entries``::

    "databases": [{"path": "index/session.db", "digest": "sqlite-rows-v1", "sha256": "<hex>",
                   "tables": [{"name": "events", "rows": 12, "sha256": "<hex>"},
                              {"name": "chunks", "rows": 9, "sha256": "<hex>", "through_seq": 12}, ...]}]

Each table's digest covers its column names and its rows in primary-key order (rowid order for
a table without one), every value encoded with its SQLite type. Covered: every ordinary table
(the log's tables, the migrations record) and the schema itself (``sqlite_schema``); a lazily
derived table only up to the derivation watermark at packing time (``through_seq``: the rows
of records up to that seq, which never change once derived). Not covered: ``derived_state``
(the watermark itself), SQLite's own ``sqlite_*`` tables (statistics, sequences), and FTS5
virtual tables and their shadow tables (an index over ``chunks.text``, whose rows are covered;
its segment layout changes as FTS5 merges). The ``-wal``, ``-shm`` and ``-journal`` files are
not inventoried: what they hold is read through the database. The database is read through a
read-only connection that writes nothing (``immutable`` at rest, the usual read-only open while
a writer is about, a private copy when neither is safe), within one read transaction.

So a pack verifies for as long as the log, the manifest, the other files and what the index
holds are unchanged: whether the session is open, idle, closed or reopened. Appending an event
changes ``events.jsonl`` (and the index and manifest with it). A database that cannot be read as
SQLite when packing is inventoried by its bytes, like any file.

**Compatibility.** ``schema_version`` stays 1 and ``entries`` keeps VT Code's shape;
``databases`` is present only when the session has an index, so a pack of a session without one
(VT Code's own sessions) is exactly VT Code's. Readers that do not know ``databases`` (VT Code's,
older memstore) verify ``entries`` as always and see the index as unaccounted. A pack made
before this change lists the index and its side files in ``entries``; it is verified as it was
made: by bytes.

Safety rules:

* symlinks are never followed, neither while packing nor while verifying (a symlink found where
  a packed file was is a mismatch);
* files are hashed in fixed-size chunks, so memory stays flat whatever the session's size;
* any file named ``audit-pack.json`` is excluded, so a pack stored in the session does not
  inventory itself;
* memstore's own transient temp files (``.<name>.tmp-<pid>-<hex>``) are left out; hidden files
  are inventoried like any other;
* names that could not be verified safely (backslashes, drive-like ``C:`` components, NUL, names
  that are not UTF-8) are not inventoried; ``verify`` lists such files as ``unaccounted``;
* before opening anything, ``verify`` validates every entry and database path of the pack and
  refuses the whole pack (``InvalidPack``) if one is empty, absolute, contains ``..`` or any of
  the above, or is listed twice.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeGuard

import orjson

from .errors import InvalidPack, StoreIOError, UnsafePathError
from .events import utc_now
from .fsio import atomic_write, ensure_private_dir, read_no_follow, temp_file_pid
from .layout import DERIVED_DIR, INDEX_DIR, INDEX_FILE, MANIFEST_FILE, PACK_FILE, session_directory
from .session.index import derived_tables, file_stamp, readonly_uri
from .session.manifest import load_summary

logger = logging.getLogger(__name__)

PACK_SCHEMA_VERSION = 1
CHUNK_SIZE = 1 << 20
INDEX_REL = f"{INDEX_DIR}/{INDEX_FILE}"  # the one database a pack inventories by content
SQLITE_ROWS_DIGEST = "sqlite-rows-v1"
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
SCHEMA_TABLE = "sqlite_schema"  # the pseudo-table that stands for the schema in a database digest
WATERMARK_TABLE = "derived_state"
_READ_ATTEMPTS = 3

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_DRIVE_RE = re.compile(r"[A-Za-z]:")


@dataclass(frozen=True)
class AuditPackEntry:
    """One inventoried file: its path relative to the session dir, size and SHA-256 (hex)."""

    path: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class TableDigest:
    """What one table of a database holds: its row count and the SHA-256 of its columns and
    rows. ``through_seq``: a lazily derived table, covered only for the records up to it."""

    name: str
    rows: int
    sha256: str
    through_seq: Optional[int] = None

    def to_dict(self) -> dict:
        data: dict = {"name": self.name, "rows": self.rows, "sha256": self.sha256}
        if self.through_seq is not None:
            data["through_seq"] = self.through_seq
        return data


@dataclass(frozen=True)
class AuditPackDatabase:
    """A SQLite database inventoried by its content (see the module docstring): its path, the
    digest of every covered table, and one SHA-256 over them."""

    path: str
    sha256: str
    tables: tuple[TableDigest, ...]
    digest: str = SQLITE_ROWS_DIGEST

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "digest": self.digest,
            "sha256": self.sha256,
            "tables": [table.to_dict() for table in self.tables],
        }


@dataclass
class SessionAuditPack:
    """An audit pack (schema 1): the session's manifest summary, its file inventory, and the
    databases inventoried by content (``databases``, memstore's addition; written only when
    there is one)."""

    session_id: str
    generated_at: str
    status: str
    turn_count: int
    event_count: int
    entries: list[AuditPackEntry] = field(default_factory=list)
    schema_version: int = PACK_SCHEMA_VERSION
    databases: list[AuditPackDatabase] = field(default_factory=list)

    def to_dict(self) -> dict:
        data = {
            "schema_version": self.schema_version,
            "session_id": self.session_id,
            "generated_at": self.generated_at,
            "status": self.status,
            "turn_count": self.turn_count,
            "event_count": self.event_count,
            "entries": [entry.to_dict() for entry in self.entries],
        }
        if self.databases:
            data["databases"] = [database.to_dict() for database in self.databases]
        return data

    def to_json(self) -> bytes:
        """Pretty JSON (2-space indent), as written by ``write_audit_pack``."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)

    @classmethod
    def from_dict(cls, data: Any) -> SessionAuditPack:
        """Parse a pack; raise ``InvalidPack`` for an unsupported ``schema_version`` or a
        malformed shape. Entry paths are checked by ``verify_audit_pack``."""
        if not isinstance(data, dict):
            raise InvalidPack("an audit pack must be a JSON object")
        version = data.get("schema_version")
        if version != PACK_SCHEMA_VERSION or isinstance(version, bool):
            raise InvalidPack(f"unsupported schema_version {_show(version)} (expected {PACK_SCHEMA_VERSION})")
        for key in ("session_id", "generated_at", "status"):
            if not isinstance(data.get(key), str):
                raise InvalidPack(f"audit pack key {key!r} must be a string")
        for key in ("turn_count", "event_count"):
            if not _is_count(data.get(key)):
                raise InvalidPack(f"audit pack key {key!r} must be a non-negative integer")
        raw_entries = data.get("entries")
        if not isinstance(raw_entries, list):
            raise InvalidPack("audit pack key 'entries' must be a list")
        entries = []
        for raw in raw_entries:
            if not isinstance(raw, dict):
                raise InvalidPack("an audit pack entry must be a JSON object")
            path, size, digest = raw.get("path"), raw.get("bytes"), raw.get("sha256")
            if not isinstance(path, str):
                raise InvalidPack("an audit pack entry's 'path' must be a string")
            if not _is_count(size):
                raise InvalidPack(f"entry {path!r}: 'bytes' must be a non-negative integer")
            if not isinstance(digest, str) or not _SHA256_RE.fullmatch(digest):
                raise InvalidPack(f"entry {path!r}: 'sha256' must be 64 lowercase hex characters")
            entries.append(AuditPackEntry(path, size, digest))
        return cls(
            session_id=data["session_id"],
            generated_at=data["generated_at"],
            status=data["status"],
            turn_count=data["turn_count"],
            event_count=data["event_count"],
            entries=entries,
            schema_version=version,
            databases=_databases_from(data.get("databases", [])),
        )


def _databases_from(raw: Any) -> list[AuditPackDatabase]:
    """Parse a pack's ``databases``; ``InvalidPack`` for a malformed one or an unknown digest."""
    if not isinstance(raw, list):
        raise InvalidPack("audit pack key 'databases' must be a list")
    databases = []
    for item in raw:
        if not isinstance(item, dict):
            raise InvalidPack("an audit pack database must be a JSON object")
        path, digest, sha, raw_tables = item.get("path"), item.get("digest"), item.get("sha256"), item.get("tables")
        if not isinstance(path, str):
            raise InvalidPack("an audit pack database's 'path' must be a string")
        if digest != SQLITE_ROWS_DIGEST:
            raise InvalidPack(
                f"database {path!r}: unsupported digest {_show(digest)} (expected {SQLITE_ROWS_DIGEST!r})"
            )
        if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
            raise InvalidPack(f"database {path!r}: 'sha256' must be 64 lowercase hex characters")
        if not isinstance(raw_tables, list):
            raise InvalidPack(f"database {path!r}: 'tables' must be a list")
        tables = []
        for table in raw_tables:
            if not isinstance(table, dict) or not isinstance(table.get("name"), str):
                raise InvalidPack(f"database {path!r}: a table must be an object with a string 'name'")
            name, rows, table_sha = table["name"], table.get("rows"), table.get("sha256")
            through = table.get("through_seq")
            if not _is_count(rows):
                raise InvalidPack(f"database {path!r}, table {name!r}: 'rows' must be a non-negative integer")
            if not isinstance(table_sha, str) or not _SHA256_RE.fullmatch(table_sha):
                raise InvalidPack(f"database {path!r}, table {name!r}: 'sha256' must be 64 lowercase hex characters")
            if through is not None and not _is_count(through):
                raise InvalidPack(f"database {path!r}, table {name!r}: 'through_seq' must be a non-negative integer")
            tables.append(TableDigest(name, rows, table_sha, through))
        databases.append(AuditPackDatabase(path, sha, tuple(tables), digest))
    return databases


@dataclass
class PackVerification:
    """The result of ``verify_audit_pack``.

    ``verified`` is true when nothing is in ``mismatches`` or ``missing``; ``unaccounted`` (files
    present now but not in the pack) is informational and does not affect it. ``details`` says,
    for a mismatched database, what differs (which tables); it is not part of ``to_dict``.
    """

    verified: bool
    mismatches: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "verified": self.verified,
            "mismatches": list(self.mismatches),
            "missing": list(self.missing),
            "unaccounted": list(self.unaccounted),
        }


def _show(value: Any) -> str:
    return str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else repr(value)


def _is_count(value: Any) -> TypeGuard[int]:
    return type(value) is int and value >= 0


# --------------------------------------------------------------------------------------------
# Paths


def _component_problem(component: str) -> Optional[str]:
    if component == "":
        return "has an empty component"
    if component in (".", ".."):
        return f"has a {component!r} component"
    if "\\" in component:
        return "contains a backslash"
    if "\x00" in component:
        return "contains a NUL character"
    if _DRIVE_RE.match(component):
        return "has a drive-letter component"
    try:
        component.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def _path_problem(path: Any) -> Optional[str]:
    """Why ``path`` is not a safe entry path, or ``None`` when it is."""
    if not isinstance(path, str) or path == "":
        return "is empty"
    if path.startswith("/"):
        return "is absolute"
    for component in path.split("/"):
        problem = _component_problem(component)
        if problem:
            return problem
    return None


def _display(relpath: str) -> str:
    """``relpath`` as printable text, even when the name is not valid UTF-8."""
    return os.fsencode(relpath).decode("utf-8", "backslashreplace")


# --------------------------------------------------------------------------------------------
# Walking and hashing


def _session_dir(root: os.PathLike | str, session_id: str) -> Path:
    """The session directory, which must exist as a real directory (never a symlink)."""
    path = session_directory(root, session_id)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StoreIOError("open session directory", path, "No such file or directory", errno.ENOENT) from None
    except OSError as exc:
        raise StoreIOError.from_os_error("open session directory", path, exc) from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError("open session directory", path, "is a symlink; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise StoreIOError("open session directory", path, "is not a directory", errno.ENOTDIR)
    return path


def _walk_files(session_dir: Path, exclude: frozenset = frozenset()) -> Iterator[str]:
    """Relative ``/``-joined paths of every regular file under ``session_dir`` (symlinks and
    special files skipped, directories entered without following symlinks; ``audit-pack.json``,
    memstore's own transient temp files and the ``exclude`` paths left out), in name order."""
    stack = [""]
    while stack:
        prefix = stack.pop()
        directory = session_dir / prefix if prefix else session_dir
        try:
            with os.scandir(directory) as it:
                items = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            continue  # removed while walking
        except OSError as exc:
            raise StoreIOError.from_os_error("list directory", directory, exc) from exc
        subdirs = []
        for entry in items:
            rel = f"{prefix}/{entry.name}" if prefix else entry.name
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(rel)
                elif (
                    entry.is_file(follow_symlinks=False)
                    and entry.name != PACK_FILE
                    and temp_file_pid(entry.name) is None
                    and rel not in exclude
                ):
                    yield rel
            except OSError as exc:
                raise StoreIOError.from_os_error("stat", directory / entry.name, exc) from exc
        stack.extend(reversed(subdirs))


def _open_beneath(session_dir: Path, relpath: str) -> int:
    """Open ``relpath`` under ``session_dir`` read-only, refusing a symlink at every component.

    Raises ``OSError`` (``ENOENT``, ``ENOTDIR``, ``ELOOP``, ...) for the caller to classify.
    """
    parts = relpath.split("/")
    dir_flags = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(session_dir, dir_flags)
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, dir_flags, dir_fd=fd)
            except NotADirectoryError:
                # Linux reports a symlinked directory as ENOTDIR under O_DIRECTORY; tell it apart
                # from a plain file so the caller can call it a mismatch, not a missing file.
                if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise OSError(errno.ELOOP, "is a symlink", part) from None
                raise
            os.close(fd)
            fd = next_fd
        # O_NONBLOCK: a FIFO planted where a file was must not hang the open.
        return os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def _digest_fd(fd: int, path: Path) -> tuple[int, str]:
    """Size and SHA-256 of the open file, read in ``CHUNK_SIZE`` chunks into one buffer."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK_SIZE)
    view = memoryview(buffer)
    total = 0
    try:
        with open(fd, "rb", buffering=0, closefd=False) as fh:
            while True:
                n = fh.readinto(buffer)
                if not n:
                    break
                digest.update(view[:n])
                total += n
    except OSError as exc:
        raise StoreIOError.from_os_error("read", path, exc) from exc
    return total, digest.hexdigest()


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


# --------------------------------------------------------------------------------------------
# Databases, by what they hold


class _Text(bytes):
    """A TEXT value as SQLite stores it, never decoded (text that is not UTF-8 digests too)."""


class _Unreadable(Exception):
    """The file cannot be read as a SQLite database (the message says why)."""


class _Retry(Exception):
    """The database changed under the read (a writer arrived, the file was replaced)."""


# SQLite result codes that say the file's content is not a readable database, rather than that
# the file could not be opened or read.
_CONTENT_ERRORS = frozenset({"SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_FORMAT", "SQLITE_SCHEMA", "SQLITE_ERROR"})
_BUSY_ERRORS = frozenset({"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_BUSY_RECOVERY", "SQLITE_BUSY_SNAPSHOT"})
_ROWID_ALIASES = ("rowid", "_rowid_", "oid")

# Which rows of a table a digest covers: given the table's name and columns, the seq up to which
# a lazily derived table is covered, or None for all of its rows.
ThroughSeq = Callable[[str, list[str]], Optional[int]]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _encode(value: Any) -> bytes:
    """One SQLite value, tagged with its type and (for text and blobs) its length, so that no
    two different rows encode alike."""
    if value is None:
        return b"n"
    if isinstance(value, _Text):
        return b"t%d:" % len(value) + bytes(value)
    if isinstance(value, bytes):
        return b"b%d:" % len(value) + value
    if isinstance(value, int):
        return b"i%d;" % value
    if isinstance(value, float):
        return b"r" + value.hex().encode("ascii") + b";"
    raise TypeError(f"unexpected SQLite value of type {type(value).__name__}")


def _digest_rows(name: str, columns: list[str], rows: Iterable[tuple], through_seq: Optional[int]) -> TableDigest:
    digest = hashlib.sha256()
    for text in [name, *columns]:
        digest.update(_encode(_Text(text.encode("utf-8", "surrogateescape"))))
    digest.update(b"|")
    count = 0
    for row in rows:
        digest.update(b"".join(map(_encode, row)))
        count += 1
    return TableDigest(name, count, digest.hexdigest(), through_seq)


def _covered_tables(conn: sqlite3.Connection) -> list[str]:
    """The ordinary tables of the database a digest covers, sorted by name: not SQLite's own
    ``sqlite_*`` tables, not virtual tables (FTS5) or their shadow tables, not the watermark."""
    try:
        listed = conn.execute("PRAGMA main.table_list").fetchall()
        names = [bytes(row[1]).decode("utf-8", "surrogateescape") for row in listed if bytes(row[2]) == b"table"]
    except sqlite3.OperationalError:  # SQLite older than 3.37: tell shadow tables by their names
        master = [
            (bytes(n).decode("utf-8", "surrogateescape"), bytes(sql or b""))
            for n, sql in conn.execute("SELECT name, sql FROM main.sqlite_master WHERE type = 'table'")
        ]
        virtual = [n for n, sql in master if sql.upper().startswith(b"CREATE VIRTUAL TABLE")]
        names = [n for n, _sql in master if n not in virtual and not any(n.startswith(v + "_") for v in virtual)]
    return sorted(n for n in names if not n.lower().startswith("sqlite_") and n.lower() != WATERMARK_TABLE)


def _table_digest(conn: sqlite3.Connection, name: str, through: ThroughSeq) -> TableDigest:
    info = conn.execute(f"PRAGMA main.table_info({_quote(name)})").fetchall()
    columns = [bytes(row[1]).decode("utf-8", "surrogateescape") for row in info]
    primary = [column for _position, column in sorted((row[5], columns[i]) for i, row in enumerate(info) if row[5])]
    lowered = {c.lower() for c in columns}
    rowid = next((alias for alias in _ROWID_ALIASES if alias not in lowered), None)
    if primary:
        order = ", ".join(map(_quote, primary))
    elif rowid is not None:
        order = rowid
    else:
        order = ", ".join(map(_quote, columns))
    through_seq = through(name, columns)
    if through_seq is not None and "seq" not in lowered:
        through_seq = None  # no longer a table of records: covered whole (and so it differs)
    where, params = ("", ()) if through_seq is None else (' WHERE "seq" <= ?', (through_seq,))
    sql = f"SELECT {', '.join(map(_quote, columns))} FROM main.{_quote(name)}{where} ORDER BY {order}"
    return _digest_rows(name, columns, conn.execute(sql, params), through_seq)


def _schema_digest(conn: sqlite3.Connection) -> TableDigest:
    """The schema: every table, index, view and trigger with its SQL (SQLite's own left out),
    and the application's version numbers (``user_version``, ``application_id``)."""
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM main.sqlite_master "
        "WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY type, name"
    ).fetchall()
    for pragma in ("application_id", "user_version"):
        value = conn.execute(f"PRAGMA main.{pragma}").fetchone()[0]
        rows.append((_Text(b"pragma"), _Text(pragma.encode()), None, value))
    return _digest_rows(SCHEMA_TABLE, ["type", "name", "tbl_name", "sql"], rows, None)


def _derived_watermark(conn: sqlite3.Connection) -> int:
    """Every record up to this seq is in the lazily derived tables (0: none, or no watermark)."""
    try:
        row = conn.execute(f"SELECT seq FROM main.{WATERMARK_TABLE} WHERE id = 1").fetchone()
    except sqlite3.OperationalError:
        return 0
    return row[0] if row is not None and type(row[0]) is int else 0


def _packing_cover(conn: sqlite3.Connection) -> ThroughSeq:
    """How a new pack covers each table: the lazily derived tables registered with the session
    index (those with a ``seq`` column) up to the current watermark, the others whole."""
    lazy = {table.name.lower() for table in derived_tables(lazy=True)}
    watermark = _derived_watermark(conn)

    def cover(name: str, columns: list[str]) -> Optional[int]:
        return watermark if name.lower() in lazy and "seq" in (c.lower() for c in columns) else None

    return cover


def _content(conn: sqlite3.Connection, through: Optional[ThroughSeq]) -> tuple[TableDigest, ...]:
    """The digests of the schema and of every covered table, read in one read transaction.
    ``through`` None: packing (see :func:`_packing_cover`); else as the pack being verified says."""
    conn.execute("BEGIN")
    try:
        cover = through if through is not None else _packing_cover(conn)
        return (_schema_digest(conn), *(_table_digest(conn, name, cover) for name in _covered_tables(conn)))
    finally:
        conn.execute("COMMIT")


def _combined(tables: Iterable[TableDigest]) -> str:
    return hashlib.sha256(orjson.dumps([table.to_dict() for table in tables])).hexdigest()


def _identity(session_dir: Path, relpath: str) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of the regular file ``relpath``, reached without following a
    symlink; ``OSError`` otherwise (``EINVAL`` for a file that is not regular)."""
    fd = _open_beneath(session_dir, relpath)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "is not a regular file", relpath)
    return st.st_dev, st.st_ino


def _read_database(session_dir: Path, relpath: str, through: Optional[ThroughSeq]) -> tuple[TableDigest, ...]:
    """What the database ``relpath`` holds (see :func:`_content`), read without writing to the
    session: through the read-only open :func:`readonly_uri` gives, checked against writers and
    replacement, and from a private copy when that cannot be done safely.

    Raises ``_Unreadable`` when it is not a readable database, ``OSError`` when the file is
    gone or no longer a regular file reached without symlinks, ``StoreIOError`` otherwise."""
    path = session_dir / relpath
    for _attempt in range(_READ_ATTEMPTS):
        identity = _identity(session_dir, relpath)
        uri = readonly_uri(path)
        if uri is None or os.path.lexists(f"{path}-journal"):
            break  # a side file without its partner, or a rollback journal: read a copy
        stamp = file_stamp(path)
        try:
            tables = _query(uri, path, through)
        except _Retry:
            continue
        if _identity(session_dir, relpath) == identity and ("immutable=1" not in uri or file_stamp(path) == stamp):
            return tables
    return _read_copy(session_dir, relpath, through)


def _query(uri: str, path: Path, through: Optional[ThroughSeq]) -> tuple[TableDigest, ...]:
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreIOError("open database", path, str(exc)) from exc
    try:
        conn.text_factory = _Text
        conn.execute("PRAGMA query_only = 1")
        return _content(conn, through)
    except UnicodeEncodeError as exc:  # a table or column name that is not UTF-8
        raise _Unreadable(f"a name that is not UTF-8 ({exc})") from exc
    except sqlite3.Error as exc:
        name = getattr(exc, "sqlite_errorname", "")
        if name in _BUSY_ERRORS:
            raise _Retry() from exc
        if name in _CONTENT_ERRORS or not name:
            raise _Unreadable(str(exc)) from exc
        raise StoreIOError("read database", path, str(exc)) from exc
    finally:
        conn.close()


def _read_copy(session_dir: Path, relpath: str, through: Optional[ThroughSeq]) -> tuple[TableDigest, ...]:
    """Read a private copy of the database and its side files (SQLite may recover a WAL or roll
    back a journal in the copy; the session's files are only read)."""
    path = session_dir / relpath
    with tempfile.TemporaryDirectory(prefix="memstore-pack-") as scratch:
        copy = Path(scratch) / "copy.db"
        for suffix in ("", "-wal", "-journal"):
            try:
                fd = _open_beneath(session_dir, relpath + suffix)
            except (FileNotFoundError, NotADirectoryError):
                if not suffix:
                    raise
                continue
            try:
                if not _is_regular(fd):
                    raise OSError(errno.EINVAL, "is not a regular file", relpath + suffix)
                with open(fd, "rb", closefd=False) as source, open(f"{copy}{suffix}", "wb") as target:
                    shutil.copyfileobj(source, target, CHUNK_SIZE)
            finally:
                os.close(fd)
        try:
            conn = sqlite3.connect(copy, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreIOError("open database copy", path, str(exc)) from exc
        try:
            conn.text_factory = _Text
            return _content(conn, through)
        except UnicodeEncodeError as exc:
            raise _Unreadable(f"a name that is not UTF-8 ({exc})") from exc
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorname", "") in _CONTENT_ERRORS | {""}:
                raise _Unreadable(str(exc)) from exc
            raise StoreIOError("read database copy", path, str(exc)) from exc
        finally:
            conn.close()


def _side_paths(relpath: str) -> set[str]:
    """A database and its side files: what a database entry stands for."""
    return {relpath, *(relpath + suffix for suffix in SIDE_SUFFIXES)}


def _inventory_database(session_dir: Path, relpath: str) -> Optional[AuditPackDatabase]:
    """The database ``relpath`` by content, or ``None`` when there is no such regular file (a
    symlink is not followed) or it is not a readable SQLite database (then it is inventoried by
    its bytes, like any file)."""
    try:
        tables = _read_database(session_dir, relpath, None)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except _Unreadable as exc:
        logger.warning(
            "%s cannot be read as a SQLite database (%s): inventoried by its bytes", session_dir / relpath, exc
        )
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EINVAL):
            return None  # a symlink or not a regular file: skipped like any other
        raise StoreIOError.from_os_error("open", session_dir / relpath, exc) from exc
    return AuditPackDatabase(relpath, _combined(tables), tables)


def _database_differences(packed: AuditPackDatabase, now: tuple[TableDigest, ...]) -> list[str]:
    """What differs between the tables the pack recorded and those the database holds now."""
    before = {table.name: table for table in packed.tables}
    after = {table.name: table for table in now}
    found = []
    for name in sorted(before.keys() | after.keys()):
        was, current = before.get(name), after.get(name)
        what = "the schema" if name == SCHEMA_TABLE else f"table {name!r}"
        if current is None:
            found.append(f"{what} is gone")
        elif was is None:
            found.append(f"{what} was added ({current.rows} rows)")
        elif was.rows != current.rows:
            found.append(f"{what} holds {current.rows} rows, was {was.rows}")
        elif was.sha256 != current.sha256:
            found.append(f"{what} changed" if name == SCHEMA_TABLE else f"the rows of {what} changed")
    if not found and _combined(now) != packed.sha256:
        found.append("its digest differs from the pack's")
    return found


def _check_database(session_dir: Path, packed: AuditPackDatabase) -> tuple[str, Optional[str]]:
    """``("ok" | "missing" | "mismatch", why)`` for one database of a pack."""
    modes = {table.name: table.through_seq for table in packed.tables}
    try:
        now = _read_database(session_dir, packed.path, lambda name, _columns: modes.get(name))
    except (FileNotFoundError, NotADirectoryError):
        return "missing", None
    except _Unreadable as exc:
        return "mismatch", f"not a readable SQLite database ({exc})"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "mismatch", "is a symlink"
        if exc.errno == errno.EINVAL:
            return "mismatch", "is not a regular file"
        raise StoreIOError.from_os_error("open", session_dir / packed.path, exc) from exc
    differences = _database_differences(packed, now)
    return ("mismatch", "; ".join(differences)) if differences else ("ok", None)


# --------------------------------------------------------------------------------------------
# Public API


def create_audit_pack(root: os.PathLike | str, session_id: str, *, exclude: Iterable[str] = ()) -> SessionAuditPack:
    """Inventory the session: size and SHA-256 of every regular file, sorted by path, and
    ``index/session.db`` by what it holds (its side files left out; see the module docstring).

    Left out: files named ``audit-pack.json``, memstore's transient temp files, and the
    session-relative paths in ``exclude`` (``write_audit_pack`` excludes its own output).

    Status and counts are copied from ``manifest.json``. A missing session directory, or a
    missing or malformed manifest, raises ``StoreIOError`` naming the path. A file that vanishes
    between listing and hashing is left out.
    """
    session_dir = _session_dir(root, session_id)
    summary = load_summary(session_dir)
    if summary is None:
        manifest = session_dir / MANIFEST_FILE
        detail = "is not a valid session manifest" if os.path.lexists(manifest) else "No such file or directory"
        raise StoreIOError("read manifest", manifest, detail)
    excluded = frozenset(exclude)
    databases = []
    if INDEX_REL not in excluded:
        index = _inventory_database(session_dir, INDEX_REL)
        if index is not None:
            databases.append(index)
            excluded |= _side_paths(INDEX_REL)
    entries = []
    for rel in _walk_files(session_dir, excluded):
        if _path_problem(rel):
            continue
        try:
            fd = _open_beneath(session_dir, rel)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # replaced by a symlink since the listing
                continue
            raise StoreIOError.from_os_error("open", session_dir / rel, exc) from exc
        try:
            if not _is_regular(fd):
                continue
            size, digest = _digest_fd(fd, session_dir / rel)
        finally:
            os.close(fd)
        entries.append(AuditPackEntry(rel, size, digest))
    entries.sort(key=lambda e: e.path)
    return SessionAuditPack(
        session_id=summary.session_id,
        generated_at=utc_now(),
        status=summary.status,
        turn_count=summary.turn_count,
        event_count=summary.event_count,
        entries=entries,
        databases=databases,
    )


def default_pack_path(root: os.PathLike | str, session_id: str) -> Path:
    """Where packs go by default: ``<session_dir>/derived/audit-pack.json``."""
    return session_directory(root, session_id) / DERIVED_DIR / PACK_FILE


def write_audit_pack(
    root: os.PathLike | str, session_id: str, output: Optional[os.PathLike | str] = None
) -> tuple[SessionAuditPack, Path]:
    """Create a pack and write it (pretty JSON, atomically, mode 0600) to ``output`` or to
    ``derived/audit-pack.json``; return ``(pack, path)``. ``output``'s directory must exist."""
    if output is None:
        path = default_pack_path(root, session_id)
    else:
        path = Path(output)
        if not path.parent.is_dir():
            raise StoreIOError("write audit pack", path.parent, "directory does not exist", errno.ENOENT)
    # A pack written inside the session must not inventory its own previous version.
    session_dir = os.path.realpath(session_directory(root, session_id))
    target = os.path.join(os.path.realpath(path.parent), path.name)
    inside = os.path.commonpath([session_dir, target]) == session_dir
    exclude = [Path(os.path.relpath(target, session_dir)).as_posix()] if inside else []
    # Made before anything is created: a session that is not there gets no derived/ directory.
    pack = create_audit_pack(root, session_id, exclude=exclude)
    if output is None:
        ensure_private_dir(path.parent)
    atomic_write(path, pack.to_json())
    return pack, path


def read_audit_pack(path: os.PathLike | str) -> SessionAuditPack:
    """Read a pack file. A missing or unreadable file (or a symlink, which is not followed)
    raises ``StoreIOError``; bad JSON, an unsupported ``schema_version`` or a malformed shape
    raises ``InvalidPack``."""
    data = read_no_follow(path)
    if data is None:
        raise StoreIOError("read audit pack", path, "No such file or directory", errno.ENOENT)
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidPack(f"{os.fspath(path)}: not valid JSON: {exc}") from exc
    try:
        return SessionAuditPack.from_dict(parsed)
    except InvalidPack as exc:
        raise InvalidPack(f"{os.fspath(path)}: {exc}") from exc


def verify_audit_pack(root: os.PathLike | str, session_id: str, pack: SessionAuditPack) -> PackVerification:
    """Check the session against ``pack``.

    Every entry and database path is validated first; one unsafe path (empty, absolute, ``.``
    or ``..``, backslash, drive letter) or a path listed twice raises ``InvalidPack`` before any
    file is opened. Then each entry is opened without following symlinks: absent → ``missing``;
    a different size or digest, a symlink or a non-regular file → ``mismatches``; other I/O
    errors raise ``StoreIOError``. Each database is read (without writing) and what it holds
    compared with the pack, table by table: a difference, or a file that is no longer a readable
    database, is a mismatch (``details`` says what differs). Files present but not in the pack
    (a database's side files count as in it) are ``unaccounted`` (sorted).
    """
    if pack.schema_version != PACK_SCHEMA_VERSION:
        raise InvalidPack(f"unsupported schema_version {_show(pack.schema_version)} (expected {PACK_SCHEMA_VERSION})")
    seen = set()
    for kind, path in [*(("entry", e.path) for e in pack.entries), *(("database", d.path) for d in pack.databases)]:
        problem = _path_problem(path)
        if problem:
            raise InvalidPack(f"{kind} path {path!r} {problem}")
        if path in seen:
            raise InvalidPack(f"{kind} path {path!r} is listed twice")
        seen.add(path)
    session_dir = _session_dir(root, session_id)
    mismatches, missing = [], []
    details: dict[str, str] = {}
    for database in pack.databases:
        outcome, why = _check_database(session_dir, database)
        if outcome == "missing":
            missing.append(database.path)
        elif outcome == "mismatch":
            mismatches.append(database.path)
            details[database.path] = why or "differs"
        seen |= _side_paths(database.path)
    for entry in pack.entries:
        target = session_dir / entry.path
        try:
            fd = _open_beneath(session_dir, entry.path)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(entry.path)
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                mismatches.append(entry.path)
                continue
            raise StoreIOError.from_os_error("open", target, exc) from exc
        try:
            st = os.fstat(fd)
            # A size change is a mismatch without reading a byte.
            if not stat.S_ISREG(st.st_mode) or st.st_size != entry.bytes:
                mismatches.append(entry.path)
                continue
            size, digest = _digest_fd(fd, target)
        finally:
            os.close(fd)
        if size != entry.bytes or digest != entry.sha256:
            mismatches.append(entry.path)
    unaccounted = sorted(_display(rel) for rel in _walk_files(session_dir) if rel not in seen)
    return PackVerification(
        verified=not mismatches and not missing,
        mismatches=sorted(mismatches),
        missing=sorted(missing),
        unaccounted=unaccounted,
        details=details,
    )
